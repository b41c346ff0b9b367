"""kernels: memory-bound kernels against the bandwidth floor.

The first case runs four independent kernels (a*b+c, exp, sum, row softmax) together, as a program
would. The cases after it time one kernel each, at 256 MiB per operand on the GPU: issue 3's
check. Their ``floor`` column is the bytes a kernel must move divided by the device-to-device copy
bandwidth measured in the same run, so it reads as a share of copy bandwidth (target: add and the
broadcast multiply >= 80 %, the last-axis sum and the row softmax >= 70 %).
"""

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
    results = ctx.run_case(case, "kernels", lfi.modes(case, ctx.device, ctx.lanes, program, [a, b, c],
                                                      fused_row=True))
    for one in _single_kernels(rows, cols, a, b, c):
        impls = [lfi.guard(one, "laneflow eager", 1, lambda one=one: lfi.eager(
            one, ctx.device, SINGLE[one.params["op"]][0], list(one.inputs.values()), 1))]
        results.extend(ctx.run_case(one, "kernel_one", impls))
    return results


#: op -> (laneflow program, numpy reference, bytes moved per element of the big operand)
SINGLE = {
    "add": (lambda x, y: x + y, lambda x, y: x + y, 3),
    "broadcast multiply": (lambda x, v: x * v, lambda x, v: x * v, 2),
    "last-axis sum": (lambda x: lf.sum(x, axis=-1), lambda x: x.sum(axis=-1, dtype=np.float64), 1),
    "row softmax": (lambda x: lf.softmax(x, axis=-1), softmax, 2),
}


def _single_kernels(rows: int, cols: int, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> list[Case]:
    """One case per kernel of issue 3's bandwidth check, on the suite's arrays (n float32 each)."""
    n = a.size
    x = a.reshape(rows, cols)
    v = b[:cols].copy()
    inputs = {"add": {"x": a, "y": b}, "broadcast multiply": {"x": x, "v": v},
              "last-axis sum": {"x": x}, "row softmax": {"x": c.reshape(rows, cols)}}
    cases = []
    for op, (_, ref, per) in SINGLE.items():
        ins = inputs[op]
        shapes = " and ".join("x".join(map(str, t.shape)) for t in ins.values())
        cases.append(Case("kernels", f"{op} alone: {shapes} float32", ins, ref(*ins.values()),
                          bytes=per * n * 4, params={"op": op, "n": n}, rtol=1e-4))
    return cases
