"""CPU kernels: numpy implementations of every primitive kind.

Each kernel is ``kernel(lane, prim, inputs, outputs)`` with numpy arrays, and writes its result into
the output arrays (which the scheduler allocated, or which alias a donated input). float16 and
bfloat16 accumulate in float32 (reductions, matmul, softmax), as the CUDA kernels do.
"""

from __future__ import annotations

import math

import numpy as np

from ...dtypes import bfloat16, float16, float32, float64
from . import philox

_HALF = (float16, bfloat16)

UFUNCS = {
    name: getattr(np, npname)
    for name, npname in {
        "add": "add", "subtract": "subtract", "multiply": "multiply", "divide": "divide",
        "floor_divide": "floor_divide", "remainder": "remainder", "power": "power",
        "maximum": "maximum", "minimum": "minimum", "negative": "negative", "abs": "absolute",
        "sign": "sign", "exp": "exp", "log": "log", "log1p": "log1p", "sqrt": "sqrt",
        "square": "square", "sin": "sin", "cos": "cos", "tanh": "tanh", "equal": "equal",
        "not_equal": "not_equal", "less": "less", "less_equal": "less_equal", "greater": "greater",
        "greater_equal": "greater_equal", "logical_and": "logical_and", "logical_or": "logical_or",
        "logical_not": "logical_not", "isnan": "isnan", "isfinite": "isfinite",
    }.items()
}

_erf64 = np.frompyfunc(math.erf, 1, 1)


def _compute(x, dtype):
    """x as floats of the precision a result of ``dtype`` is computed in: float32 for the half types
    (special functions and accumulations are accurate there), else ``dtype`` itself. Integer and bool
    inputs are converted first, so nothing wraps around (``-x`` of uint8, ``x - max`` of int8)."""
    return np.asarray(x).astype(float32 if dtype in _HALF else dtype, copy=False)


def _erf(x, dtype):
    x = _compute(x, dtype)
    return np.asarray(_erf64(x.astype(float64)), dtype=float64).astype(x.dtype, copy=False)


def _where(dtype, c, a, b):
    # Both branches in the result dtype first: numpy has no common dtype for some pairs laneflow
    # promotes (bfloat16 with float16 gives float32).
    return np.where(c, np.asarray(a).astype(dtype, copy=False), np.asarray(b).astype(dtype, copy=False))


# Functions numpy has no ufunc for: ``f(out_dtype, *args)`` returns the result (cast into the output).
SPECIAL = {
    "rsqrt": lambda dtype, x: 1.0 / np.sqrt(_compute(x, dtype)),
    "sigmoid": lambda dtype, x: 1.0 / (1.0 + np.exp(-_compute(x, dtype))),
    "erf": lambda dtype, x: _erf(x, dtype),
    "where": _where,
    "identity": lambda dtype, x: x,  # a fused astype: the cast into the output is the work
}


def elementwise(lane, prim, ins, outs):
    args = [ins[o] if o.__class__ is int else o.value for o in prim.operands]
    with np.errstate(all="ignore"):
        _apply(prim.fn, args, outs[0])


def _apply(fn, args, out):
    f = UFUNCS.get(fn)
    if f is not None:
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
    last_use = list(range(len(steps)))
    for j, (_, operands, _) in enumerate(steps):
        for o in operands:
            if o.__class__ is int and o < 0:
                last_use[-o - 1] = j
    vals: list = [None] * len(steps)
    free: dict = {}  # dtype -> temporaries no later step reads
    shape = outs[0].shape
    with np.errstate(all="ignore"):
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


def astype(lane, prim, ins, outs):
    with np.errstate(all="ignore"):
        np.copyto(outs[0], ins[0], casting="unsafe")


_REDUCERS = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min, "any": np.any, "all": np.all}


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
    with np.errstate(all="ignore"):
        if name in ("mean", "var", "std"):
            r = _moments(name, x, axes, prim.ddof, _accumulator(out.dtype))
            if not prim.keepdims:
                r = r.reshape(out.shape)
        elif name in ("sum", "prod"):
            r = _REDUCERS[name](x, axis=axes, keepdims=prim.keepdims, dtype=_accumulator(out.dtype))
        else:
            r = _REDUCERS[name](x, axis=axes, keepdims=prim.keepdims)
        np.copyto(out, r, casting="unsafe")


def argreduce(lane, prim, ins, outs):
    f = np.argmax if prim.name == "argmax" else np.argmin
    np.copyto(outs[0], f(ins[0], axis=prim.axis, keepdims=prim.keepdims), casting="unsafe")


def softmax(lane, prim, ins, outs):
    x = _compute(ins[0], outs[0].dtype)
    with np.errstate(all="ignore"):
        e = np.exp(x - np.max(x, axis=prim.axes, keepdims=True, initial=-np.inf))  # initial: empty axes
        np.copyto(outs[0], e / np.sum(e, axis=prim.axes, keepdims=True), casting="unsafe")


def logsumexp(lane, prim, ins, outs):
    x = _compute(ins[0], outs[0].dtype)
    with np.errstate(all="ignore"):
        m = np.max(x, axis=prim.axes, keepdims=True, initial=-np.inf)  # over an empty axis: log(0) = -inf
        m = np.where(np.isfinite(m), m, 0)
        r = np.log(np.sum(np.exp(x - m), axis=prim.axes, keepdims=True)) + m
        if not prim.keepdims:
            r = np.squeeze(r, axis=prim.axes)
        np.copyto(outs[0], r, casting="unsafe")


def matmul(lane, prim, ins, outs):
    out = outs[0]
    acc = _accumulator(out.dtype)  # the result dtype; float32 for the half types
    a, b = (x.astype(acc, copy=False) for x in ins)
    np.copyto(out, np.matmul(a, b), casting="unsafe")


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


def _inside(dtype, low: float, high: float) -> tuple:
    """The smallest value of dtype >= low and the largest < high (just low when the range is empty)."""
    lo, hi = np.array(low, dtype), np.array(high, dtype)
    if float(lo) < low:
        lo = np.nextafter(lo, np.array(np.inf, dtype))
    if float(hi) >= high:
        hi = np.nextafter(hi, np.array(-np.inf, dtype))
    return lo, max(hi, lo)


def random(lane, prim, ins, outs):
    out = outs[0]
    k0, k1 = (int(v) for v in ins[0])
    if prim.dist == "uniform":
        u = philox.uniform01(out.size, k0, k1, _SIGNIFICAND_BITS[out.dtype])
        with np.errstate(all="ignore"):
            r = (prim.a + (prim.b - prim.a) * u).astype(out.dtype)
        r = np.clip(r, *_inside(out.dtype, prim.a, prim.b))  # rounding to dtype must not reach high
    else:
        wide = float64 if out.dtype == float64 else float32
        r = prim.a + prim.b * philox.normal(out.size, k0, k1, wide)
    np.copyto(out, r.reshape(out.shape), casting="unsafe")


def random_split(lane, prim, ins, outs):
    k0, k1 = (int(v) for v in ins[0])
    np.copyto(outs[0], philox.split(k0, k1, prim.num))


def copy(lane, prim, ins, outs):
    src = ins[0]
    if isinstance(src, np.ndarray):
        np.copyto(outs[0], src)
    else:  # a device buffer handle: its writer has finished (this lane waited for it)
        src.copy_to_host(outs[0])


KERNELS = {name: fn for name, fn in globals().items()
           if callable(fn) and not name.startswith("_") and fn.__module__ == __name__
           and name not in ("KERNELS",)}
