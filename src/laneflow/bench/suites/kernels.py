"""kernels: four independent memory-bound kernels (a*b+c, exp, sum, row softmax) on large arrays."""

from __future__ import annotations

import numpy as np

import laneflow as lf

from .. import laneflow_impls as lfi
from ..harness import Case, suite
from .common import SEED


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@suite("kernels", "independent elementwise / reduction / softmax kernels vs the bandwidth floor", needs_gpu=True)
def run(ctx):
    p = ctx.size(quick=dict(n=1 << 18, cols=1024), cpu=None, gpu=dict(n=1 << 26, cols=1024))
    n, cols = p["n"], p["cols"]
    rows = n // cols
    rng = np.random.default_rng(SEED + 2)
    a, b, c = (rng.random(n, dtype=np.float32) for _ in range(3))
    ref = [a * b + c, np.exp(a), np.sum(b, dtype=np.float64), softmax(c.reshape(rows, cols))]
    case = Case("kernels", f"a*b+c, exp(a), sum(b), softmax(c as {rows}x{cols}); n={n} float32",
                {"a": a, "b": b, "c": c}, ref, bytes=(4 + 2 + 1 + 2) * n * 4, flops=0,
                params={"n": n, "rows": rows}, rtol=1e-4)

    def program(a, b, c):
        return [a * b + c, lf.exp(a), lf.sum(b), lf.softmax(c.reshape(rows, cols), axis=-1)]
    return ctx.run_case(case, "kernels", lfi.modes(case, ctx.device, ctx.lanes, program, [a, b, c], fused_row=True))
