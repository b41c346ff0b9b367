"""Defaults as users see them: the default device and its streams, ``stream=`` resolution, ``lf.stream``.

Backends are found through the registry (``runtime/backend.py: backend_for``); this module names none.

Decisions (documented in the README):

- The default device is the GPU when a CUDA backend is usable, else the CPU (``lf.set_default_device``).
- Each device has one default stream (``lf.default_stream``) with the backend's default lane count.
- ``with lf.stream(s):`` sets the default stream for the current host thread only.
- One stream may be shared by several host threads: encoding is serialised under one lock, so this is
  safe; for concurrency between threads, give each thread its own stream.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from .device import Device, as_device, cpu, gpu
from .runtime.encoder import LOCK, POLICIES
from .runtime.backend import DeviceUnavailableError, backend_for
from .runtime.stream import Stream, live_streams

_default_streams: dict[Device, Stream] = {}
_default_device: Device | None = None
_local = threading.local()


def gpu_available() -> bool:
    """True when a CUDA backend and at least one GPU can be used."""
    try:
        backend_for(gpu)
        return True
    except (DeviceUnavailableError, ValueError):
        return False


def default_device() -> Device:
    """The device ops use when neither ``stream=`` nor a ``with lf.stream(...)`` says otherwise."""
    global _default_device
    if _default_device is None:
        _default_device = gpu if gpu_available() else cpu
    return _default_device


def set_default_device(device: Device | str) -> None:
    global _default_device
    d = as_device(device, "set_default_device")
    backend_for(d, "set_default_device")
    _default_device = d


def _check_lanes(lanes: Any, what: str) -> None:
    if not isinstance(lanes, int) or isinstance(lanes, bool) or not 1 <= lanes <= 64:
        raise ValueError(f"{what}: lanes must be an int from 1 to 64, got {lanes!r}")


def new_stream(device: Device | str | None = None, lanes: int | None = None, *,
               policy: str | None = None) -> Stream:
    """A new stream on ``device`` with ``lanes`` lanes (default: the backend's measured default).

    ``policy`` picks how commands are placed on lanes: ``"greedy"`` (the default: a single producer's
    lane, else the least loaded lane, ties rotating) or ``"sticky"`` (the same, but an idle lane is
    reused rather than rotating, which avoids cross-lane waits when the host is the bottleneck);
    ``LANEFLOW_LANE_POLICY`` sets the default. Results never depend on the policy.

    >>> s = lf.new_stream(lf.cpu, lanes=4)
    >>> y = lf.exp(x, stream=s)
    """
    d = default_device() if device is None else as_device(device, "new_stream")
    b = backend_for(d, "new_stream")
    if lanes is None:
        lanes = b.default_lanes
    _check_lanes(lanes, "new_stream")
    name = policy if policy is not None else os.environ.get("LANEFLOW_LANE_POLICY", "greedy")
    cls = POLICIES.get(name)
    if cls is None:
        where = "" if policy is not None else " (from the environment variable LANEFLOW_LANE_POLICY)"
        raise ValueError(f"new_stream: unknown lane policy {name!r}{where}; expected one of {', '.join(POLICIES)}")
    return Stream(d, b, lanes, cls())


def default_stream(device: Device | str | None = None) -> Stream:
    """The default stream of a device (created on first use)."""
    d = default_device() if device is None else as_device(device, "default_stream")
    s = _default_streams.get(d)
    if s is None:
        with LOCK:
            s = _default_streams.get(d)
            if s is None:
                s = new_stream(d)
                _default_streams[d] = s
    return s


class _StreamScope:
    """What :func:`stream` returns: a plain context manager (a generator-based one costs about 1 us per
    ``with``, paid by every compiled call a serving loop makes inside one)."""

    __slots__ = ("st",)

    def __init__(self, st: Stream):
        self.st = st

    def __enter__(self) -> Stream:
        _stack().append(self.st)
        return self.st

    def __exit__(self, *exc: object) -> None:
        _stack().pop()


def stream(s: Stream | Device | str) -> _StreamScope:
    """Make ``s`` the default stream of this host thread inside the block.

    >>> with lf.stream(lf.new_stream(lanes=2)):
    ...     y = x + 1
    """
    return _StreamScope(resolve_stream(s, "stream"))


def _stack() -> list:
    st = getattr(_local, "stack", None)
    if st is None:
        st = _local.stack = []
    return st


#: (default device, its default stream) as last looked up: the common op call skips the dict lookup
_last_default: tuple = (None, None)


def current_stream() -> Stream:
    st = getattr(_local, "stack", None)
    if st:
        return st[-1]
    dev, s = _last_default
    if dev is not None and dev is _default_device and not s._closed:
        return s
    return _remember_default()


def _remember_default() -> Stream:
    global _last_default
    d = default_device()
    s = default_stream(d)
    _last_default = (d, s)  # the device read once: another thread may change the default meanwhile
    return s


def resolve_stream(s: Any, op: str) -> Stream:
    """Normalise an op's ``stream=`` argument (None, a Stream, a Device or a device string)."""
    if s is None:
        return current_stream()
    if isinstance(s, Stream):
        if s._closed:
            raise ValueError(f"{op}: stream {s} is closed")
        return s
    if isinstance(s, (Device, str)):
        try:
            d = as_device(s, op)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{op}: bad stream= {s!r}: {e}") from None
        backend_for(d, op)  # a device that cannot run here (no such GPU): say so, naming the op
        return default_stream(d)
    raise TypeError(f"{op}: stream= must be a Stream, a Device or None, got {type(s).__name__}")


def synchronize(stream: Stream | Device | str | None = None) -> None:
    """Wait for all work submitted so far to ``stream`` (a Stream or a Device's default), or everywhere."""
    if stream is None:
        for s in live_streams():
            s.synchronize()
        return
    resolve_stream(stream, "synchronize").synchronize()
