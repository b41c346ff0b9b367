"""branches: B independent matmul + tanh branches from one input, summed (a multi-branch block)."""

from __future__ import annotations

import numpy as np

import laneflow as lf

from .. import laneflow_impls as lfi
from ..harness import Case, suite
from .common import SEED, dtype, f32, normal


@suite("branches", "B independent matmul+tanh branches from one input, then summed")
def run(ctx):
    p = ctx.size(quick=dict(B=4, M=32, K=256, N=256, dtype="float32"),
                 cpu=dict(B=8, M=64, K=1024, N=1024, dtype="float32"),
                 gpu=dict(B=16, M=64, K=1024, N=1024, dtype="bfloat16"))
    B, M, K, N, dt = p["B"], p["M"], p["K"], p["N"], dtype(p["dtype"])
    rng = np.random.default_rng(SEED + 1)
    x = normal(rng, (M, K), dt)
    w = normal(rng, (B, K, N), dt, 1 / np.sqrt(K))
    ref = np.tanh(f32(x) @ f32(w)).sum(0)
    case = Case("branches", f"{B} x tanh({M}x{K} @ {K}x{N}) summed, {dt.name}", {"x": x, "w": w}, ref,
                bytes=(M * K + B * K * N + M * N) * dt.itemsize, flops=2 * B * M * K * N, dtype=dt, params=p)

    def program(x, *ws):
        acc = lf.tanh(x @ ws[0])
        for wb in ws[1:]:
            acc = acc + lf.tanh(x @ wb)
        return acc
    rows = lfi.modes(case, ctx.device, ctx.lanes, program, [x] + list(w))
    return ctx.run_case(case, "branches", rows)
