"""Fused elementwise kernels (graph/fusion.py): several elementwise steps in one generated kernel.

Each step is generated exactly as the single-op kernel of ``elementwise.py`` computes it (numpy's
loop dtypes, the same C expression, the same scalar conversion), and its result is rounded to the
step's dtype through its storage type, as a store and a load between two kernels would. A float
result passes an empty ``asm volatile`` barrier, so the compiler cannot contract a multiply of one
step with an add of the next into an FMA: the fused kernel gives the unfused results bit for bit.
Every operand has the output's shape and is contiguous, or is a single element read at [0] (the pass
only fuses those), so the kernel indexes linearly.
"""

from __future__ import annotations

from . import cdefs as C
from .elementwise import (_COMPARE, _converter, _py_type, _result_dtype, _widen_for_big_scalars, expr, grid_loop,
                          int_class, loop_dtypes)
from .launch import grid_1d

_BARRIER = {"float": "f", "double": "d"}
_plans: dict = {}


def _loops(steps: tuple, in_dts: tuple) -> tuple:
    """Per step: (input loop dtypes, output loop dtype) from the dtypes its operands have."""
    out = []
    for fn, operands, dtype in steps:
        pattern = tuple((in_dts[o] if o >= 0 else steps[-o - 1][2]) if o.__class__ is int else _py_type(o.value)
                        for o in operands)
        loop, out_loop = loop_dtypes(fn, pattern, dtype)
        loop = list(loop)
        if fn in _COMPARE:
            loop = _widen_for_big_scalars(operands, loop)
        out.append((tuple(loop), out_loop))
    return tuple(out)


def _build(steps: tuple, loops: tuple, in_dts: tuple, out_dt, wide: bool, ones: tuple = ()):
    """Kernel source; ``ones[k]``: input k is a single element (read at [0], broadcast)."""
    idx_t = "long long" if wide else "unsigned"
    sig = [f"{C.storage(out_dt)}* __restrict__ out"]
    params = ["p"]
    for k, d in enumerate(in_dts):
        sig.append(f"const {C.storage(d)}* __restrict__ a{k}")
        params.append("p")
    body = []
    si = 0
    for j, ((fn, operands, dtype), (loop, out_loop)) in enumerate(zip(steps, loops)):
        vals = []
        for q, o in enumerate(operands):
            lt = loop[q]
            if o.__class__ is not int:
                sig.append(f"{C.compute(lt)} s{si}")
                params.append(C.PARAM[C.dname(lt)])
                vals.append(f"s{si}")
                si += 1
            elif o >= 0:
                ref = f"a{o}[0]" if ones and ones[o] else f"a{o}[i]"
                vals.append(C.conv(C.load(ref, in_dts[o]), in_dts[o], lt))
            else:
                src = steps[-o - 1][2]
                vals.append(C.conv(C.load(f"w{-o - 1}", src), src, lt))
        e = expr(fn, vals, list(loop), out_loop)
        st = C.storage(dtype)
        body.append(f"    {st} w{j} = {C.store(C.conv(e, _result_dtype(fn, list(loop), out_loop), dtype), dtype)};\n")
        if st in _BARRIER:
            body.append(f'    asm volatile("" : "+{_BARRIER[st]}"(w{j}));\n')
    sig.append("long long n")
    params.append("q")
    name = "lf_fused"
    src = grid_loop(name, sig, idx_t, f"{''.join(body)}    out[i] = w{len(steps) - 1};\n")
    return src, name, "".join(params)


def fused(lane, prim, ins, outs) -> None:
    out = outs[0]
    n = out.size
    if n == 0:
        return
    steps = prim.steps
    in_dts = tuple(a.dtype for a in ins)
    ones = tuple(a.size == 1 and n != 1 for a in ins)  # single elements broadcast over the output
    # scalar values are arguments; only their Python types (and, for comparisons with ints, their
    # magnitude class) shape the kernel
    shape_of = tuple((fn, tuple(o if o.__class__ is int else _scalar_key(fn, o.value) for o in ops), dtype)
                     for fn, ops, dtype in steps)
    key = (shape_of, in_dts, ones, out.dtype, n >= 2**31 - 2**20, lane.ctx)
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) > 4096:
            _plans.clear()
        loops = _loops(steps, in_dts)
        wide = key[4]
        spec = ("fused", shape_of, in_dts, ones, out.dtype, wide)
        kern = lane.ctx.modules.get(spec, lambda: _build(steps, loops, in_dts, out.dtype, wide, ones))
        convs = tuple(_converter(loop[q]) for (_, ops, _), (loop, _) in zip(steps, loops)
                      for q, o in enumerate(ops) if o.__class__ is not int)
        plan = _plans[key] = (kern, convs)
    kern, convs = plan
    grid = grid_1d(lane.ctx, (n + 3) // 4)  # per launch: the plan serves every size
    args = [out.ptr]
    args.extend(a.ptr for a in ins)
    scalars = [o.value for _, ops, _ in steps for o in ops if o.__class__ is not int]
    args.extend(c(v) for c, v in zip(convs, scalars))
    args.append(n)
    kern.launch(lane.stream, grid, (256, 1, 1), args)


def _scalar_key(fn: str, v) -> tuple:
    t = _py_type(v)
    if fn in _COMPARE and t is int:
        return (t, int_class(v))
    return (t,)
