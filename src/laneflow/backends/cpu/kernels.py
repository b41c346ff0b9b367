"""CPU kernels: numpy implementations of every primitive kind.

Each kernel is ``kernel(lane, prim, inputs, outputs)`` with numpy arrays, and writes its result into
the output arrays (which the scheduler allocated, or which alias a donated input). float16 and
bfloat16 accumulate in float32 (reductions, matmul, softmax), as the CUDA kernels do. Kernels run
on the lanes' worker threads, whose numpy error state is "ignore" (set once per thread in
``cpu/lanes.py``): overflow and invalid values give inf and NaN without warnings, as on the GPU,
and no kernel pays for an ``np.errstate`` block.
"""

from __future__ import annotations

import math

import numpy as np


from ...dtypes import bfloat16, float16, float32, float64, inside_range
from ...shapes import is_contiguous
from ...ops.table import ELEMENTWISE, REDUCTIONS, compute_in as _compute
from ...ops.primitives import MatmulEpilogue
from . import philox
from .linalg import linalg

_HALF = (float16, bfloat16)

#: The numpy computation of every elementwise op of the op table: its ufunc (called with ``out=``),
#: or, for ops numpy has no ufunc for, ``reference(out_dtype, *args)`` whose result is cast into the output.
UFUNCS = {row.name: getattr(np, row.numpy) for row in ELEMENTWISE.values() if row.numpy}
SPECIAL = {row.name: row.reference for row in ELEMENTWISE.values() if not row.numpy}
#: ops whose complex results numpy's ufunc gets wrong at the standard's special cases
COMPLEX_SPECIAL = {row.name: row.complex_reference for row in ELEMENTWISE.values() if row.complex_reference}


def elementwise(lane, prim, ins, outs):
    args = [ins[o] if o.__class__ is int else o.value for o in prim.operands]
    _apply(prim.fn, args, outs[0])


def _apply(fn, args, out):
    if fn in COMPLEX_SPECIAL and out.dtype.kind == "c":
        np.copyto(out, COMPLEX_SPECIAL[fn](*args), casting="unsafe")
        return
    f = UFUNCS.get(fn)
    if f is not None:
        if fn == "nextafter":  # the step is the output dtype's: a weak Python scalar must not pick a wider loop
            args = [a if a.__class__ is np.ndarray else np.asarray(a, out.dtype) for a in args]
        f(*args, out=out, casting="unsafe")
    else:
        np.copyto(out, SPECIAL[fn](out.dtype, *args), casting="unsafe")


def fused(lane, prim, ins, outs):
    """Elementwise steps of a fused group (graph/fusion.py) in one command, each computed and rounded
    in its own dtype as the unfused op is, so results are the same bits. A step writes into the
    temporary of a step whose last use it is (numpy ufuncs allow an output that is exactly an input),
    so a chain holds about two temporaries at a time, as the unfused ops' in-place reuse does."""
    steps = prim.steps
    last = len(steps) - 1
    last_use = prim.last_use
    vals: list = [None] * len(steps)
    free: dict = {}  # dtype -> temporaries no later step reads
    shape = outs[0].shape
    for j, (fn, operands, dtype) in enumerate(steps):
        args = [(ins[o] if o >= 0 else vals[-o - 1]) if o.__class__ is int else o.value for o in operands]
        for o in operands:  # temporaries read for the last time: free for this step's output
            if o.__class__ is int and o < 0 and last_use[-o - 1] == j and vals[-o - 1] is not None:
                t = vals[-o - 1]
                vals[-o - 1] = None
                free.setdefault(t.dtype, []).append(t)
        if j == last:
            out = outs[0]
        else:
            pool = free.get(np.dtype(dtype))
            out = pool.pop() if pool else np.empty(shape, dtype)
        _apply(fn, args, out)
        vals[j] = out


def rowfused(lane, prim, ins, outs):
    """A row program (graph/rowfusion.py) as its members' own kernels, one after another: one command
    instead of one per op, and the unfused results bit for bit. Full-shape steps have the shape
    ``lead + (n,)``, per-row ones ``lead + (1,)``."""
    lead = outs[0].shape[:-1]
    steps = prim.steps
    last = len(steps) - 1
    vals: list = [None] * len(steps)
    for j, (kind, op, operands, dtype, full) in enumerate(steps):
        args = [(ins[o] if o >= 0 else vals[-o - 1]) if o.__class__ is int else o.value for o in operands]
        out = outs[0] if j == last else np.empty(lead + ((prim.n,) if full else (1,)), dtype)
        if kind == "elementwise":
            _apply(op, args, out)
        elif kind == "astype":
            np.copyto(out, args[0], casting="unsafe")
        else:  # a reduction or softmax over the last axis: the member's own primitive says how
            (reduce if kind == "reduce" else softmax)(lane, op, args, [out])
        vals[j] = out


def astype(lane, prim, ins, outs):
    np.copyto(outs[0], ins[0], casting="unsafe")




def _accumulator(dtype):
    return float32 if dtype in _HALF else dtype


def _moments(name, x, axes, ddof, acc):
    """mean, var or std over axes (kept as size-1 dims) in the accumulator dtype, numpy's two-pass way.
    Empty slices give NaN (0/0) and ddof >= n gives inf or NaN, as in numpy, without warnings."""
    n = math.prod(x.shape[a] for a in axes)
    x = x.astype(acc, copy=False)
    mean = np.sum(x, axis=axes, keepdims=True) / n
    if name == "mean":
        return mean
    d = x - mean
    var = np.sum(d * d, axis=axes, keepdims=True) / max(n - ddof, 0)
    return var if name == "var" else np.sqrt(var)


def reduce(lane, prim, ins, outs):
    x, out = ins[0], outs[0]
    name, axes = prim.name, prim.axes
    if name == "mean" or REDUCTIONS[name].moments:
        r = _moments(name, x, axes, prim.ddof, _accumulator(out.dtype))
        if not prim.keepdims:
            r = r.reshape(out.shape)
    elif name in ("sum", "prod"):
        r = getattr(np, REDUCTIONS[name].numpy)(x, axis=axes, keepdims=prim.keepdims, dtype=_accumulator(out.dtype))
    else:
        r = getattr(np, REDUCTIONS[name].numpy)(x, axis=axes, keepdims=prim.keepdims)
    np.copyto(out, r, casting="unsafe")


def argreduce(lane, prim, ins, outs):
    f = np.argmax if prim.name == "argmax" else np.argmin
    np.copyto(outs[0], f(ins[0], axis=prim.axis, keepdims=prim.keepdims), casting="unsafe")


def sort(lane, prim, ins, outs):
    """Stable sort or argsort; a descending one keeps equal elements in their order (NaN first)."""
    x, ax = ins[0], prim.axis
    if prim.descending:
        n = x.shape[ax]
        idx = (n - 1) - np.flip(np.argsort(np.flip(x, ax), axis=ax, kind="stable"), ax)
    else:
        idx = np.argsort(x, axis=ax, kind="stable")
    np.copyto(outs[0], idx if prim.arg else np.take_along_axis(x, idx, ax), casting="unsafe")


def searchsorted(lane, prim, ins, outs):
    np.copyto(outs[0], np.searchsorted(ins[0], ins[1], side="right" if prim.right else "left"), casting="unsafe")


def scan(lane, prim, ins, outs):
    out, ax = outs[0], prim.axis
    r = (np.cumsum if prim.op == "sum" else np.cumprod)(ins[0], axis=ax, dtype=_accumulator(out.dtype))
    if prim.include_initial:
        # (a slice, not an index: an index into a 1-d output is a numpy scalar copyto cannot write)
        np.copyto(out[(slice(None),) * ax + (slice(0, 1),)], 0 if prim.op == "sum" else 1, casting="unsafe")
        out = out[(slice(None),) * ax + (slice(1, None),)]
    np.copyto(out, r, casting="unsafe")


def slogdet(lane, prim, ins, outs):
    """Sign, log |det| and det of square matrices (outs[3], the CUDA kernel's workspace, is unused)."""
    sign, logabs = np.linalg.slogdet(ins[0])
    np.copyto(outs[0], sign, casting="unsafe")
    np.copyto(outs[1], logabs, casting="unsafe")
    np.copyto(outs[2], np.linalg.det(ins[0]), casting="unsafe")


def softmax(lane, prim, ins, outs):
    x = _compute(ins[0], outs[0].dtype)
    e = np.exp(x - np.max(x, axis=prim.axes, keepdims=True, initial=-np.inf))  # initial: empty axes
    np.copyto(outs[0], e / np.sum(e, axis=prim.axes, keepdims=True), casting="unsafe")


def logsumexp(lane, prim, ins, outs):
    x = _compute(ins[0], outs[0].dtype)
    m = np.max(x, axis=prim.axes, keepdims=True, initial=-np.inf)  # over an empty axis: log(0) = -inf
    m = np.where(np.isfinite(m), m, 0)
    r = np.log(np.sum(np.exp(x - m), axis=prim.axes, keepdims=True)) + m
    if not prim.keepdims:
        r = np.squeeze(r, axis=prim.axes)
    np.copyto(outs[0], r, casting="unsafe")


def matmul(lane, prim, ins, outs):
    out = outs[0]
    acc = _accumulator(out.dtype)  # the result dtype; float32 for the half types
    a, b = (x.astype(acc, copy=False) for x in ins[:2])
    r = np.matmul(a, b)
    if prim.__class__ is MatmulEpilogue:  # an epilogue (graph/epilogue.py): in the accumulator, rounded once
        k = 2
        if prim.bias:
            r += ins[k].astype(acc, copy=False)
            k += 1
        if prim.residual:
            r += ins[k].astype(acc, copy=False)
        if prim.act is not None:
            r = SPECIAL[prim.act](acc, r)
    np.copyto(out, r, casting="unsafe")


def norm(lane, prim, ins, outs):
    """lf.nn.layer_norm / rms_norm over the last axis, statistics in the accumulator dtype."""
    out = outs[0]
    acc = float64 if out.dtype == float64 else float32
    x = ins[0].astype(acc, copy=False)
    if prim.name == "layer_norm":
        xc = x - x.mean(axis=-1, keepdims=True)
        y = xc / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + acc.type(prim.eps))
    else:
        y = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + acc.type(prim.eps))
    k = 1
    if prim.weight:
        y = y * ins[k].astype(acc, copy=False)
        k += 1
    if prim.bias:
        y = y + ins[k].astype(acc, copy=False)
    np.copyto(out, y, casting="unsafe")


def attention(lane, prim, ins, outs):
    """lf.nn.scaled_dot_product_attention in numpy: scores in the accumulator dtype, a bottom-right
    causal mask, and zeros for a query that sees no key."""
    out = outs[0]
    acc = float64 if out.dtype == float64 else float32
    # contiguous copies: numpy's BLAS must not see a strided operand (see CPUBackend.strided_kinds)
    q, k, v = (np.ascontiguousarray(x, dtype=acc) for x in ins[:3])
    B, Hq, Tq, _ = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    if Hq != Hkv:
        k, v = np.repeat(k, Hq // Hkv, axis=1), np.repeat(v, Hq // Hkv, axis=1)
    s = np.matmul(q, np.ascontiguousarray(k.swapaxes(-1, -2))) * acc.type(prim.scale)
    allowed = np.ones((1, 1, Tq, Tk), bool)
    if prim.causal:
        allowed = (np.arange(Tk)[None, :] <= np.arange(Tq)[:, None] + (Tk - Tq))[None, None]
    if prim.mask == "bool":
        allowed = allowed & ins[3]
    elif prim.mask == "additive":
        s = s + ins[3].astype(acc, copy=False)
    s = np.where(allowed, s, -np.inf)
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)
    p = np.exp(s - np.where(np.isfinite(m), m, 0))
    l = p.sum(axis=-1, keepdims=True)
    o = np.matmul(p, v)
    np.copyto(out, np.where(l > 0, o / np.where(l > 0, l, 1), 0), casting="unsafe")


def matmul_group(lane, prim, ins, outs):
    """A group of independent matmuls (graph/grouping.py): ``outs[i] = ins[i] @ ins[n + i]``. The CPU
    backend does not group by default; this runs when a test turns grouping on."""
    n = len(outs)
    for i in range(n):
        matmul(lane, prim, (ins[i], ins[n + i]), (outs[i],))


def reshape(lane, prim, ins, outs):
    np.copyto(outs[0], ins[0].reshape(prim.shape))


def transpose(lane, prim, ins, outs):
    np.copyto(outs[0], ins[0].transpose(prim.perm))


def broadcast_to(lane, prim, ins, outs):
    np.copyto(outs[0], np.broadcast_to(ins[0], prim.shape))


def concatenate(lane, prim, ins, outs):
    np.concatenate(ins, axis=prim.axis, out=outs[0], casting="unsafe")


def _index(prim, ins, first):
    return tuple(ins[first + e[1]] if e.__class__ is tuple else e for e in prim.index)


def getitem(lane, prim, ins, outs):
    np.copyto(outs[0], ins[0][_index(prim, ins, 1)])


def setitem(lane, prim, ins, outs):
    out, base, value = outs[0], ins[0], ins[1]
    if out is not base:
        np.copyto(out, base)
    out[_index(prim, ins, 2)] = value


def _dynamic_window(static, arrays, shape, sizes) -> tuple:
    """Slices of a dynamic slice: each start clamped into ``[0, dim - size]`` (JAX's rule)."""
    it = iter(arrays)
    out = []
    for s, n, z in zip(static, shape, sizes):
        if s is None:
            s = min(max(int(next(it)), 0), n - z)
        out.append(slice(s, s + z))
    return tuple(out)


def dynamic_slice(lane, prim, ins, outs):
    np.copyto(outs[0], ins[0][_dynamic_window(prim.static, ins[1:], ins[0].shape, prim.sizes)])


def dynamic_update_slice(lane, prim, ins, outs):
    out, base, update = outs[0], ins[0], ins[1]
    if out is not base:
        np.copyto(out, base)
    out[_dynamic_window(prim.static, ins[2:], base.shape, update.shape)] = update


def take(lane, prim, ins, outs):
    np.copyto(outs[0], np.take(ins[0], ins[1], axis=prim.axis), casting="unsafe")


def full(lane, prim, ins, outs):
    outs[0].fill(prim.value)


def arange(lane, prim, ins, outs):
    out = outs[0]
    n = out.shape[0]
    if out.dtype.kind in "iub":
        np.copyto(out, prim.start + prim.step * np.arange(n, dtype=np.int64), casting="unsafe")
    else:
        np.copyto(out, prim.start + prim.step * np.arange(n, dtype=np.float64), casting="unsafe")


def linspace(lane, prim, ins, outs):
    out = outs[0]
    y = np.linspace(prim.start, prim.stop, out.shape[0], endpoint=prim.endpoint)
    if out.dtype.kind in "iu":
        np.floor(y, out=y)  # integer results round towards -inf, as in numpy >= 2
    np.copyto(out, y, casting="unsafe")


def eye(lane, prim, ins, outs):
    out = outs[0]
    np.copyto(out, np.eye(out.shape[0], out.shape[1], prim.k), casting="unsafe")


_SIGNIFICAND_BITS = {float64: 53, float32: 24, float16: 11, bfloat16: 8}


def random(lane, prim, ins, outs):
    out = outs[0]
    k0, k1 = (int(v) for v in ins[0])
    if prim.dist == "uniform":
        u = philox.uniform01(out.size, k0, k1, _SIGNIFICAND_BITS[out.dtype])
        r = (prim.a + (prim.b - prim.a) * u).astype(out.dtype)
        r = np.clip(r, *inside_range(out.dtype, prim.a, prim.b))  # rounding to dtype must not reach high
    else:
        wide = float64 if out.dtype == float64 else float32
        r = prim.a + prim.b * philox.normal(out.size, k0, k1, wide)
    np.copyto(out, r.reshape(out.shape), casting="unsafe")


def random_split(lane, prim, ins, outs):
    k0, k1 = (int(v) for v in ins[0])
    np.copyto(outs[0], philox.split(k0, k1, prim.num))


def as_view(data: np.ndarray, shape: tuple, strides: tuple, offset: int) -> np.ndarray:
    """``data``'s memory read as (shape, element strides, element offset): a numpy view, no copy
    (``np.ndarray`` over the buffer: as_strided costs ten times as much per call)."""
    flat = data.reshape(-1)
    if is_contiguous(shape, strides):
        n = 1
        for s in shape:
            n *= s
        return flat[offset:offset + n].reshape(shape)
    it = data.dtype.itemsize
    return np.ndarray(shape, data.dtype, flat, offset * it, tuple(s * it for s in strides))


def strided(lane, prim, ins, outs):
    np.copyto(outs[0].reshape(prim.shape), as_view(ins[0], prim.shape, prim.strides, prim.offset))


def copy(lane, prim, ins, outs):
    src = ins[0]
    if isinstance(src, np.ndarray):
        np.copyto(outs[0], src)
    else:  # a device buffer handle: its writer has finished (this lane waited for it)
        src.copy_to_host(outs[0])


#: The CPU kernel of every primitive kind of the op table (``ops/table.py: KINDS``), registered here
#: and only here. ``constant`` needs none: its data is the buffer (``Backend.upload``).
KERNELS = {
    "elementwise": elementwise, "astype": astype, "fused": fused, "rowfused": rowfused,
    "reduce": reduce, "argreduce": argreduce, "softmax": softmax, "logsumexp": logsumexp,
    "sort": sort, "searchsorted": searchsorted, "scan": scan, "slogdet": slogdet,
    "norm": norm, "attention": attention, "matmul": matmul, "matmul_group": matmul_group,
    "reshape": reshape, "transpose": transpose, "broadcast_to": broadcast_to, "strided": strided,
    "concatenate": concatenate,
    "getitem": getitem, "setitem": setitem, "take": take,
    "dynamic_slice": dynamic_slice, "dynamic_update_slice": dynamic_update_slice,
    "full": full, "arange": arange, "linspace": linspace, "eye": eye,
    "random": random, "random_split": random_split, "copy": copy, "linalg": linalg,
}

#: Primitive kinds of the op table this backend does not run, with the reason (MLX's ``NO_CPU``).
UNSUPPORTED = {"constant": "no kernel: host data is the buffer itself",
               "custom": "user CUDA kernels (lf.cuda.kernel) run on GPU streams only"}
