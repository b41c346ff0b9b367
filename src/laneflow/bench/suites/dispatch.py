"""dispatch: host cost per tiny op (a chain of N dependent adds on 16 floats), and what tracing costs.

Cases:

- the chain as written, whose adds fuse into one command per 32 (rows: laneflow eager uncached and
  cached, compiled, eval after every op, the same chain while ``lf.trace()`` records, and the trace
  hook alone with tracing off);
- the same chain with fusion off, so every add is its own command: the host cost per command that
  fusion cannot shrink;
- a mixed chain of matmul, reshape, add and sum on 16x16 arrays, per op written (reshapes of
  contiguous data are views that make no command).
"""

from __future__ import annotations

import numpy as np

import laneflow as lf

from ...runtime import tracing
from .. import laneflow_impls as lfi
from ..harness import Case, Impl, chain_program, suite


@suite("dispatch", "host cost per tiny op: chain of N tiny adds; tracing on vs off")
def run(ctx):
    n = ctx.size(quick={"n": 200}, cpu={"n": 2000}, gpu={"n": 10000})["n"]  # issue 3: 10,000 tiny adds
    x = np.zeros(16, np.float32)
    case = Case("dispatch", f"chain of {n} tiny adds (16 float32)", {"x": x}, x + np.float32(n),
                bytes=n * 2 * x.nbytes, flops=n * x.size, items=n, item_name="op", params={"n": n})
    chain = chain_program(n)
    rows = lfi.modes(case, ctx.device, ctx.lanes, chain, [x], fused_row=True)
    if lfi.unavailable(ctx.device) is None:
        rows += [lfi.guard(case, "laneflow eval each op", 1, lambda: _eval_each(case, ctx.device, n, x)),
                 lfi.guard(case, "laneflow eager, tracing on", 1, lambda: _traced(case, ctx.device, chain, x)),
                 _hook_off(case, n)]
    results = ctx.run_case(case, "dispatch", rows)
    _relate(results)
    unfused = Case("dispatch", f"chain of {n} tiny adds (16 float32), elementwise fusion off", {"x": x},
                   x + np.float32(n), bytes=n * 2 * x.nbytes, flops=n * x.size, items=n, item_name="op",
                   params={"n": n})
    rows = lfi.modes(unfused, ctx.device, ctx.lanes, chain, [x])
    results += ctx.run_case(unfused, "dispatch", [lfi.unfused(r) for r in rows])
    results += _mixed(ctx)
    return results


def mixed_program(n: int, rsum):
    """``n`` rounds of matmul, two reshapes, add, sum, multiply and subtract on a 16x16 array (7 ops a
    round); ``rsum(v)`` sums over axis 0 keeping it (each framework's spelling)."""
    def prog(x, w):
        for _ in range(n):
            y = (x @ w).reshape(-1).reshape(16, 16) + 1.0
            x = y - rsum(y) * (0.5 / 16)
        return x
    return prog


def _mixed(ctx):
    n = ctx.size(quick={"n": 20}, cpu={"n": 200}, gpu={"n": 1000})["n"]
    rng = np.random.default_rng(20261202)
    x = rng.standard_normal((16, 16)).astype(np.float32)
    w = ((np.eye(16) + rng.standard_normal((16, 16)) * 0.05) * 0.5).astype(np.float32)  # contracts: x stays O(1)
    want = mixed_program(n, lambda v: v.sum(axis=0, keepdims=True))(x.astype(np.float64), w.astype(np.float64))
    case = Case("dispatch", f"mixed chain: {n} x (matmul, 2 reshapes, add, sum, multiply, subtract) on 16x16 float32",
                {"x": x, "w": w}, want, items=7 * n, item_name="op", params={"n": n}, rtol=1e-3)
    prog = mixed_program(n, lambda v: lf.sum(v, axis=0, keepdims=True))
    rows = lfi.modes(case, ctx.device, ctx.lanes, prog, [x, w])
    # the reshapes make no command with views on (graph/views.py): this row runs all 7 ops a round
    rows.insert(1, lfi.unviewed(lfi.modes(case, ctx.device, ctx.lanes, prog, [x, w])[0]))
    return ctx.run_case(case, "dispatch_mixed", rows)


def _relate(results) -> None:
    """Put tracing's cost next to the untraced chain: per op, and as a share of laneflow's per-op cost."""
    base = next((r for r in results if r.impl == "laneflow eager" and r.lanes == 1 and r.times), None)
    if base is None:
        return
    per_op = base.median / base.items
    for r in results:
        if r.times and r.impl in ("laneflow eager, tracing on", "trace hook alone, tracing off"):
            extra = r.median / r.items - (per_op if r.checked else 0.0)
            r.extra["added_per_op_ns"] = round(extra * 1e9, 1)
            r.extra["share_of_untraced_per_op"] = f"{extra / per_op * 100:.2f} %"


def _eval_each(case, device, n, x0) -> Impl:
    s = lf.new_stream(device, lanes=1)
    x0 = lf.array(x0, stream=s)

    def run():
        x = x0
        with lf.stream(s):
            for _ in range(n):
                x = x + 1.0
                lf.eval(x)
        return x
    return Impl("laneflow eval each op", run, np.asarray, lanes=1, close=s.close)


def _traced(case, device, chain, x0) -> Impl:
    s = lf.new_stream(device, lanes=1)
    x = lf.array(x0, stream=s)
    info = {}

    def run():
        with lf.trace() as t:
            with lf.stream(s):
                y = chain(x)
            lf.eval(y)
        info["events"] = len(t.events)
        return y
    impl = Impl("laneflow eager, tracing on", run, np.asarray, lanes=1, close=s.close,
                note="lf.trace() around the run (records every command)")
    impl.extra = info
    return impl


def _hook_off(case, n) -> Impl:
    def run():
        # What the runtime does per command when not tracing: one read in the encoder, one in the lane.
        for _ in range(n):
            sink = tracing.active
            if sink is not None:
                pass
            sink = tracing.active
            if sink is not None:
                pass
    return Impl("trace hook alone, tracing off", run, lanes=None, check=False,
                note="2 reads of the hook per command, loop included (an upper bound)")
