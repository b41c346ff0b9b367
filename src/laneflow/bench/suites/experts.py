"""experts: E independent GEMMs (a mixture-of-experts step); the batched GEMM as the fused limit."""

from __future__ import annotations

import numpy as np

import laneflow as lf

from .. import laneflow_impls as lfi
from ..harness import Case, suite
from .common import SEED, dtype, f32, normal


#: Extra GPU cases (issue 5's compile targets): many small GEMMs where host cost and concurrency decide.
GPU_EXTRA = (dict(E=16, M=64, K=1024, N=1024, dtype="bfloat16"),
             dict(E=64, M=256, K=256, N=256, dtype="float32"))


@suite("experts", "E independent GEMMs x_e @ w_e (MoE step)")
def run(ctx):
    p = ctx.size(quick=dict(E=8, M=16, K=256, N=256, dtype="float32"),
                 cpu=dict(E=16, M=16, K=1024, N=1024, dtype="float32"),
                 gpu=dict(E=32, M=16, K=4096, N=1024, dtype="bfloat16"))
    sizes = [p] + (list(GPU_EXTRA) if ctx.gpu and not ctx.quick else [])
    results = []
    for p in sizes:
        results.extend(_case(ctx, p))
    return results


def _case(ctx, p):
    E, M, K, N, dt = p["E"], p["M"], p["K"], p["N"], dtype(p["dtype"])
    rng = np.random.default_rng(SEED)
    x = normal(rng, (E, M, K), dt)
    w = normal(rng, (E, K, N), dt, 1 / np.sqrt(K))
    ref = np.matmul(f32(x), f32(w))
    case = Case("experts", f"{E} x ({M}x{K} @ {K}x{N}) {dt.name}", {"x": x, "w": w}, ref,
                bytes=E * (M * K + K * N + M * N) * dt.itemsize, flops=2 * E * M * K * N, dtype=dt, params=p)

    def program(*a):
        return [a[i] @ a[E + i] for i in range(E)]
    rows = lfi.modes(case, ctx.device, ctx.lanes, program, list(x) + list(w), to_host=lfi.stacked)
    if lfi.unavailable(ctx.device) is None:
        def make(ws):
            return lambda *xs: [xs[i] @ ws[i] for i in range(E)]
        rows.append(lfi.guard(case, "laneflow compiled, weights captured", ctx.lanes,
                              lambda: lfi.compiled_captured(case, ctx.device, make, list(x), list(w), ctx.lanes,
                                                            to_host=lfi.stacked)))
        label = "laneflow batched matmul (fused)"
        rows.append(lfi.guard(case, label, 1, lambda: lfi.eager(case, ctx.device, lf.matmul, [x, w], 1, label=label)))
    return ctx.run_case(case, "experts", rows)
