"""CPU lanes: one worker thread each, fed through a queue, finishing commands in order.

numpy releases the GIL inside its kernels, so lanes of one stream really run at the same time.
A wait on another lane's point blocks only this lane's worker (on a condition variable, no spinning).
"""

from __future__ import annotations

import queue
import threading
import time

import numpy as np

from ...runtime import delays, tracing
from ...errors import ExecutionError, LaneflowError
from ...runtime.fence import ThreadFence
from ...runtime.lane import CALLER, Command, Lane, Point

_STOP = object()


class ThreadLane(Lane):
    """A CPU lane: a worker thread that runs the lane's queue in order.

    A :class:`~laneflow.runtime.lane.HostCommand` submitted while the lane is idle, by a thread that
    will wait for it (``lf.eval``: ``CALLER.collect`` is set), is not queued but deferred: that thread
    runs it itself after leaving the scheduling lock (``run_deferred``), which saves the hand-over to
    the worker and back. Order is kept: the next item submitted to the lane first queues the deferred
    command (not started yet), or a wait on its point (started), so the worker runs nothing of the
    lane's before it has finished.
    """

    #: The last command that may call the GPU driver: it reads device memory (a copy to the host), or
    #: it follows a wait on a GPU lane (the worker waits in the driver) or on a CPU lane that may. A GPU
    #: stream never waits on the device for such a command (``backends/cuda/hostsync.py`` says why).
    driver_seq = 0

    def __init__(self, device, stream_id: int, index: int):
        super().__init__(device, stream_id, index)
        self.fence = ThreadFence()
        self._driver_wait = False  # a wait that may call the driver is queued: the next command inherits it
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        # Items given to the lane (queued or deferred; only submitting threads, under the scheduling
        # lock, write it), and those finished by the worker (only it writes) and inline (only the
        # one thread running a deferred command writes): the lane is idle when they add up.
        self._put_count = 0
        self._done_count = 0
        self._inline_count = 0
        self._deferred: Command | None = None  # left to the submitting thread, not started
        self._inline_seq = 0  # the last deferred command a thread started running itself
        self._defer_lock = threading.Lock()
        self._wait_error: Exception | None = None  # a failed wait poisons the command it was for
        self._thread = threading.Thread(target=self._work, name=f"laneflow-{self.name}", daemon=True)
        self._thread.start()

    def _put(self, item) -> None:
        if self._deferred is not None or self._inline_seq > self.fence.value:
            with self._defer_lock:
                cmd = self._deferred
                if cmd is not None:  # not started: the worker runs it, in order (counted already)
                    self._deferred = None
                    self._queue.put(cmd)
                elif self._inline_seq > self.fence.value:  # running on another thread: wait for it
                    self._put_count += 1
                    self._queue.put(Point(self, self._inline_seq, {}))
        self._put_count += 1
        self._queue.put(item)

    def _enqueue(self, cmd: Command) -> None:
        if self._driver_wait:
            self._driver_wait = False
            self.driver_seq = cmd.seq
        else:  # does it read another device's memory (a copy to the host, in a kernel or a whole plan)?
            known = cmd.device_reads
            if known is None:
                for b in cmd.reads:
                    if b.device.type != "cpu":
                        known = True
                        break
            if known:
                self.driver_seq = cmd.seq
        if cmd.inline:
            collect = CALLER.collect
            if (collect is not None and self._deferred is None
                    and self._put_count == self._done_count + self._inline_count
                    and self._inline_seq <= self.fence.value):
                self._put_count += 1
                self._deferred = cmd  # idle: the submitting thread runs it (run_deferred)
                collect.append((self, cmd))
                return
        self._put(cmd)

    def _enqueue_wait(self, point: Point) -> None:
        other = point.lane
        other.fence.pin(point.seq)  # the worker waits later: the point must not grow by then
        if other.__class__ is not ThreadLane or other.driver_seq > other.fence.value:
            self._driver_wait = True
        self._put(point)

    def close(self) -> None:
        self._put(_STOP)

    def host_wait(self, seq: int, timeout: float | None = None) -> bool:
        """Wait for command ``seq``. A deferred command it would wait for is handed to the worker first:
        the thread that deferred it may be the one that waits (for another lane that waits for this
        one), or may not come back to run it before this waiter gives up."""
        cmd = self._deferred
        if cmd is not None and cmd.seq <= seq:
            with self._defer_lock:
                if self._deferred is cmd:
                    self._deferred = None
                    self._queue.put(cmd)  # (counted when it was deferred)
        return self.fence.wait(seq, timeout)

    def run_deferred(self, cmd: Command) -> None:
        with self._defer_lock:
            if self._deferred is not cmd:
                return  # queued meanwhile: the worker runs it
            self._inline_seq = cmd.seq  # before _deferred is cleared: _put reads them unlocked
            self._deferred = None
        try:
            with np.errstate(all="ignore"):  # as on the worker (numpy keeps the state per thread)
                self._run(cmd)
        finally:
            self._inline_count += 1  # after the fence: until then the lane is not idle

    def _run(self, item: Command) -> None:
        """Run one command of this lane (on the worker, or inline on a waiting thread) and signal it."""
        try:
            wait_error = self._wait_error
            if wait_error is not None:
                self._wait_error = None
                for b in item.writes:
                    b.error = wait_error
                return
            sink = tracing.active
            if sink is not None:
                t0 = time.perf_counter()
            hook = delays.current()
            if hook is not None:
                d = hook()
                if d > 0:
                    time.sleep(d)
            item.run(self)  # catches the command's own errors; see Command.run
            if sink is not None:
                sink.ran(self, item.seq, t0, time.perf_counter())
        finally:
            self.fence.signal(item.seq)  # never leave waiters hanging, whatever happened

    def _work(self) -> None:
        # This thread's numpy error state (numpy keeps it per thread): kernels give IEEE results
        # (inf, NaN) without warnings, as the GPU does, and none pays for an np.errstate block.
        np.seterr(all="ignore")
        q = self._queue
        while True:
            item = q.get()
            if item is _STOP:
                return
            try:
                if item.__class__ is Point:
                    # Another lane's command (possibly on another backend) must finish first.
                    try:
                        if not item.lane.host_wait(item.seq):
                            # Never waited: the point was never enqueued (its submission failed), so
                            # what follows would read what it never wrote. Its outputs get the error.
                            raise LaneflowError(f"{item} was never enqueued")
                    except Exception as e:  # noqa: BLE001 - e.g. a CUDA error while waiting for the GPU
                        self._wait_error = ExecutionError(f"wait for {item.lane.name}", e)
                    continue
                self._run(item)
            finally:
                self._done_count += 1  # last: a submitter that reads it equal to _put_count finds us idle
