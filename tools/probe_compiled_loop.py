"""Probe (GPU): the `bench experts` compiled row's loop, taken apart. Per run: the compiled call plus
``lf.async_eval`` of its outputs, on a 4-lane stream, as `laneflow bench` runs it. Prints, per case:
host time per run without waiting (the host's share), device-event time per run over many runs (what
the bench reports), and the graph alone (its launches back to back). ``--torch`` imports PyTorch
first (the bench process has it imported: a larger heap for Python's GC).

    python tools/probe_compiled_loop.py [--torch]
"""

from __future__ import annotations

import sys
import time

import numpy as np

if "--torch" in sys.argv:
    import torch  # noqa: F401 - only its heap

import laneflow as lf
from laneflow.bench.laneflow_impls import laneflow_timer

def graph_alone_us(f, s, launches: int = 50) -> float:
    """Device microseconds per launch of compiled function ``f``'s graph (its one signature, first
    output set) on stream ``s``, launched back to back between two events (also used by
    tools/graph_probe.py)."""
    from cuda.bindings import driver as cu

    (plan,) = f._plans.values()
    o = plan.unit.sets[0]
    st = s.lanes[0].stream
    e0, e1 = cu.cuEventCreate(0)[1], cu.cuEventCreate(0)[1]
    s.synchronize()
    cu.cuEventRecord(e0, st)
    for _ in range(launches):
        cu.cuGraphLaunch(o.exec, st)
    cu.cuEventRecord(e1, st)
    cu.cuEventSynchronize(e1)
    us = cu.cuEventElapsedTime(e0, e1)[1] * 1e3 / launches
    cu.cuEventDestroy(e0)
    cu.cuEventDestroy(e1)
    return us


CASES = [(32, 16, 4096, 1024, "bfloat16"), (16, 64, 1024, 1024, "bfloat16"), (64, 256, 256, 256, "float32")]


def case(E, M, K, N, dname, runs=400):
    rng = np.random.default_rng(0)
    s = lf.new_stream(lf.gpu, lanes=4)
    dt = getattr(lf, dname)
    with lf.stream(s):
        args = [lf.array(rng.standard_normal((M, K)).astype(np.float32)).astype(dt) for _ in range(E)] + \
               [lf.array((rng.standard_normal((K, N)) / 64).astype(np.float32)).astype(dt) for _ in range(E)]
        lf.eval(*args)
    f = lf.compile(lambda *a: [a[i] @ a[E + i] for i in range(E)])

    def run():
        with lf.stream(s):
            y = f(*args)
        lf.async_eval(y)
        return y

    keep = [None]  # the last run's outputs stay alive until the next run, as in the bench
    for _ in range(20):
        keep[0] = run()
    s.synchronize()
    host = []
    for _ in range(runs):
        t = time.perf_counter()
        keep[0] = run()
        host.append(time.perf_counter() - t)
        if len(host) % 8 == 0:
            s.synchronize()  # keep the device from falling far behind: host time alone
    s.synchronize()
    timer = laneflow_timer(s)
    best = 1e9
    for _ in range(5):
        timer.start()
        for _ in range(50):
            keep[0] = run()
        best = min(best, timer.stop() / 50)
    alone = graph_alone_us(f, s)
    h = np.array(host) * 1e6
    print(f"{E} x ({M}x{K} @ {K}x{N}) {dname}: host per run median {np.median(h):.1f} us (p90 {np.percentile(h, 90):.1f}), "
          f"events per run {best * 1e6:.1f} us, graph alone {alone:.1f} us")
    s.close()


if __name__ == "__main__":
    print("torch imported" if "--torch" in sys.argv else "no torch")
    for c in CASES:
        case(*c)
