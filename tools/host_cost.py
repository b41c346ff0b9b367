"""Host cost per op of the shared layer (op construction + scheduling + encoding) on a lane that does
nothing, so backend costs are left out. Wall clock on a noisy machine varies by about 30 %; for a
deterministic figure run it under callgrind (instruction counts), e.g.

    N=1 python tools/host_cost.py; N=5001 python tools/host_cost.py      # wall clock
    valgrind --tool=callgrind python tools/host_cost.py                 # instructions (use N=1 and N=5001)
"""

from __future__ import annotations

import gc
import os
import time

import laneflow as lf
from laneflow.backends.cpu import CPUBackend
from laneflow.runtime.fence import ThreadFence
from laneflow.runtime.lane import Lane
from laneflow.runtime.stream import Stream


class NullLane(Lane):
    """Completes every command at once without running it."""

    def __init__(self, *args):
        super().__init__(*args)
        self.fence = ThreadFence()

    def _enqueue(self, cmd):
        self.fence._value = cmd.seq

    def _enqueue_wait(self, point):
        pass


class NullBackend(CPUBackend):
    def create_lanes(self, device, stream_id, count):
        return [NullLane(device, stream_id, k) for k in range(count)]

    def kernel(self, kind):
        return lambda *args: None


def main() -> None:
    gc.disable()
    n = int(os.environ.get("N", "20000"))
    repeats = int(os.environ.get("R", "7"))
    st = Stream(lf.cpu, NullBackend(), 1)
    x = lf.zeros((16,), lf.float32, stream=st)
    lf.eval(x)
    best_c = best_s = float("inf")
    for _ in range(repeats):
        y = x
        t0 = time.perf_counter()
        for _ in range(n):
            y = lf.add(y, 1.0, stream=st)
        t1 = time.perf_counter()
        lf.async_eval(y)
        t2 = time.perf_counter()
        best_c, best_s = min(best_c, (t1 - t0) / n), min(best_s, (t2 - t1) / n)
    print(f"construct {best_c * 1e6:.2f} us/op, schedule+encode {best_s * 1e6:.2f} us/op "
          f"(best of {repeats} chains of {n} adds, null lane)")


if __name__ == "__main__":
    main()
