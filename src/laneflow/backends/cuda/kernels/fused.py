"""Fused elementwise kernels (graph/fusion.py): several elementwise steps in one generated kernel.

Each step is generated exactly as the single-op kernel of ``elementwise.py`` computes it (numpy's
loop dtypes, the same C expression, the same scalar conversion), and its result is rounded to the
step's dtype through its storage type, as a store and a load between two kernels would. Every kernel
compiles with ``--fmad=false`` (``nvrtc._OPTIONS``), so the compiler cannot contract a multiply of
one step with an add of the next into an FMA: the fused kernel gives the unfused results bit for bit.
An input of the output's shape is read at the output index, a single element at 0, and a broadcast
one (a keepdims reduction, a bias row) at the offset its strides give over the collapsed dims, as in
the single-op kernels; intermediate steps always have the output's shape. Where the inputs are rows or
columns of the output and the pointers aligned, the group runs as a vector kernel
(``elementwise.vector_loop``), as single ops do.
"""

from __future__ import annotations

from . import cdefs as C
from ..memory import ViewArray
from .elementwise import (_COMPARE, VEC, KernelPair, _converter, _py_type, _result_dtype, _widen_for_big_scalars,
                          expr, grid_loop, int_class, loop_dtypes, offsets_code, operand_ref, run, tail_params,
                          vector_grid, vector_kinds, vector_loop)
from . import elementwise as _ew
from .launch import grid_1d
from .plan import keep, operand_layout

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


def _build(steps: tuple, loops: tuple, in_dts: tuple, out_dt, wide: bool, kinds: tuple, nd: int, vec: bool = False):
    """Kernel source. ``kinds[k]`` says how input k is read: "c" the output's shape (at ``i``), "s" one
    element (at 0), "g" broadcast (at the offset its strides give, over ``nd`` collapsed dims); with
    ``vec``, the kinds of :func:`~.elementwise.vector_kinds` and a vector kernel."""
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
                vals.append(C.conv(C.load(operand_ref(o, kinds[o], vec), in_dts[o]), in_dts[o], lt))
            else:
                src = steps[-o - 1][2]
                vals.append(C.conv(C.load(f"w{-o - 1}", src), src, lt))
        e = expr(fn, vals, list(loop), out_loop)
        st = C.storage(dtype)
        body.append(f"    {st} w{j} = {C.store(C.conv(e, _result_dtype(fn, list(loop), out_loop), dtype), dtype)};\n")
    name = "lf_fused"
    last = f"w{len(steps) - 1}"
    if vec:
        loads = [(k, kd, C.storage(d)) for k, (kd, d) in enumerate(zip(kinds, in_dts))]
        return vector_loop(name, sig, params, idx_t, loads, C.storage(out_dt), "".join(body), last), name, "".join(params)
    strided = [k for k, kd in enumerate(kinds) if kd == "g"]
    tail_params(sig, params, strided)
    src = grid_loop(name, sig, idx_t, f"{offsets_code(strided, nd, idx_t)}{''.join(body)}    out[i] = {last};\n")
    return src, name, "".join(params)


#: Largest parameter block a fused kernel may take (the classic 4 KiB launch limit, with room to spare).
_PARAM_LIMIT = 4000


def _geometry(ins, out) -> tuple | None:
    """(kinds, collapsed dims, extra Dims arguments, vector kinds, cols) of the inputs against the
    output, or None when one kernel cannot take them: more than MAXD dims stay unmerged across all
    inputs together (each single op may have fewer), or the strides would not fit the parameter block.
    The vector kinds (:func:`~.elementwise.vector_kinds`, ignoring the element count, which a plan
    without shapes in its key checks per launch) are None when no vector kernel serves."""
    shape, n = out.shape, out.size
    if all(a.shape == shape or a.size == 1 for a in ins):
        kinds = tuple("c" if a.shape == shape or n == 1 else "s" for a in ins)
        return kinds, 0, (), kinds, None
    layout = operand_layout(ins, shape)
    if layout is None:
        return None
    cshape, csets, kinds = layout
    strided = [k for k, kd in enumerate(kinds) if kd == "g"]
    vk = vector_kinds(kinds, csets, cshape, 0)
    return (kinds, len(cshape) if strided else 0, ((cshape, *(csets[k] for k in strided)) if strided else ()), vk,
            cshape[-1] if cshape else None)


class _FusedPlan(KernelPair):
    """A fused group's kernels (the vector one where :func:`_geometry` allows), scalar converters and
    tail arguments."""

    __slots__ = ("convs", "tail", "vcols")

    def kernel(self, ctx, out, ins, n: int):
        """(kernel, grid, tail arguments before ``n``) for this launch (the grid per launch: a plan
        without shapes in its key serves every size, so the element count is checked here too)."""
        kern = self.vector(ctx, out, ins) if not n % VEC else None
        if kern is not None:
            return kern, vector_grid(ctx, n), self.vcols
        return self.general(ctx), grid_1d(ctx, (n + 3) // 4), self.tail


def fused(lane, prim, ins, outs) -> None:
    out = outs[0]
    n = out.size
    if n == 0:
        return
    steps = prim.steps
    in_dts = tuple(a.dtype for a in ins)
    shape = out.shape
    # the common case (every input the output's shape, or one element) needs no shapes in the key
    geom = (tuple(a.size == 1 and n != 1 for a in ins) if all(a.shape == shape or a.size == 1 for a in ins)
            else (tuple(a.shape for a in ins), shape))
    # scalar values are arguments; only their Python types (and, for comparisons with ints, their
    # magnitude class) shape the kernel
    shape_of = tuple((fn, tuple(o if o.__class__ is int else _scalar_key(fn, o.value) for o in ops), dtype)
                     for fn, ops, dtype in steps)
    wide = n >= 2**31 - 2**20
    key = (shape_of, in_dts, geom, out.dtype, wide, lane.ctx)
    plan = _plans.get(key, False)
    if plan is None:  # this group cannot be one kernel (see _geometry)
        _stepwise(lane, steps, ins, out)
        return
    if plan is False:
        loops = _loops(steps, in_dts)
        geo = _geometry(ins, out)
        n_scalars = sum(1 for _, ops, _ in steps for o in ops if o.__class__ is not int)
        if geo is None or 8 * (len(ins) + n_scalars + 2) + 64 * len(geo[2]) > _PARAM_LIMIT:
            plan = keep(_plans, key, None)  # one kernel per step instead
            _stepwise(lane, steps, ins, out)
            return
        kinds, nd, tail, vk, cols = geo
        plan = keep(_plans, key, _FusedPlan(("fused", shape_of, in_dts, kinds, nd, out.dtype, wide),
                                            lambda: _build(steps, loops, in_dts, out.dtype, wide, kinds, nd)))
        plan.convs = tuple(_converter(loop[q]) for (_, ops, _), (loop, _) in zip(steps, loops)
                           for q, o in enumerate(ops) if o.__class__ is not int)
        plan.tail = tail
        if vk is not None and _ew._vector_enabled:
            plan.vspec = ("fusedv", shape_of, in_dts, vk, out.dtype, wide)
            plan.vbuild = lambda: _build(steps, loops, in_dts, out.dtype, wide, vk, 0, vec=True)
            plan.vcols = (cols,) if any(kd in "rk" for kd in vk) else ()
            plan.vptrs = tuple(k for k, kd in enumerate(vk) if kd in "cr")
    kern, grid, tail = plan.kernel(lane.ctx, out, ins, n)
    args = [out.ptr]
    args.extend(a.ptr for a in ins)
    scalars = [o.value for _, ops, _ in steps for o in ops if o.__class__ is not int]
    args.extend(c(v) for c, v in zip(plan.convs, scalars))
    args.extend(tail)
    args.append(n)
    kern.launch(lane.handle, grid, (256, 1, 1), args)


def _stepwise(lane, steps: tuple, ins: list, out) -> None:
    """The group's steps as single-op kernels (the same bits as the unfused ops), intermediates in
    stream-ordered temporaries: for the rare group one fused kernel cannot take."""
    mem = lane.ctx.memory
    temps: list = []
    vals: list = []
    last = len(steps) - 1
    try:
        for j, (fn, operands, dtype) in enumerate(steps):
            if j == last:
                dst = out
            else:
                ptr = mem.raw_alloc(max(1, out.size * dtype.itemsize), lane.stream, "fused elementwise")
                temps.append(ptr)
                dst = ViewArray(lane.ctx, out.shape, dtype, ptr)
            arrays, ops = [], []
            for o in operands:
                if o.__class__ is int:
                    ops.append(len(arrays))
                    arrays.append(ins[o] if o >= 0 else vals[-o - 1])
                else:
                    ops.append(o)
            run(lane, fn, tuple(ops), arrays, dst)
            vals.append(dst)
    finally:
        for ptr in temps:
            mem.raw_free(ptr, lane.stream)


def _scalar_key(fn: str, v) -> tuple:
    t = _py_type(v)
    if fn in _COMPARE and t is int:
        return (t, int_class(v))
    return (t,)
