"""Reductions over any axes: sum prod max min any all mean var std, argmax/argmin, softmax and
logsumexp.

The input's dims are split into kept and reduced groups (:class:`~.plan.ReducePlan`). When the
innermost group is reduced, one block reduces each output (warp shuffles, then shared memory);
otherwise one thread per output walks the reduced elements, so neighbouring threads read
neighbouring memory. When there are too few outputs to fill the GPU, the reduced range is split
over ``gridDim.y`` into partial results in a temporary buffer, and a second launch combines them.
Accumulators follow numpy: integer sums in int64, float16/bfloat16 in float32; var is two-pass
(mean, then the mean of squared deviations), as numpy computes it.
"""

from __future__ import annotations

import os

import numpy as np

from .... import dtypes as dt
from ....ops.table import REDUCTIONS
from . import cdefs as C
from .expressions import EXPRESSIONS
from .launch import grid_1d
from .plan import ReducePlan, keep, offset_code

_ACC_C = {"bool": "int", "int8": "int", "uint8": "unsigned", "int16": "int", "uint16": "unsigned", "int32": "int",
          "uint32": "unsigned", "int64": "long long", "uint64": "unsigned long long", "float16": "float",
          "bfloat16": "float", "float32": "float", "float64": "double", "complex64": "lf_c64", "complex128": "lf_c128"}
_LIMITS = {
    "bool": ("0", "1"), "int8": ("-128", "127"), "uint8": ("0", "255"), "int32": ("(-2147483647 - 1)", "2147483647"),
    "uint32": ("0u", "4294967295u"), "int64": ("(-9223372036854775807LL - 1)", "9223372036854775807LL"),
    "uint64": ("0ull", "18446744073709551615ull"), "int16": ("-32768", "32767"), "uint16": ("0", "65535"),
}


_ACC_SIZE = {"int": 4, "unsigned": 4, "long long": 8, "unsigned long long": 8, "float": 4, "double": 8,
             "lf_c64": 8, "lf_c128": 16}


def acc_c(d: np.dtype) -> str:
    return _ACC_C[C.dname(d)]


def acc_size(d: np.dtype) -> int:
    return _ACC_SIZE[acc_c(d)]


def _acc_dtype(op: str, in_dt, out_dt):
    if op in ("max", "min"):
        return dt.float32 if C.is_half(in_dt) else in_dt
    if op in ("any", "all"):
        return dt.bool_
    return dt.float32 if C.is_half(out_dt) else out_dt


#: The kernels' internal passes, by the reduction whose combine and identity they use: var and std
#: sum squared deviations from the mean ("sumsq") after a mean pass ("meanpass").
_PASSES = {"sumsq": "sum", "meanpass": "sum"}


def _row(fold: str):
    return REDUCTIONS[_PASSES.get(fold, fold)]


def _ident(fold: str, acc_dt) -> str:
    """The fold's identity (the op table's) as a C constant of the accumulator dtype."""
    ident = _row(fold).identity
    if ident in ("zero", "one"):
        return "0" if ident == "zero" else "1"
    if C.kind(acc_dt) == "f":
        return "(-INFINITY)" if ident == "lowest" else "INFINITY"
    lo, hi = _LIMITS[C.dname(acc_dt)]
    return lo if ident == "lowest" else hi


def _combine(fold: str, acc_dt, a: str, b: str) -> str:
    """Two partial results combined by the fold's elementwise op (the same C expression as the op)."""
    return EXPRESSIONS[_row(fold).combine]([a, b], C.kind(acc_dt), acc_c(acc_dt))


def _transform(op: str, in_dt, acc_dt, x: str) -> str:
    if op in ("any", "all"):
        return f"({x} != 0)"
    v = C.conv(x, in_dt, acc_dt)
    if op == "sumsq":
        return f"lf_sq_dev(({acc_c(acc_dt)})({v}), aux[o])"
    return v


def _epilogue(op: str, acc_dt, out_dt, a: str) -> str:
    A = acc_c(acc_dt)
    if op in ("any", "all"):
        return f"({a} != 0)"
    if op in ("mean", "meanpass"):
        return C.conv(f"({a} / ({A})count)", acc_dt, out_dt)
    if op == "var":
        return C.conv(f"({a} / ({A})dcount)", acc_dt, out_dt)
    if op == "std":
        return C.conv(f"lf_sqrt(({A})({a} / ({A})dcount))", acc_dt, out_dt)
    return C.conv(a, acc_dt, out_dt)


def _build(op: str, fold: str, inner: bool, in_dt, acc_dt, out_dt, nk: int, nr: int, partial: bool, combine: bool):
    """fold: the op that combines (sum for mean/var/std passes); op: what the epilogue does."""
    A = acc_c(acc_dt)
    name = "lf_reduce"
    in_st = A if combine else C.storage(in_dt)
    sig = (f"{C.storage(out_dt)}* __restrict__ out, const {in_st}* __restrict__ in, const {A}* __restrict__ aux, "
           f"{A}* __restrict__ part, Dims ks, Dims kst, Dims rs, Dims rst, long long nout, long long R, "
           f"long long rchunk, long long count, double dcount")
    params = "ppppDDDDqqqqd"
    val = "in[off]" if combine else _transform(fold, in_dt, acc_dt, C.load("in[off]", in_dt))
    ident = _ident(fold, acc_dt)
    comb = _combine(fold, acc_dt, "acc", "v_")
    write_final = f"out[o] = {C.store(_epilogue(op, acc_dt, out_dt, 'acc'), out_dt)};"
    helpers = (f"__device__ __forceinline__ {A} lf_sq_dev({A} x, {A} m) {{ {A} d = x - m; return d * d; }}\n"
               if fold == "sumsq" else "")
    if inner:
        write = "part[o * gridDim.y + blockIdx.y] = acc;" if partial else write_final
        shfl = (f"    for (int s_ = 16; s_ > 0; s_ >>= 1) {{ {A} v_ = __shfl_down_sync(0xffffffffu, acc, s_); acc = {comb}; }}\n")
        body = (f"  __shared__ {A} sm[32];\n"
                f"  for (long long o = blockIdx.x; o < nout; o += gridDim.x) {{\n"
                f"    long long base = 0;\n{offset_code('base', 'o', 'ks', 'kst', nk, 'long long')}"
                f"    long long r0 = (long long)blockIdx.y * rchunk; long long r1 = r0 + rchunk < R ? r0 + rchunk : R;\n"
                f"    {A} acc = {ident}, acc1 = {ident}, acc2 = {ident}, acc3 = {ident};\n"
                f"    long long r = r0 + threadIdx.x;\n"
                f"    const long long bd = blockDim.x;\n"
                # four independent accumulators keep four loads in flight per thread
                f"    for (; r + 3 * bd < r1; r += 4 * bd) {{\n"
                + "".join(f"      {{ long long rr = r + {u} * bd; long long off = base;\n"
                          f"{offset_code('off', 'rr', 'rs', 'rst', nr, 'long long')}"
                          f"      {A} v_ = {val}; {'acc' if u == 0 else f'acc{u}'} = "
                          f"{_combine(fold, acc_dt, 'acc' if u == 0 else f'acc{u}', 'v_')}; }}\n" for u in range(4))
                + f"    }}\n"
                f"    for (; r < r1; r += bd) {{\n"
                f"      long long off = base;\n{offset_code('off', 'r', 'rs', 'rst', nr, 'long long')}"
                f"      {A} v_ = {val}; acc = {comb};\n    }}\n"
                f"    {{ {A} v_ = {_combine(fold, acc_dt, 'acc1', 'acc2')}; acc = {comb}; v_ = acc3; acc = {comb}; }}\n"
                f"{shfl}"
                f"    if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = acc;\n"
                f"    __syncthreads();\n"
                f"    if (threadIdx.x < 32) {{\n"
                f"      acc = threadIdx.x < (blockDim.x >> 5) ? sm[threadIdx.x] : ({A}){ident};\n"
                f"  {shfl}"
                f"      if (threadIdx.x == 0) {{ {write} }}\n    }}\n"
                f"    __syncthreads();\n  }}\n")
    else:
        write = "part[(long long)blockIdx.y * nout + o] = acc;" if partial else write_final
        body = (f"  for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < nout;"
                f" o += (long long)blockDim.x * gridDim.x) {{\n"
                f"    long long base = 0;\n{offset_code('base', 'o', 'ks', 'kst', nk, 'long long')}"
                f"    long long r0 = (long long)blockIdx.y * rchunk; long long r1 = r0 + rchunk < R ? r0 + rchunk : R;\n"
                f"    {A} acc = {ident};\n"
                f"    for (long long r = r0; r < r1; ++r) {{\n"
                f"      long long off = base;\n{offset_code('off', 'r', 'rs', 'rst', nr, 'long long')}"
                f"      {A} v_ = {val}; acc = {comb};\n    }}\n"
                f"    {write}\n  }}\n")
    src = f'{helpers}extern "C" __global__ void __launch_bounds__(512) {name}({sig}) {{\n{body}}}\n'
    return src, name, params


def _reduce_once(lane, op: str, fold: str, in_ptr: int, in_dt, out_ptr: int, out_dt, plan: ReducePlan,
                 aux: int = 0, count: int = 0, dcount: float = 0.0) -> tuple | None:
    """One reduction (two launches when it splits the reduced elements over blocks). Returns the launch
    as (kernel, grid, block, the arguments after the three pointers) when it was one launch with no
    partials: the same inputs' next launch may reuse it (``reduce``)."""
    ctx = lane.ctx
    acc_dt = _acc_dtype(fold if fold in ("max", "min", "any", "all") else op, in_dt, out_dt)
    if op in ("meanpass",):
        acc_dt = out_dt
    nout, R = plan.nout, plan.R
    nk, nr = len(plan.kshape), len(plan.rshape)
    sms = ctx.sm_count
    if plan.inner:
        threads = 512 if R >= 8192 else (256 if R >= 512 else (128 if R >= 128 else (64 if R >= 64 else 32)))
        splits = 1
        if nout < 2 * sms and R >= 16384:
            splits = int(min(max(1, (4 * sms) // nout), -(-R // 4096), 65535))
        grid_x = int(min(nout, sms * 32))
    else:
        threads = 256
        splits = 1
        if nout < sms * 512 and R >= 64:
            splits = int(min(max(1, (sms * 2048) // nout), -(-R // 16), 65535))
        grid_x = int(min(-(-nout // threads), sms * 16))
    rchunk = -(-R // splits) if R else 0
    mem = ctx.memory
    part = 0
    if splits > 1:
        part = mem.raw_alloc(nout * splits * acc_size(acc_dt), lane.stream, op)
    spec = ("red", op, fold, plan.inner, in_dt, acc_dt, out_dt, nk, nr, splits > 1, False)
    kern = ctx.modules.get(spec, lambda: _build(op, fold, plan.inner, in_dt, acc_dt, out_dt, nk, nr, splits > 1, False))
    grid, block = (max(1, grid_x), splits, 1), (threads, 1, 1)
    tail = (part, plan.kshape, plan.kstride, plan.rshape, plan.rstride, nout, R, rchunk, count, dcount)
    kern.launch(lane.handle, grid, block, (out_ptr, in_ptr, aux, *tail))
    if splits == 1:
        return kern, grid, block, tail
    if plan.inner:
        cplan = _flat_plan(nout, splits, (splits, 1))
    else:
        cplan = _flat_plan(nout, splits, (1, nout))
    spec = ("red", op, fold, False, acc_dt, acc_dt, out_dt, 1, 1, False, True)
    kern = ctx.modules.get(spec, lambda: _build(op, fold, False, acc_dt, acc_dt, out_dt, 1, 1, False, True))
    kern.launch(lane.handle, (int(min(-(-nout // 256), sms * 16)), 1, 1), (256, 1, 1),
                (out_ptr, part, aux, 0, cplan.kshape, cplan.kstride, cplan.rshape, cplan.rstride, nout, splits,
                 splits, count, dcount))
    mem.raw_free(part, lane.stream)
    return None


class _flat_plan:
    """Plan of the combine pass over partials: nout outputs of splits values each."""

    def __init__(self, nout: int, splits: int, strides: tuple):
        self.kshape, self.kstride = (nout,), (strides[0],)
        self.rshape, self.rstride = (splits,), (strides[1],)
        self.nout, self.R, self.inner = nout, splits, False


#: (op, input shape, axes, dtypes, context) -> the launch of a one-pass reduction (``_reduce_once``):
#: an uncached command skips the plan, the launch shape and the kernel lookup (issue 15)
_launches: dict = {}
#: False: every reduction plans its launch again (tests compare the two)
REUSE = True


def reduce(lane, prim, ins, outs) -> None:
    x, out = ins[0], outs[0]
    if out.size == 0:
        return
    op = prim.name
    key = (op, x.shape, prim.axes, x.dtype, out.dtype, lane.ctx)
    hit = _launches.get(key) if REUSE else None
    if hit is not None:
        kern, grid, block, tail = hit
        kern.launch(lane.handle, grid, block, (out.ptr, x.ptr, 0, *tail))
        return
    plan = ReducePlan(x.shape, prim.axes)
    count = plan.R
    if op in ("var", "std"):
        acc_dt = _acc_dtype(op, x.dtype, out.dtype)
        mem = lane.ctx.memory
        mean = mem.raw_alloc(max(1, plan.nout) * acc_size(acc_dt), lane.stream, op)
        _reduce_once(lane, "meanpass", "sum", x.ptr, x.dtype, mean, acc_dt, plan, count=count)
        _reduce_once(lane, op, "sumsq", x.ptr, x.dtype, out.ptr, out.dtype, plan, aux=mean, count=count,
                     dcount=float(max(count - prim.ddof, 0)))
        mem.raw_free(mean, lane.stream)
        return
    fold = "sum" if op == "mean" else op
    launch = _reduce_once(lane, op, fold, x.ptr, x.dtype, out.ptr, out.dtype, plan, count=count)
    if launch is not None:
        keep(_launches, key, launch)


# -- argmax / argmin -------------------------------------------------------------------------------


def _build_arg(op: str, in_dt, inner: bool, nk: int):
    W = acc_c(dt.float32 if C.is_half(in_dt) else in_dt)
    k = C.kind(in_dt)
    gt = ">" if op == "argmax" else "<"
    ident = ("(-INFINITY)" if op == "argmax" else "INFINITY") if k == "f" else \
        _LIMITS[C.dname(in_dt)][0 if op == "argmax" else 1]
    better = (f"__device__ __forceinline__ bool lf_better({W} va, long long ia, {W} vb, long long ib) {{\n"
              + ("  bool an = va != va, bn = vb != vb;\n  if (an || bn) return (an && bn) ? ib < ia : bn;\n" if k == "f" else "")
              + f"  if (vb {gt} va) return true;\n  if (vb == va) return ib < ia;\n  return false;\n}}\n")
    sig = (f"long long* __restrict__ out, const {C.storage(in_dt)}* __restrict__ in, Dims ks, Dims kst, "
           f"long long R, long long rst, long long nout")
    load = C.load("in[base + r * rst]", in_dt)
    if inner:
        body = (f"  __shared__ {W} sv[32]; __shared__ long long si[32];\n"
                f"  for (long long o = blockIdx.x; o < nout; o += gridDim.x) {{\n"
                f"    long long base = 0;\n{offset_code('base', 'o', 'ks', 'kst', nk, 'long long')}"
                f"    {W} bv = {ident}; long long bi = 0x7fffffffffffffffLL;\n"
                f"    #pragma unroll 4\n    for (long long r = threadIdx.x; r < R; r += blockDim.x) {{ {W} v = ({W}){load};"
                f" if (lf_better(bv, bi, v, r)) {{ bv = v; bi = r; }} }}\n"
                f"    for (int s_ = 16; s_ > 0; s_ >>= 1) {{ {W} v = __shfl_down_sync(0xffffffffu, bv, s_);"
                f" long long i = __shfl_down_sync(0xffffffffu, bi, s_); if (lf_better(bv, bi, v, i)) {{ bv = v; bi = i; }} }}\n"
                f"    if ((threadIdx.x & 31) == 0) {{ sv[threadIdx.x >> 5] = bv; si[threadIdx.x >> 5] = bi; }}\n"
                f"    __syncthreads();\n"
                f"    if (threadIdx.x < 32) {{\n"
                f"      if (threadIdx.x < (blockDim.x >> 5)) {{ bv = sv[threadIdx.x]; bi = si[threadIdx.x]; }}"
                f" else {{ bv = {ident}; bi = 0x7fffffffffffffffLL; }}\n"
                f"      for (int s_ = 16; s_ > 0; s_ >>= 1) {{ {W} v = __shfl_down_sync(0xffffffffu, bv, s_);"
                f" long long i = __shfl_down_sync(0xffffffffu, bi, s_); if (lf_better(bv, bi, v, i)) {{ bv = v; bi = i; }} }}\n"
                f"      if (threadIdx.x == 0) out[o] = bi;\n    }}\n    __syncthreads();\n  }}\n")
    else:
        body = (f"  for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < nout;"
                f" o += (long long)blockDim.x * gridDim.x) {{\n"
                f"    long long base = 0;\n{offset_code('base', 'o', 'ks', 'kst', nk, 'long long')}"
                f"    {W} bv = {ident}; long long bi = 0x7fffffffffffffffLL;\n"
                f"    for (long long r = 0; r < R; ++r) {{ {W} v = ({W}){load}; if (lf_better(bv, bi, v, r)) {{ bv = v; bi = r; }} }}\n"
                f"    out[o] = bi;\n  }}\n")
    return f'{better}extern "C" __global__ void __launch_bounds__(512) lf_arg({sig}) {{\n{body}}}\n', "lf_arg", "ppDDqqq"


def argreduce(lane, prim, ins, outs) -> None:
    x, out = ins[0], outs[0]
    if out.size == 0:
        return
    if prim.axis is None:
        kshape, kstride, R, rst = (), (), x.size, 1
    else:
        a = prim.axis
        outer = 1
        for s in x.shape[:a]:
            outer *= s
        inner = 1
        for s in x.shape[a + 1:]:
            inner *= s
        R, rst = x.shape[a], inner
        dims = [(outer, R * inner), (inner, 1)]
        dims = [d for d in dims if d[0] != 1]
        kshape, kstride = tuple(d[0] for d in dims), tuple(d[1] for d in dims)
    nout = out.size
    inner_mode = rst == 1
    ctx = lane.ctx
    spec = ("arg", prim.name, x.dtype, inner_mode, len(kshape))
    kern = ctx.modules.get(spec, lambda: _build_arg(prim.name, x.dtype, inner_mode, len(kshape)))
    if inner_mode:
        threads = 256 if R >= 256 else 64 if R >= 64 else 32
        grid = (int(min(nout, ctx.sm_count * 32)), 1, 1)
    else:
        threads = 256
        grid = (int(min(-(-nout // 256), ctx.sm_count * 16)), 1, 1)
    kern.launch(lane.handle, grid, (threads, 1, 1), (out.ptr, x.ptr, kshape, kstride, R, rst, nout))


# -- softmax / logsumexp ---------------------------------------------------------------------------


def _build_nn(op: str, in_dt, out_dt, inner: bool, nk: int, nr: int, cached: bool = False):
    W = "double" if out_dt == dt.float64 else "float"
    wdt = dt.float64 if W == "double" else dt.float32
    x = C.conv(C.load("in[off]", in_dt), in_dt, wdt)
    sig = (f"{C.storage(out_dt)}* __restrict__ out, const {C.storage(in_dt)}* __restrict__ in, Dims ks, Dims kst, "
           f"Dims rs, Dims rst, long long nout, long long R")
    loop_head = "long long off = base;\n" + offset_code("off", "r", "rs", "rst", nr, "long long")
    if op == "softmax":
        fix = ""
        final_loop = f"out[off] = {C.store(C.conv('(lf_exp(' + x + ' - m) / s)', wdt, out_dt), out_dt)};"
        final = ""
    else:
        fix = "if (!lf_isfinite(m)) m = 0;\n"
        final_loop = None
        final = f"out[o] = {C.store(C.conv('(lf_log(s) + m)', wdt, out_dt), out_dt)};"
    if inner:
        def block_reduce(v: str, comb: str, ident: str) -> str:
            return (f"    for (int s_ = 16; s_ > 0; s_ >>= 1) {{ {W} t_ = __shfl_down_sync(0xffffffffu, {v}, s_); {v} = {comb}; }}\n"
                    f"    if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = {v};\n    __syncthreads();\n"
                    f"    if (threadIdx.x < 32) {{ {v} = threadIdx.x < (blockDim.x >> 5) ? sm[threadIdx.x] : ({W}){ident};\n"
                    f"      for (int s_ = 16; s_ > 0; s_ >>= 1) {{ {W} t_ = __shfl_down_sync(0xffffffffu, {v}, s_); {v} = {comb}; }}\n"
                    f"      if (threadIdx.x == 0) sm[0] = {v}; }}\n    __syncthreads();\n    {v} = sm[0];\n    __syncthreads();\n")
        if cached:
            # the row stays in shared memory: one read of the input and one write of the output
            store_c = C.store(C.conv("(row[r] / s)", wdt, out_dt), out_dt)
            body = (f"  __shared__ {W} sm[32];\n  extern __shared__ {W} row[];\n"
                    f"  for (long long o = blockIdx.x; o < nout; o += gridDim.x) {{\n"
                    f"    long long base = 0;\n{offset_code('base', 'o', 'ks', 'kst', nk, 'long long')}"
                    f"    {W} m = -INFINITY;\n"
                    f"    #pragma unroll 4\n    for (long long r = threadIdx.x; r < R; r += blockDim.x) {{ {loop_head} {W} xv = {x}; row[r] = xv;"
                    f" m = lf_max_nan<{W}>(m, xv); }}\n"
                    + block_reduce("m", f"lf_max_nan<{W}>(m, t_)", "(-INFINITY)")
                    + f"    {W} s = 0;\n"
                    f"    #pragma unroll 4\n    for (long long r = threadIdx.x; r < R; r += blockDim.x) {{ {W} e = lf_exp(row[r] - m); row[r] = e; s += e; }}\n"
                    + block_reduce("s", "s + t_", "0")
                    + f"    #pragma unroll 4\n    for (long long r = threadIdx.x; r < R; r += blockDim.x) {{ {loop_head} out[off] = {store_c}; }}\n"
                    + "    __syncthreads();\n  }\n")
            return (f'extern "C" __global__ void __launch_bounds__(512) lf_nn({sig}) {{\n{body}}}\n', "lf_nn",
                    "ppDDDDqq")
        body = (f"  __shared__ {W} sm[32];\n"
                f"  for (long long o = blockIdx.x; o < nout; o += gridDim.x) {{\n"
                f"    long long base = 0;\n{offset_code('base', 'o', 'ks', 'kst', nk, 'long long')}"
                f"    {W} m = -INFINITY;\n"
                f"    #pragma unroll 4\n    for (long long r = threadIdx.x; r < R; r += blockDim.x) {{ {loop_head} m = lf_max_nan<{W}>(m, {x}); }}\n"
                + block_reduce("m", f"lf_max_nan<{W}>(m, t_)", "(-INFINITY)")
                + f"    {fix}"
                f"    {W} s = 0;\n"
                f"    #pragma unroll 4\n    for (long long r = threadIdx.x; r < R; r += blockDim.x) {{ {loop_head} s += lf_exp({x} - m); }}\n"
                + block_reduce("s", "s + t_", "0")
                + (f"    #pragma unroll 4\n    for (long long r = threadIdx.x; r < R; r += blockDim.x) {{ {loop_head} {final_loop} }}\n"
                   if final_loop else f"    if (threadIdx.x == 0) {final}\n")
                + "  }\n")
    else:
        body = (f"  for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < nout;"
                f" o += (long long)blockDim.x * gridDim.x) {{\n"
                f"    long long base = 0;\n{offset_code('base', 'o', 'ks', 'kst', nk, 'long long')}"
                f"    {W} m = -INFINITY;\n"
                f"    for (long long r = 0; r < R; ++r) {{ {loop_head} m = lf_max_nan<{W}>(m, {x}); }}\n"
                f"    {fix}"
                f"    {W} s = 0;\n"
                f"    for (long long r = 0; r < R; ++r) {{ {loop_head} s += lf_exp({x} - m); }}\n"
                + (f"    for (long long r = 0; r < R; ++r) {{ {loop_head} {final_loop} }}\n" if final_loop else f"    {final}\n")
                + "  }\n")
    return f'extern "C" __global__ void __launch_bounds__(512) lf_nn({sig}) {{\n{body}}}\n', "lf_nn", "ppDDDDqq"


#: Rows up to this long (per element size) take the one-warp-per-row kernel: the row lives in registers.
_WARP_ROW_MAX = {4: 2048, 8: 1024}


def _build_warp_rows(op: str, in_dt, out_dt, vpl: int, vec: int = 1):
    """softmax / logsumexp over the last axis of contiguous rows of at most ``32 * vpl`` elements: one
    warp per row, ``vpl`` values per thread in registers, shuffles only (no shared memory, no block
    barriers). The input is read once, and softmax's output written once, with coalesced accesses;
    ``vec=4`` (float32 rows of a multiple of 4 elements at 16-byte aligned addresses) moves four
    neighbouring elements per access."""
    W = "double" if out_dt == dt.float64 else "float"
    wdt = dt.float64 if W == "double" else dt.float32
    x = C.conv(C.load("in[base + r]", in_dt), in_dt, wdt)
    chunks = vpl // vec
    # element j of chunk k of this lane: column (k * 32 + lane) * vec + j
    col = f"((long long)k * 32 + lane) * {vec}"

    def warp(v: str, comb: str) -> str:
        return f"    for (int s_ = 16; s_ > 0; s_ >>= 1) {{ {W} t_ = __shfl_xor_sync(0xffffffffu, {v}, s_); {v} = {comb}; }}\n"
    if vec == 4:
        load = (f"    #pragma unroll\n    for (int k = 0; k < {chunks}; ++k) {{ long long r = {col};"
                f" if (r < R) {{ float4 t_ = reinterpret_cast<const float4*>(in + base)[r >> 2];"
                f" v[4 * k] = t_.x; v[4 * k + 1] = t_.y; v[4 * k + 2] = t_.z; v[4 * k + 3] = t_.w; }}"
                f" else {{ v[4 * k] = v[4 * k + 1] = v[4 * k + 2] = v[4 * k + 3] = -INFINITY; }} }}\n"
                f"    #pragma unroll\n    for (int k = 0; k < {vpl}; ++k) m = lf_max_nan<float>(m, v[k]);\n")
        valid = "(((long long)(k >> 2) * 32 + lane) * 4 < R)"
        store = (f"    #pragma unroll\n    for (int k = 0; k < {chunks}; ++k) {{ long long r = {col};"
                 f" if (r < R) reinterpret_cast<float4*>(out + base)[r >> 2] = make_float4(v[4 * k] / s,"
                 f" v[4 * k + 1] / s, v[4 * k + 2] / s, v[4 * k + 3] / s); }}\n")
    else:
        load = (f"    #pragma unroll\n    for (int k = 0; k < {vpl}; ++k) {{ long long r = {col};"
                f" v[k] = r < R ? {x} : ({W})(-INFINITY); m = lf_max_nan<{W}>(m, v[k]); }}\n")
        valid = f"({col} < R)"
        store = (f"    #pragma unroll\n    for (int k = 0; k < {vpl}; ++k) {{ long long r = {col};"
                 f" if (r < R) out[base + r] = {C.store(C.conv('(v[k] / s)', wdt, out_dt), out_dt)}; }}\n")
    if op == "softmax":
        tail, fix = store, ""
    else:
        tail = f"    if (lane == 0) out[o] = {C.store(C.conv('(lf_log(s) + m)', wdt, out_dt), out_dt)};\n"
        fix = "    if (!lf_isfinite(m)) m = 0;\n"
    body = ("  const int lane = threadIdx.x & 31;\n"
            "  for (long long o = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); o < nout;"
            " o += (long long)gridDim.x * (blockDim.x >> 5)) {\n"
            f"    const long long base = o * R;\n    {W} v[{vpl}];\n    {W} m = -INFINITY;\n"
            + load + warp("m", f"lf_max_nan<{W}>(m, t_)") + fix
            + f"    {W} s = 0;\n"
            f"    #pragma unroll\n    for (int k = 0; k < {vpl}; ++k) {{ if ({valid}) {{ v[k] = lf_exp(v[k] - m); s += v[k]; }} }}\n"
            + warp("s", "s + t_") + tail + "  }\n")
    sig = f"{C.storage(out_dt)}* __restrict__ out, const {C.storage(in_dt)}* __restrict__ in, long long nout, long long R"
    return f'extern "C" __global__ void __launch_bounds__(256) lf_nn_rows({sig}) {{\n{body}}}\n', "lf_nn_rows", "ppqq"


#: ``LANEFLOW_WARP_ROWS=0``: softmax/logsumexp always use the block-per-row kernel (for A/B runs).
_WARP_ROWS = os.environ.get("LANEFLOW_WARP_ROWS", "1") != "0"


def _nn(lane, op: str, x, out, axes: tuple) -> None:
    plan = ReducePlan(x.shape, axes)
    if plan.nout == 0 or x.size == 0 and op == "softmax":
        return
    ctx = lane.ctx
    R = plan.R
    wsize = 8 if out.dtype == dt.float64 else 4
    if (_WARP_ROWS and plan.inner and len(plan.rshape) == 1 and len(plan.kshape) <= 1
            and R <= _WARP_ROW_MAX[wsize]):
        vec = 4 if (x.dtype == out.dtype == dt.float32 and R % 4 == 0 and R >= 128
                    and x.ptr % 16 == 0 and out.ptr % 16 == 0) else 1
        vpl = vec
        while 32 * vpl < R:
            vpl *= 2
        kern = ctx.modules.get(("nn rows", op, x.dtype, out.dtype, vpl, vec),
                               lambda: _build_warp_rows(op, x.dtype, out.dtype, vpl, vec))
        kern.launch(lane.handle, grid_1d(ctx, plan.nout, threads=8, per_sm=64), (256, 1, 1), (out.ptr, x.ptr, plan.nout, R))
        return
    cached = op == "softmax" and plan.inner and R * wsize <= 48 * 1024
    spec = ("nn", op, x.dtype, out.dtype, plan.inner, len(plan.kshape), len(plan.rshape), cached)
    kern = ctx.modules.get(spec, lambda: _build_nn(op, x.dtype, out.dtype, plan.inner, len(plan.kshape),
                                                   len(plan.rshape), cached))
    if plan.inner:
        threads = 512 if R >= 8192 else (256 if R >= 512 else (128 if R >= 128 else 32))
        grid = (int(min(plan.nout, ctx.sm_count * 32)), 1, 1)
    else:
        threads = 256
        grid = (int(min(-(-plan.nout // 256), ctx.sm_count * 16)), 1, 1)
    kern.launch(lane.handle, grid, (threads, 1, 1),
                (out.ptr, x.ptr, plan.kshape, plan.kstride, plan.rshape, plan.rstride, plan.nout, R),
                smem=R * wsize if cached else 0)


def softmax(lane, prim, ins, outs) -> None:
    _nn(lane, "softmax", ins[0], outs[0], prim.axes)


def logsumexp(lane, prim, ins, outs) -> None:
    if outs[0].size:
        _nn(lane, "logsumexp", ins[0], outs[0], prim.axes)
