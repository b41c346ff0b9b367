"""Where the host time of an eager GPU collective goes: cProfile over repeated all_reduce + lf.eval.

    python tools/profile_collective.py [--mib 1] [--steps 200] [--gpu nccl|local]

A group of one (rank 0 of 1, ``lf.distributed.init(gpu=...)``): NCCL's path end to end on one GPU.
Prints microseconds per collective, then the top functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--gpu", default="nccl")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    import laneflow as lf
    from laneflow import distributed as dist
    dist.init(gpu=a.gpu, env={})
    s = lf.new_stream(lf.gpu, lanes=1)
    x = lf.array(np.ones(a.mib << 18, np.float32), stream=s)
    lf.eval(x)

    def step():
        y = dist.all_reduce(x, stream=s)
        lf.eval(y)

    for _ in range(20):
        step()
    t = time.perf_counter()
    for _ in range(a.steps):
        step()
    per = (time.perf_counter() - t) / a.steps
    print(f"all_reduce of {a.mib} MiB + lf.eval ({a.gpu}, group of one): {per * 1e6:.1f} us per call")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.steps):
        step()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(a.top)
    dist.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
