"""Library handles (cuBLAS, cuBLASLt, cuSOLVER...) shared per device, with a workspace per lane.

The question this answers: should a handle belong to a stream or to a device? A cuBLAS handle holds
64 MiB of device memory and a cuSOLVER handle 96 MiB on an H200, so one handle per stream multiplies
memory by the number of streams. The policies:

- ``device`` (default): one handle per device. Before a use, the handle is bound to the caller's lane
  and that lane's workspace only when they differ from what is bound, under a lock held only while
  the call is enqueued. Two lanes never share a workspace, so they never race on one.
- ``thread``: one handle per device per host thread (PyTorch's design).
- ``stream``: one handle per lane (JAX's design).

Select with ``lf.set_handle_policy(name)`` or the environment variable ``LANEFLOW_HANDLE_POLICY``.
A backend supplies a :class:`HandleLibrary` adapter per library; this module knows no CUDA.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from contextlib import contextmanager
from typing import Any, Iterator, Protocol

POLICIES = ("device", "thread", "stream")
_policy: str | None = None


def handle_policy() -> str:
    """The policy in force: set by :func:`set_handle_policy`, else ``LANEFLOW_HANDLE_POLICY``, else device."""
    if _policy is not None:
        return _policy
    env = os.environ.get("LANEFLOW_HANDLE_POLICY", "device")
    if env not in POLICIES:
        raise ValueError(f"LANEFLOW_HANDLE_POLICY must be one of {POLICIES}, got {env!r}")
    return env


def set_handle_policy(policy: str | None) -> None:
    """Choose how library handles are shared (``None`` returns to the environment/default)."""
    global _policy
    if policy is not None and policy not in POLICIES:
        raise ValueError(f"set_handle_policy: policy must be one of {POLICIES}, got {policy!r}")
    _policy = policy


class HandleLibrary(Protocol):
    """What a backend implements for one library."""

    name: str
    #: True when the library keeps a stream inside the handle (cuBLAS, cuSOLVER); False when the
    #: stream is passed per call (cuBLASLt), so no set-stream is ever needed.
    binds_stream: bool

    def create(self, device: Any) -> Any: ...

    def destroy(self, handle: Any) -> None: ...

    def set_stream(self, handle: Any, lane: Any) -> None: ...

    def workspace_bytes(self, device: Any) -> int: ...

    def allocate_workspace(self, lane: Any, nbytes: int) -> Any: ...

    def set_workspace(self, handle: Any, workspace: Any, nbytes: int) -> None: ...

    def handle_bytes(self, device: Any) -> int: ...


class HandleStats:
    __slots__ = ("created", "destroyed", "handle_bytes", "workspace_bytes", "set_stream_issued",
                 "set_stream_elided", "workspace_binds")

    def __init__(self) -> None:
        self.created: Counter = Counter()
        self.destroyed: Counter = Counter()
        self.handle_bytes: Counter = Counter()
        self.workspace_bytes: Counter = Counter()
        self.set_stream_issued = 0
        self.set_stream_elided = 0
        self.workspace_binds = 0

    def snapshot(self) -> dict[str, Any]:
        return {
            "handles_created": dict(self.created),
            "handles_live": {k: v - self.destroyed[k] for k, v in self.created.items()},
            "handle_bytes": dict(self.handle_bytes),
            "workspace_bytes": dict(self.workspace_bytes),
            "set_stream_issued": self.set_stream_issued,
            "set_stream_elided": self.set_stream_elided,
            "workspace_binds": self.workspace_binds,
        }


STATS = HandleStats()


class _Entry:
    __slots__ = ("handle", "lock", "lane", "workspace", "workspaces")

    def __init__(self, handle: Any):
        self.handle = handle
        self.lock = threading.Lock()
        self.lane = None           # the lane the handle's stream is bound to
        self.workspace = None      # the workspace bound to the handle
        self.workspaces: dict = {}  # lane -> its workspace (kept while the pool lives: graphs may use it)


class HandlePool:
    """Handles of one library, keyed by the policy in force at each use."""

    def __init__(self, library: HandleLibrary):
        self.library = library
        self._entries: dict = {}
        self._lock = threading.Lock()

    def _key(self, lane: Any, policy: str) -> tuple:
        if policy == "device":
            return ("device", lane.device)
        if policy == "thread":
            return ("thread", lane.device, threading.get_ident())
        return ("stream", lane.id)

    def _entry(self, lane: Any) -> _Entry:
        key = self._key(lane, handle_policy())
        e = self._entries.get(key)
        if e is None:
            with self._lock:
                e = self._entries.get(key)
                if e is None:
                    lib = self.library
                    e = _Entry(lib.create(lane.device))
                    self._entries[key] = e
                    STATS.created[lib.name] += 1
                    STATS.handle_bytes[lib.name] += lib.handle_bytes(lane.device)
        return e

    @contextmanager
    def use(self, lane: Any) -> Iterator[tuple[Any, Any]]:
        """``with pool.use(lane) as (handle, workspace):`` enqueue one library call on ``lane``."""
        e = self._entry(lane)
        lib = self.library
        with e.lock:
            rebound = False
            if lib.binds_stream:
                if e.lane is not lane:
                    lib.set_stream(e.handle, lane)
                    STATS.set_stream_issued += 1
                    e.lane = lane
                    rebound = True  # cublasSetStream resets the workspace: bind it again
                else:
                    STATS.set_stream_elided += 1
            ws = e.workspaces.get(lane)
            nbytes = lib.workspace_bytes(lane.device)
            if ws is None and nbytes:
                ws = lib.allocate_workspace(lane, nbytes)
                e.workspaces[lane] = ws
                STATS.workspace_bytes[lib.name] += nbytes
            if ws is not None and (rebound or e.workspace is not ws):
                lib.set_workspace(e.handle, ws, nbytes)
                STATS.workspace_binds += 1
                e.workspace = ws
            yield e.handle, ws

    def handles(self) -> int:
        return len(self._entries)

    def forget_lane(self, lane: Any, free_workspace: Any) -> None:
        """A lane is going away: free its workspaces (``free_workspace(ws)``, ordered on that lane by the
        caller) and destroy a handle that belonged to it alone (the ``stream`` policy)."""
        lib = self.library
        with self._lock:
            for key, e in list(self._entries.items()):
                with e.lock:
                    ws = e.workspaces.pop(lane, None)
                    if ws is not None:
                        free_workspace(ws)
                        STATS.workspace_bytes[lib.name] -= lib.workspace_bytes(lane.device)
                    if e.workspace is ws:
                        e.workspace = None
                    if e.lane is lane:
                        e.lane = None
                if key == ("stream", lane.id):
                    del self._entries[key]
                    lib.destroy(e.handle)
                    STATS.destroyed[lib.name] += 1
                    STATS.handle_bytes[lib.name] -= lib.handle_bytes(lane.device)

    def close(self) -> None:
        """Destroy every handle (after the device work using them has finished)."""
        with self._lock:
            for e in self._entries.values():
                self.library.destroy(e.handle)
                STATS.destroyed[self.library.name] += 1
            self._entries.clear()


def handle_stats() -> dict[str, Any]:
    """Handles created and live per library, device bytes held by handles and by workspaces, and the
    set-stream calls issued and elided (``lf.cuda.handle_stats()``)."""
    return STATS.snapshot()


def reset_handle_stats() -> None:
    """Zero the set-stream counters (handles and bytes still held keep being counted)."""
    STATS.set_stream_issued = STATS.set_stream_elided = STATS.workspace_binds = 0
