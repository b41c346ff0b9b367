"""Streams: logical ordered queues of work on one device, each backed by several lanes."""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any

from .backend import Backend
from .encoder import LOCK, CommandEncoder, LanePolicy

_stream_ids = itertools.count(1)
_live_streams: "weakref.WeakSet[Stream]" = weakref.WeakSet()
_live_lock = threading.Lock()


class Stream:
    """A logical, ordered queue on one device (MLX's meaning). Results are as if ops ran in program order.

    Behind it sit ``lanes`` backend queues; its :class:`CommandEncoder` spreads independent commands
    over them. Create with :func:`laneflow.new_stream`. One stream may be used from several host
    threads: laneflow serialises the encoding (not the execution) of commands under one lock.
    """

    def __init__(self, device: Any, backend: Backend, lanes: int, policy: LanePolicy | None = None):
        self.id = next(_stream_ids)
        self.device = device
        self.backend = backend
        self.lanes = backend.create_lanes(device, self.id, lanes)
        self.encoder = CommandEncoder(self.lanes, policy)
        self._closed = False
        with _live_lock:
            _live_streams.add(self)

    @property
    def num_lanes(self) -> int:
        return len(self.lanes)

    def synchronize(self, timeout: float | None = None) -> None:
        """Block until every command submitted to this stream so far has finished."""
        for lane in self.lanes:
            if not lane.host_wait(lane.submitted, timeout):
                raise TimeoutError(f"synchronize: {lane.name} did not finish within {timeout} s")

    def close(self) -> None:
        """Stop the lanes once their queued work has run. Further use of the stream is an error."""
        with LOCK:  # never between another thread's check that the stream is open and its encode
            self._close()

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            for lane in self.lanes:
                lane.close()

    def __del__(self) -> None:
        # Unreachable, so no thread is encoding onto it: close without the lock (a finalizer may run
        # on any thread, and must not wait for one that holds the lock).
        try:
            self._close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __repr__(self) -> str:
        return f"Stream(id={self.id}, device={self.device}, lanes={len(self.lanes)})"


def live_streams() -> list[Stream]:
    with _live_lock:
        return list(_live_streams)
