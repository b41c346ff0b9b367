"""Elementwise kernels (and astype): numpy's loop dtypes, broadcasting by strides, scalar operands
passed as kernel arguments.

The loop dtypes come from numpy's own resolution (``ufunc.resolve_dtypes``), so inputs are cast as
numpy casts them; float16 and bfloat16 compute in float and round once when stored, as numpy's half
loops do. Each operand is contiguous over the output, a single element, or strided (broadcast);
dims that are contiguous for every operand are merged first, so most launches index linearly.
"""

from __future__ import annotations

import os

import numpy as np

from .... import dtypes as dt
from ....errors import ExecutionError, LaneflowError
from ..checks import deferred
from ....ops.table import ELEMENTWISE
from . import cdefs as C
from .expressions import COMPARISONS, EXPRESSIONS, HALF
from .launch import grid_1d
from .plan import MAXD, contiguous_strides, keep, operand_layout

_UFUNC = {row.name: getattr(np, row.numpy) for row in ELEMENTWISE.values() if row.numpy}
_COMPARE = COMPARISONS
_loop_cache: dict = {}


def loop_dtypes(fn: str, operands: tuple, out: np.dtype) -> tuple[list, np.dtype]:
    """(input loop dtypes, output loop dtype) numpy uses for fn on operands (dtypes or Python types)."""
    key = (fn, operands, out)
    hit = _loop_cache.get(key)
    if hit is not None:
        return hit
    if fn == "where":
        res = ([operands[0] if isinstance(operands[0], np.dtype) else dt.bool_, out, out], out)
    elif fn in ("real", "imag"):  # a complex operand's part: the loop reads the complex value itself
        res = ([operands[0]], out)
    elif fn not in _UFUNC:  # no numpy ufunc (rsqrt, sigmoid, erf, identity): computed in the output dtype
        res = ([out], out)
    else:
        uf = _UFUNC[fn]
        dts = [o for o in operands if isinstance(o, np.dtype)]
        view, had_bf = dt._numpy_view(dts)
        it = iter(view)
        args = tuple(next(it) if isinstance(o, np.dtype) else (np.dtype(bool) if o is bool else o) for o in operands)
        try:
            r = uf.resolve_dtypes(args + (None,))
        except (TypeError, ValueError):
            r = tuple(dt.ufunc_result(uf, tuple(operands)) for _ in range(len(operands) + 1))
        r = [dt._map_back(np.dtype(x), had_bf) for x in r]
        res = (r[:-1], r[-1])
    _loop_cache[key] = res
    return res


def expr(fn: str, a: list[str], loop: list, out_loop: np.dtype) -> str:
    """C expression (compute type of out_loop, or bool) for fn on compute values a (``expressions.py``)."""
    t = loop[-1] if fn == "where" else loop[0]
    if fn in HALF and C.is_half(t):
        return HALF[fn](a, C.dname(t))
    e = EXPRESSIONS.get(fn)
    if e is None:
        raise LaneflowError(f"elementwise: the CUDA backend has no kernel for {fn!r}")
    k = C.kind(t)
    if k == "c" and ELEMENTWISE[fn].real_only:  # (refused when the op is built: this guards internal callers)
        raise LaneflowError(f"{fn}: defined for real values only; the CUDA backend has no kernel for {t} operands")
    return e(a, k, C.compute(t))


def _result_dtype(fn: str, loop: list, out_loop: np.dtype) -> np.dtype:
    """dtype whose compute type the expression yields."""
    if ELEMENTWISE[fn].predicate:
        return dt.bool_
    return out_loop


def _build(fn: str, kinds: tuple, in_dts: tuple, loop: list, sc_dts: tuple, out_dt, out_loop, nd: int, wide: bool,
           vec: bool = False):
    """Kernel source. With ``vec``, ``kinds`` are :func:`vector_kinds` and the kernel is a
    :func:`vector_loop`; otherwise a :func:`grid_loop` with "g" operands read through strides."""
    idx_t = "long long" if wide else "unsigned"
    name = "lf_ew"
    params = ["p"]
    sig = [f"{C.storage(out_dt)}* __restrict__ out"]
    body = []
    vals = []
    loads = []
    ai = 0
    si = 0
    for j, kd in enumerate(kinds):
        lt = loop[j]
        if kd == "S":  # scalar argument, already in the loop dtype
            sig.append(f"{C.compute(lt)} s{si}")
            params.append(C.PARAM[C.dname(lt)])
            vals.append(f"s{si}")
            si += 1
            continue
        src = in_dts[ai]
        sig.append(f"const {C.storage(src)}* __restrict__ a{ai}")
        params.append("p")
        loads.append((ai, kd, C.storage(src)))
        ref = operand_ref(ai, kd, vec)
        body.append(f"  {C.compute(lt)} v{j} = {C.conv(C.load(ref, src), src, lt)};\n")
        vals.append(f"v{j}")
        ai += 1
    e = expr(fn, vals, loop, out_loop)
    res_dt = _result_dtype(fn, loop, out_loop)
    store = C.store(C.conv(e, res_dt, out_dt), out_dt)
    if vec:
        return vector_loop(name, sig, params, idx_t, loads, C.storage(out_dt), "".join(body), store), name, "".join(params)
    strided = [k for k, kd in enumerate([kd for kd in kinds if kd != "S"]) if kd == "g"]
    tail_params(sig, params, strided)
    offs = offsets_code(strided, nd, idx_t)
    src = grid_loop(name, sig, idx_t, f"{offs}{''.join(body)}  out[i] = {store};\n")
    return src, name, "".join(params)


def operand_ref(k: int, kind: str, vec: bool = False) -> str:
    """How input ``a{k}`` is read at output index ``i``: "c" same shape (at i), "s" one element (at 0),
    "g" broadcast (at the offset ``o{k}`` that :func:`offsets_code` computes). In a
    :func:`vector_loop` (``vec``), element ``u_`` of the thread's vector: "c" and "r" operands were
    loaded as vectors ``la{k}``, a "k" operand as one element ``lk{k}``."""
    if vec and kind in "cr":
        return f"la{k}.v[u_]"
    if kind == "k":
        return f"lk{k}"
    return f"a{k}[i]" if kind == "c" else (f"a{k}[0]" if kind == "s" else f"a{k}[o{k}]")


_vector_enabled = os.environ.get("LANEFLOW_VECTOR", "1") != "0"

#: Elements per thread and step of a vector kernel (one aligned load per operand: 16 bytes of float32).
VEC = 4
#: What a vector kernel needs of every pointer it loads or stores as a vector (pool memory is
#: 256-byte aligned; a view at an odd offset takes the scalar kernel).
VEC_ALIGN = 16
_VEC_TYPE = ("template <class T> struct alignas(sizeof(T) * 4 < 16 ? sizeof(T) * 4 : 16) lf_v4 "
             "{ T v[4]; };\n")


def vector_kinds(kinds: tuple, csets: list, cshape: tuple, n: int) -> tuple | None:
    """The operand kinds of a vector kernel, or None when one cannot serve: every array operand must
    be contiguous over the output ("c"), one element ("s"), a row of the collapsed output ("r", read
    at ``i % cols``: a bias added to every row) or a column ("k", at ``i / cols``: a keepdims
    reduction); ``n`` and, with rows or columns, ``cols`` (the last collapsed dim) multiples of
    :data:`VEC`. ``kinds`` may hold "S" (scalar arguments), which have no entry in ``csets``."""
    if n % VEC:
        return None
    out = []
    ai = 0
    for kd in kinds:
        if kd == "S":
            out.append(kd)
            continue
        st = csets[ai]
        ai += 1
        if kd != "g":
            out.append(kd)
            continue
        if len(cshape) < 2 or cshape[-1] % VEC:
            return None
        if st[-1] == 1 and not any(st[:-1]):
            out.append("r")
        elif st[-1] == 0 and st[:-1] == contiguous_strides(cshape[:-1]):
            out.append("k")
        else:
            return None
    return tuple(out)


def vector_loop(name: str, sig: list, params: list, idx_t: str, loads: list, out_st: str, body: str,
                result: str) -> str:
    """A kernel computing :data:`VEC` consecutive outputs per thread and step, two steps a grid
    stride apart in flight: each "c"/"r" operand is one aligned vector load, a "k" operand one element,
    the result one vector store (``loads``: (k, kind, storage type) of each array operand). Appends the
    tail parameters (``cols`` when rows or columns are read, then ``n``) to ``sig``/``params``."""
    cols = any(kd in "rk" for _, kd, _ in loads)
    if cols:
        sig.append("long long cols")
        params.append("q")
    sig.append("long long n")
    params.append("q")
    lines = []
    for k, kd, st in loads:
        if kd in "cr":
            at = "i0" if kd == "c" else "i0 % cols_"
            lines.append(f"    const lf_v4<{st}> la{k} = *reinterpret_cast<const lf_v4<{st}>*>(a{k} + ({at}));\n")
        elif kd == "k":
            lines.append(f"    const {st} lk{k} = a{k}[i0 / cols_];\n")
    return (_VEC_TYPE + f'extern "C" __global__ void __launch_bounds__(256) {name}({", ".join(sig)}) {{\n'
            f"  const {idx_t} stride = ({idx_t})blockDim.x * gridDim.x, nv = ({idx_t})(n / {VEC});\n"
            + (f"  const {idx_t} cols_ = ({idx_t})cols;\n" if cols else "")
            + f"  for ({idx_t} b_ = ({idx_t})blockIdx.x * blockDim.x + threadIdx.x; b_ < nv; b_ += 2 * stride) {{\n"
            "  #pragma unroll\n  for (int t_ = 0; t_ < 2; ++t_) {\n"
            f"  const {idx_t} vb_ = b_ + t_ * stride;\n  if (vb_ < nv) {{\n"
            f"    const {idx_t} i0 = vb_ * {VEC};\n"
            + "".join(lines)
            + f"    lf_v4<{out_st}> lo_;\n    #pragma unroll\n    for (int u_ = 0; u_ < {VEC}; ++u_) {{\n"
            + body
            + f"      lo_.v[u_] = {result};\n    }}\n"
            f"    *reinterpret_cast<lf_v4<{out_st}>*>(out + i0) = lo_;\n  }}\n  }}\n  }}\n}}\n")


def vector_grid(ctx, n: int) -> tuple:
    """Blocks of a :func:`vector_loop` over ``n`` elements (two vectors per thread and trip)."""
    return grid_1d(ctx, (n // VEC + 1) // 2)


def tail_params(sig: list, params: list, strided: list) -> None:
    """The last kernel parameters: the collapsed ``shape`` and each strided input's ``st{k}`` (when any
    input is strided), then the element count ``n``."""
    if strided:
        sig.append("Dims shape")
        params.append("D")
        for k in strided:
            sig.append(f"Dims st{k}")
            params.append("D")
    sig.append("long long n")
    params.append("q")


def offsets_code(strided: list, nd: int, idx_t: str) -> str:
    """C code giving ``o{k}``, the element offset of strided operand k at output index ``i``: ``i`` is
    decomposed once over ``shape`` (a Dims parameter) and each operand's ``st{k}`` strides applied."""
    if not strided:
        return ""
    offs = "  long long " + ", ".join(f"o{k} = 0" for k in strided) + ";\n"
    offs += f"  {{ {idx_t} rem_ = i;\n"
    for d in range(nd - 1, -1, -1):
        if d:
            offs += f"    {{ {idx_t} c_ = rem_ % ({idx_t})shape.v[{d}]; rem_ /= ({idx_t})shape.v[{d}];"
        else:
            offs += f"    {{ {idx_t} c_ = rem_;"
        offs += "".join(f" o{k} += (long long)c_ * st{k}.v[{d}];" for k in strided) + " }\n"
    return offs + "  }\n"


def grid_loop(name: str, sig: list, idx_t: str, body: str) -> str:
    """A kernel running ``body`` for each index ``i < n``: four elements per thread and trip, one
    grid-stride apart, so independent loads are in flight (the pointers are __restrict__, so the
    compiler may hoist them above earlier stores). Shared by the elementwise and fused kernels."""
    return (f'extern "C" __global__ void __launch_bounds__(256) {name}({", ".join(sig)}) {{\n'
            f"  const {idx_t} stride = ({idx_t})blockDim.x * gridDim.x;\n"
            f"  for ({idx_t} b_ = ({idx_t})blockIdx.x * blockDim.x + threadIdx.x; b_ < ({idx_t})n; b_ += 4 * stride) {{\n"
            f"  #pragma unroll\n  for (int u_ = 0; u_ < 4; ++u_) {{\n"
            f"  const {idx_t} i = b_ + u_ * stride;\n  if (i < ({idx_t})n) {{\n"
            f"{body}  }}\n  }}\n  }}\n}}\n")


_CONVERTERS: dict = {}


def _converter(lt: np.dtype):
    """Python scalar -> kernel argument in loop dtype lt (rounded as numpy rounds a weak scalar)."""
    f = _CONVERTERS.get(lt)
    if f is None:
        k = C.kind(lt)
        if C.is_half(lt):
            t = lt.type
            f = lambda v: float(t(v))  # noqa: E731
        elif k == "f":
            f = float if lt == dt.float64 else _to_f32
        elif k == "b":
            f = bool
        elif k == "c":  # packed as the kernel's lf_c64 / lf_c128 parameter (launch.py codes F, Z)
            f = lambda v, t=lt.type: t(v).tobytes()  # noqa: E731
        else:
            f = lambda v, t=lt.type: int(t(v))  # noqa: E731 - the value was checked to fit
        _CONVERTERS[lt] = f
    return f


def _to_f32(v) -> float:
    if -3.4e38 < v < 3.4e38:
        # A float in range is passed as it is: the parameter block packs it as a C float, the same
        # rounding as numpy's (no numpy scalar made per launch; an int still goes through numpy, one
        # rounding from the int, not two through a double).
        return v if v.__class__ is float else float(np.float32(v))
    with np.errstate(over="ignore"):
        return float(np.float32(v))  # inf, as numpy rounds a too-large weak scalar


_plans: dict = {}


class KernelPair:
    """The kernels of one signature: the grid-stride kernel (any strides) and, where the operands allow
    (:func:`vector_kinds`), the vector kernel, which a launch takes when every pointer it loads or
    stores as a vector (``out`` and ``ins[k]`` for ``k`` in ``vptrs``) is aligned. Each is compiled on
    its first launch. Shared by single ops (:class:`_Plan`) and fused groups (``fused._FusedPlan``)."""

    __slots__ = ("spec", "build", "kern", "vspec", "vbuild", "vkern", "vptrs")

    def __init__(self, spec: tuple, build) -> None:
        self.spec, self.build = spec, build
        self.kern = self.vkern = self.vspec = None  # no vector kernel unless the caller sets vspec

    def vector(self, ctx, out, ins):
        """The vector kernel, when this launch can take it; else None."""
        if self.vspec is None or out.ptr & (VEC_ALIGN - 1):
            return None
        for k in self.vptrs:
            if ins[k].ptr & (VEC_ALIGN - 1):
                return None
        kern = self.vkern
        if kern is None:
            kern = self.vkern = ctx.modules.get(self.vspec, self.vbuild)
        return kern

    def general(self, ctx):
        """The grid-stride kernel."""
        kern = self.kern
        if kern is None:
            kern = self.kern = ctx.modules.get(self.spec, self.build)
        return kern


class _Plan(KernelPair):
    """How one elementwise signature launches: its kernels, and each one's grid and tail arguments."""

    __slots__ = ("steps", "grid", "tail", "vgrid", "vtail")

    def kernel(self, ctx, out, ins):
        """(kernel, grid, tail arguments) for this launch."""
        k = self.vector(ctx, out, ins)
        if k is not None:
            return k, self.vgrid, self.vtail
        return self.general(ctx), self.grid, self.tail


#: False: every launch takes the general loops (tests compare the two)
UNROLLED = True


def run(lane, fn: str, operands: tuple, ins: list, out) -> None:
    """out = fn(operands) where operands are DeviceArrays (by input index) or Scalars."""
    n = out.size
    if n == 0:
        return
    ctx = lane.ctx
    # An array and an array or a scalar (x + y, x + 1.0: most commands) make the general loops' key
    # and arguments, unrolled (about 0.6 us of an uncached add's host time on the CPU VM).
    form = None
    if UNROLLED and len(operands) == 2 and operands[0] == 0:
        a, o = ins[0], operands[1]
        if o.__class__ is int:  # (an index: (0, 1), or (0, 0) for x + x)
            form = b = ins[o]
            pattern = (a.dtype, b.dtype)
            key = (fn, pattern, (a.shape, b.shape), out.shape, out.dtype, ctx)
        elif fn not in _COMPARE:  # (comparisons with an int key its magnitude too: below)
            form, b = o, None
            pattern = (a.dtype, _py_type(o.value))
            key = (fn, pattern, (a.shape,), out.shape, out.dtype, ctx)
    if form is None:
        # one pass (list comprehensions build tuples faster than generators on this hot path)
        pattern = tuple([ins[o].dtype if o.__class__ is int else _py_type(o.value) for o in operands])
        shapes = tuple([ins[o].shape for o in operands if o.__class__ is int])
        key = (fn, pattern, shapes, out.shape, out.dtype, ctx)
        if fn in _COMPARE and int in pattern:
            # a Python int outside the array's range widens the loop: plan per magnitude class
            key += tuple(int_class(o.value) for o in operands if o.__class__ is not int and type(o.value) is int)
    plan = _plans.get(key)
    if plan is None:
        plan = keep(_plans, key, _plan(ctx, fn, operands, ins, out, pattern))
    kern, grid, tail = plan.kernel(ctx, out, ins)
    if form is not None:  # (plan.steps: the array, then the array or the scalar's converter)
        args = [out.ptr, a.ptr, b.ptr if b is not None else plan.steps[1][1](form.value), *tail]
    else:
        args = [out.ptr]
        for j, conv in plan.steps:
            o = operands[j]
            args.append(ins[o].ptr if conv is None else conv(o.value))
        args.extend(tail)
    kern.launch(lane.handle, grid, (256, 1, 1), args)


def _plan(ctx, fn: str, operands: tuple, ins: list, out, op_types: tuple) -> _Plan:
    n = out.size
    loop, out_loop = loop_dtypes(fn, op_types, out.dtype)
    loop = list(loop)
    if fn in _COMPARE:
        loop = _widen_for_big_scalars(operands, loop)
    arrays = [ins[o] for o in operands if o.__class__ is int]
    shape = out.shape
    layout = operand_layout(arrays, shape)
    if layout is None:
        raise LaneflowError(f"elementwise {fn}: more than {MAXD} non-mergeable dimensions")
    cshape, csets, array_kinds = layout
    it = iter(array_kinds)
    kinds = tuple(next(it) if o.__class__ is int else "S" for o in operands)
    in_dts = tuple(a.dtype for a in arrays)
    sc_dts = tuple(loop[j] for j, kd in enumerate(kinds) if kd == "S")
    wide = n >= 2**31 - 2**20
    nd = len(cshape)
    strided_idx = [k for k, kd in enumerate([kd for kd in kinds if kd != "S"]) if kd == "g"]
    p = _Plan(("ew", fn, kinds, in_dts, tuple(loop), out.dtype, out_loop, nd if strided_idx else 0, wide),
              lambda: _build(fn, kinds, in_dts, loop, sc_dts, out.dtype, out_loop, nd, wide))
    p.steps = tuple((j, None if o.__class__ is int else _converter(loop[j])) for j, o in enumerate(operands))
    tail = []
    if strided_idx:
        tail.append(cshape)
        for k in strided_idx:
            tail.append(csets[k])
    tail.append(n)
    p.tail = tuple(tail)
    p.grid = grid_1d(ctx, (n + 3) // 4)
    vk = vector_kinds(kinds, csets, cshape, n) if _vector_enabled else None
    if vk is not None:
        p.vspec = ("ewv", fn, vk, in_dts, tuple(loop), out.dtype, out_loop, wide)
        p.vbuild = lambda: _build(fn, vk, in_dts, loop, sc_dts, out.dtype, out_loop, 0, wide, vec=True)
        p.vgrid = vector_grid(ctx, n)
        p.vtail = (cshape[-1], n) if any(kd in "rk" for kd in vk) else (n,)
        p.vptrs = tuple(o for o, kd in zip(operands, vk) if kd in "cr")
    return p


def int_class(v: int) -> tuple:
    """What decides whether a Python int fits an integer dtype of any width: its sign, its bit length,
    and whether it is exactly a negative power of two (-128 fits int8, -129 does not: same bit length).
    Plans of comparisons with an int scalar are keyed by it."""
    n = v.bit_length()
    return (v < 0, n, v < 0 and v == -(1 << (n - 1)))


def _py_type(v):
    t = v.__class__
    if t is float or t is int or t is bool or t is complex:
        return t
    if isinstance(v, bool):
        return bool
    if isinstance(v, int):
        return int
    return complex if isinstance(v, complex) else float


def _widen_for_big_scalars(operands, loop):
    """numpy compares with Python ints outside the array's range by value: widen the loop."""
    for j, o in enumerate(operands):
        if o.__class__ is not int and isinstance(o.value, int) and not isinstance(o.value, bool):
            lt = loop[j]
            if lt.kind in "iu":
                info = np.iinfo(lt)
                if not info.min <= o.value <= info.max:
                    wide = dt.float64 if any(C.kind(t) == "f" for t in loop) else dt.int64
                    return [wide] * len(loop)
    return loop


def elementwise(lane, prim, ins, outs) -> None:
    fn = prim.fn
    if fn == "power":
        _check_int_power(lane, prim, ins, outs[0])
    run(lane, fn, prim.operands, ins, outs[0])


def astype(lane, prim, ins, outs) -> None:
    run(lane, "identity", (0,), ins, outs[0])


_NEG_POWER = "Integers to negative integer powers are not allowed."


def _check_int_power(lane, prim, ins, out) -> None:
    """numpy refuses integers to negative integer powers. An exponent the host can see is checked
    here; one computed on the device is scanned by a small kernel that flags a negative value in a
    check slot (checks.py), raised at the host wait that needs the result, as numpy's ValueError."""
    if out.dtype.kind not in "iu" or out.size == 0:
        return
    e = prim.operands[1]
    if e.__class__ is not int:
        if isinstance(e.value, int) and e.value < 0:
            raise ValueError(_NEG_POWER)
        return
    x = ins[e]
    if x.dtype.kind != "i" or x.size == 0:
        return  # unsigned and bool exponents are never negative
    h = x.host
    if h is not None:
        if h.min() < 0:
            raise ValueError(_NEG_POWER)
        return
    slot = deferred(lane, _neg_power_error, "power")
    kern = lane.ctx.modules.get(("negcheck", x.dtype), lambda: _build_negcheck(x.dtype))
    kern.launch(lane.handle, grid_1d(lane.ctx, x.size), (256, 1, 1), (x.ptr, x.size, slot))


def _neg_power_error(words):
    if not words[0]:
        return None
    return ExecutionError("power", ValueError(_NEG_POWER))


def _build_negcheck(dtype):
    st = C.storage(dtype)
    sig = [f"const {st}* __restrict__ e", "long long n", "unsigned long long* __restrict__ slot"]
    return grid_loop("lf_negcheck", sig, "long long", "    if (e[i] < 0) slot[0] = 1;\n"), "lf_negcheck", "pqp"
