"""Is the uncached tiny-add chain (issue 15's per-command target) bound by the host or by the GPU?
For laneflow (fusion off, plan cache bypassed) and torch eager, in one process, per add:

- ``wall``: a chain of N adds issued and synchronized (what ``bench dispatch`` and probe_c_paths time);
- ``host``: the host time to issue a chain of S adds while the stream is held by a sleep kernel (the
  launch queue has room and the GPU cannot push back: the host's own cost per command);
- ``gpu``: the same S adds run back to back once the sleep ends (events after the sleep and after the
  chain): what the GPU needs per stream-launched tiny kernel, with no host gaps.

When ``wall`` is close to ``gpu`` for both, the chain measures the GPU's launch throughput, not the host.

    python tools/probe_chain_floor.py [--n 4000] [--s 400] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def laneflow_part(n: int, s: int):
    import laneflow as lf
    from laneflow.backends.cuda.kernels.misc import gpu_sleep
    from laneflow.backends.cuda.lanes import cu  # (the fake driver's, under tools/fake_driver.py)
    from laneflow.graph import eval_cache, fusion

    st = lf.new_stream(lf.gpu, lanes=1)
    lane = st.lanes[0]
    x = lf.array(np.zeros(16, np.float32), stream=st)
    lf.eval(x)
    fusion.set_enabled(False)
    lane.ctx.ensure_current()
    e0, e1 = (cu.cuEventCreate(0)[1] for _ in range(2))

    def issue(k: int) -> None:
        with lf.stream(st), eval_cache.bypass():
            y = x
            for _ in range(k):
                y = y + 1.0
            lf.async_eval(y)  # (lf.eval would wait for the GPU)

    def wall() -> float:
        st.synchronize()
        t = time.perf_counter()
        issue(n)
        st.synchronize()
        return (time.perf_counter() - t) / n * 1e6

    def held() -> tuple[float, float]:
        st.synchronize()
        lane.ctx.ensure_current()
        gpu_sleep(lane, 0.03)
        cu.cuEventRecord(e0, lane.stream)
        t = time.perf_counter()
        issue(s)
        host = (time.perf_counter() - t) / s * 1e6
        lane.ctx.ensure_current()
        cu.cuEventRecord(e1, lane.stream)
        cu.cuEventSynchronize(e1)
        return host, cu.cuEventElapsedTime(e0, e1)[1] * 1e3 / s

    return wall, held


def torch_part(n: int, s: int):
    import torch

    tx = torch.zeros(16, device="cuda")
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def issue(k: int) -> None:
        y = tx
        for _ in range(k):
            y = y + 1.0

    def wall() -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        issue(n)
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / n * 1e6

    def held() -> tuple[float, float]:
        torch.cuda.synchronize()
        torch.cuda._sleep(60_000_000)  # ~30 ms of SM clocks
        e0.record()
        t = time.perf_counter()
        issue(s)
        host = (time.perf_counter() - t) / s * 1e6
        e1.record()
        e1.synchronize()
        return host, e0.elapsed_time(e1) * 1e3 / s

    return wall, held


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--s", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    parts = {"laneflow": laneflow_part(a.n, a.s), "torch eager": torch_part(a.n, a.s)}
    for w, h in parts.values():  # warm up (kernels built, allocator primed)
        w(), h()
    rows = {k: ([], [], []) for k in parts}
    for _ in range(a.rounds):  # taking turns
        for k, (w, h) in parts.items():
            rows[k][0].append(min(w() for _ in range(a.reps)))
            hg = [h() for _ in range(a.reps)]
            rows[k][1].append(min(x[0] for x in hg))
            rows[k][2].append(statistics.median(x[1] for x in hg))
    print(f"tiny add chain (16 float32), fusion off, uncached; us per add, median over {a.rounds} rounds "
          f"(wall: best of {a.reps} chains of {a.n}; host and gpu: chains of {a.s} behind a sleep kernel)")
    print(f"{'impl':<14} {'wall':>7} {'host':>7} {'gpu':>7}")
    for k, (w, h, g) in rows.items():
        print(f"{k:<14} {statistics.median(w):7.2f} {statistics.median(h):7.2f} {statistics.median(g):7.2f}")


if __name__ == "__main__":
    main()
