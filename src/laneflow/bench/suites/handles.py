"""handles: what concurrency costs in library handles and memory. c independent GEMMs on c lanes of
one laneflow stream (one shared handle per device, a workspace per lane) vs c streams in the peers;
reports the first run (handle and workspace creation included) and the memory it took."""

from __future__ import annotations

import time

import numpy as np

import laneflow as lf

from .. import laneflow_impls as lfi
from ..harness import Case, Impl, suite
from ..memory import device_used_bytes
from .common import SEED, dtype, f32, normal


@suite("handles", "memory and first-use cost of c concurrent GEMM lanes/streams", needs_gpu=True)
def run(ctx):
    p = ctx.size(quick=dict(counts=(1, 2), M=16, K=256, N=256, dtype="float32"), cpu=None,
                 gpu=dict(counts=(1, 2, 4, 8), M=64, K=1024, N=1024, dtype="bfloat16"))
    M, K, N, dt = p["M"], p["K"], p["N"], dtype(p["dtype"])
    rng = np.random.default_rng(SEED + 3)
    results = []
    for c in p["counts"]:
        x = normal(rng, (c, M, K), dt)
        w = normal(rng, (K, N), dt, 1 / np.sqrt(K))
        # One workload name for every c, so the report shows one table with a row per count.
        case = Case("handles", f"c concurrent GEMMs {M}x{K} @ {K}x{N} {dt.name}, c = {p['counts']}",
                    {"x": x, "w": w},
                    np.matmul(f32(x), f32(w)), bytes=(c * (M * K + M * N) + K * N) * dt.itemsize,
                    flops=2 * c * M * K * N, dtype=dt, params={"c": c})
        why = lfi.unavailable(ctx.device)
        rows = [lfi.skipped(case, "laneflow", why)] if why else [
            lfi.guard(case, f"laneflow {c} lanes", c, lambda: _lanes(ctx.device, x, w, c))]
        results += ctx.run_case(case, "handles", rows)
    return results


def _lanes(device, x, w, c: int) -> Impl:
    before = device_used_bytes(device)
    t0 = time.perf_counter()
    s = lf.new_stream(device, lanes=c)
    args = [lf.array(w, stream=s)] + [lf.array(xi, stream=s) for xi in x]

    def run():
        with lf.stream(s):
            ys = [xi @ args[0] for xi in args[1:]]
        lf.eval(ys)
        return ys
    run()
    first = time.perf_counter() - t0
    after = device_used_bytes(device)
    impl = Impl(f"laneflow {c} lane{'s' if c > 1 else ''}", run, lfi.stacked, lanes=c, close=s.close,
                note="one stream; first run includes stream creation")
    impl.extra = {"first_run_ms": round(first * 1e3, 3),
                  "memory_growth_MiB": None if before is None else round((after - before) / 2**20, 2)}
    return impl
