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
from ...runtime.lane import Command, Lane, Point

_STOP = object()


class ThreadLane(Lane):
    def __init__(self, device, stream_id: int, index: int):
        super().__init__(device, stream_id, index)
        self.fence = ThreadFence()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=f"laneflow-{self.name}", daemon=True)
        self._thread.start()

    def _enqueue(self, cmd: Command) -> None:
        self._queue.put(cmd)

    def _enqueue_wait(self, point: Point) -> None:
        point.lane.fence.pin(point.seq)  # the worker waits later: the point must not grow by then
        self._queue.put(point)

    def close(self) -> None:
        self._queue.put(_STOP)

    def _work(self) -> None:
        # This thread's numpy error state (numpy keeps it per thread): kernels give IEEE results
        # (inf, NaN) without warnings, as the GPU does, and none pays for an np.errstate block.
        np.seterr(all="ignore")
        q, fence = self._queue, self.fence
        wait_error = None  # a failed wait poisons the command it was for, not the whole lane
        while True:
            item = q.get()
            if item is _STOP:
                return
            if item.__class__ is Point:
                # Another lane's command (possibly on another backend) must finish first.
                try:
                    if not item.lane.host_wait(item.seq):
                        # Never waited: the point was never enqueued (its submission failed), so what
                        # follows would read what it never wrote. Its outputs get the error instead.
                        raise LaneflowError(f"{item} was never enqueued")
                except Exception as e:  # noqa: BLE001 - e.g. a CUDA error while waiting for the GPU
                    wait_error = ExecutionError(f"wait for {item.lane.name}", e)
                continue
            try:
                if wait_error is not None:
                    for b in item.writes:
                        b.error = wait_error
                    wait_error = None
                    continue
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
                fence.signal(item.seq)  # never leave waiters hanging, whatever happened
