"""Timeline fences: a monotonically increasing value that lanes signal and others wait on.

Every lane owns one fence whose value is the sequence number of its last finished command, so
"wait until command 7 of lane L has finished" is ``L.fence.wait(7)``. Backends provide the
implementation: the CPU backend uses a condition variable; CUDA uses events.
"""

from __future__ import annotations

import threading
from typing import Protocol


class Fence(Protocol):
    """Timeline synchronisation object (``signal(value)``, ``wait(value)``)."""

    @property
    def value(self) -> int: ...

    def signal(self, value: int) -> None: ...

    def wait(self, value: int, timeout: float | None = None) -> bool:
        """Block the calling host thread until the fence reaches ``value``; False on timeout."""
        ...

    def pin(self, value: int) -> None:
        """Called when a wait for ``value`` is encoded for a lane that will wait later (a CPU worker):
        after this, waiting for ``value`` waits for nothing enqueued later (a fence that marks points
        lazily marks one now; waiting at the queue's tail instead could wait for work that itself waits
        on the waiting lane: a deadlock)."""


class ThreadFence:
    """A fence for host threads: ``signal`` from one thread wakes ``wait`` in others. Never spins."""

    __slots__ = ("_value", "_cond")

    def __init__(self, value: int = 0):
        self._value = value
        self._cond = threading.Condition(threading.Lock())

    @property
    def value(self) -> int:
        return self._value

    def signal(self, value: int) -> None:
        with self._cond:
            if value > self._value:
                self._value = value
                self._cond.notify_all()

    def wait(self, value: int, timeout: float | None = None) -> bool:
        if self._value >= value:
            return True
        with self._cond:
            return self._cond.wait_for(lambda: self._value >= value, timeout)

    def pin(self, value: int) -> None:
        """Nothing to do: a thread fence is signalled per command (see :meth:`Fence.pin`)."""

    def __repr__(self) -> str:
        return f"ThreadFence(value={self._value})"
