"""CPU kernels prepared for their operands: the Python of a kernel's call done once.

A CPU kernel is ``kernel(lane, prim, ins, outs)``, and at each call works out which numpy function
every step of it calls, in which dtype, and where each temporary goes. For the kernels of a small
model on rows of tens of floats (row programs, fused groups, softmax, layer norm, attention, matmul
with an epilogue) that Python costs more than numpy does: a layer norm's row program on (8, 64)
floats took 28 µs a call, its numpy calls about 8. Each such kind has here ``prepare(prim, ins,
outs, scratch)``, which decides once for operands of these shapes and dtypes and returns ``run(ins,
outs)``, which only calls numpy; temporaries come from ``scratch`` (:class:`Scratch`).

The CPU executor (``executor.py``) prepares each step of a plan at its first call and runs the
prepared steps at every later one. A call alone (eager evaluation, command replay) runs the kernel
itself (``fused``, ``rowfused``, ``softmax`` here, ``matmul``, ``norm``, ``attention`` in
``dense.py``), for which preparing would cost more than it saves; ``kernel.prepare`` is its
preparation (``kernel()``).

A prepared kernel makes the kernel's numpy calls (``x - m``, ``np.sum(x, axis) / n``, ``r += bias``)
with the same operands, so the same loops and dtypes, but stores each result into a temporary or
the output, not into a fresh array that is then copied: an elementwise value does not depend on
where it is stored. A reduction's order of summation does (numpy orders its loop by the operands'
layouts), so a reduction stores into a buffer only when its operand is C-contiguous, as a fresh
result is then too, and otherwise the kernel runs. Where dtypes differ (half types computed in
float32, integer inputs of a mean) the kernel runs too. Either way: the kernel's bits.
"""

from __future__ import annotations

import math

import numpy as np

from ...dtypes import bfloat16, float16, float32, float64
from ...ops.table import ELEMENTWISE, REDUCTIONS, compute_in as _compute

_HALF = (float16, bfloat16)

#: The numpy computation of every elementwise op of the op table: its ufunc (called with ``out=``),
#: or, for ops numpy has no ufunc for, ``reference(out_dtype, *args)`` whose result is cast into the output.
UFUNCS = {row.name: getattr(np, row.numpy) for row in ELEMENTWISE.values() if row.numpy}
SPECIAL = {row.name: row.reference for row in ELEMENTWISE.values() if not row.numpy}
#: ops whose complex results numpy's ufunc gets wrong at the standard's special cases
COMPLEX_SPECIAL = {row.name: row.complex_reference for row in ELEMENTWISE.values() if row.complex_reference}
#: reductions a prepared kernel stores into its output (with the ufunc, and whether the dtype is passed)
_ROW_UFUNCS = {"sum": (np.add, True), "prod": (np.multiply, True), "mean": (np.add, False),
               "max": (np.maximum, False), "min": (np.minimum, False)}


class Scratch:
    """Temporaries of prepared kernels, by shape and dtype. The executor keeps one per plan and calls
    :meth:`step` before it prepares each step: steps run one after another, so a step's temporaries
    are the arrays an earlier step used, and a plan holds one step's worth."""

    __slots__ = ("pool", "used")

    def __init__(self):
        self.pool: dict = {}
        self.used: dict = {}

    def step(self) -> None:
        self.used = {}

    def take(self, shape: tuple, dtype) -> np.ndarray:
        key = (shape, dtype)
        k = self.used.get(key, 0)
        self.used[key] = k + 1
        have = self.pool.setdefault(key, [])
        if k == len(have):
            have.append(np.empty(shape, dtype))
        return have[k]


def kernel(plain, prepare):
    """``plain``, a kernel ``(lane, prim, ins, outs)``, with ``prepare`` as its ``.prepare``: a call
    alone (eager evaluation, command replay) runs the kernel, with nothing to set up; the executor
    prepares each step once and runs the prepared step at every call."""
    plain.prepare = prepare
    return plain


def _accumulator(dtype):
    return float32 if dtype in _HALF else dtype


# -- elementwise programs --------------------------------------------------------------------------

def _apply(fn, args, out):
    if fn in COMPLEX_SPECIAL and out.dtype.kind == "c":
        np.copyto(out, COMPLEX_SPECIAL[fn](*args), casting="unsafe")
        return
    f = UFUNCS.get(fn)
    if f is not None:
        if fn == "nextafter":
            args = _in_dtype(args, out.dtype)
        f(*args, out=out, casting="unsafe")
    else:
        np.copyto(out, SPECIAL[fn](out.dtype, *args), casting="unsafe")


def _in_dtype(args, dtype) -> list:
    """nextafter's step is its output dtype's: a weak Python scalar beside a bfloat16 array may pick
    numpy's float64 loop (some ml_dtypes versions), whose step rounds back to the start."""
    return [a if a.__class__ is np.ndarray else np.asarray(a, dtype) for a in args]


def _call(fn, a: tuple, o: int, out_dtype):
    """``env[o] = fn(*env[a])`` as :func:`_apply` computes it, over a program's list ``env``."""
    if fn in COMPLEX_SPECIAL and out_dtype.kind == "c":
        g = COMPLEX_SPECIAL[fn]
        return lambda env: np.copyto(env[o], g(*[env[i] for i in a]), casting="unsafe")
    f = UFUNCS.get(fn)
    if f is None:
        g = SPECIAL[fn]
        return lambda env: np.copyto(env[o], g(out_dtype, *[env[i] for i in a]), casting="unsafe")
    if fn == "nextafter":
        return lambda env: f(*_in_dtype([env[i] for i in a], out_dtype), out=env[o], casting="unsafe")
    if len(a) == 1:
        i, = a
        return lambda env: f(env[i], out=env[o], casting="unsafe")
    if len(a) == 2:
        i, j = a
        return lambda env: f(env[i], env[j], out=env[o], casting="unsafe")
    return lambda env: f(*[env[i] for i in a], out=env[o], casting="unsafe")


class _Env:
    """The list a prepared program's calls read and write: the inputs (0..k-1), the output (k), then
    constants and temporaries; ``proto`` holds this preparation's values (for dtypes)."""

    def __init__(self, ins: list, out):
        self.k = len(ins)
        self.proto = [*ins, out]

    def add(self, value) -> int:
        self.proto.append(value)
        return len(self.proto) - 1

    def operand(self, o, at: list) -> int:
        """An input index (``o >= 0``), an earlier step (``-(j + 1)``, at ``at[j]``) or a Scalar."""
        if o.__class__ is int:
            return o if o >= 0 else at[-o - 1]
        return self.add(o.value)

    def program(self, calls: list):
        tail = self.proto[self.k + 1:]

        def run(ins, outs):
            env = [*ins, outs[0], *tail]
            for c in calls:
                c(env)
        return run


def elementwise(lane, prim, ins, outs):
    _apply(prim.fn, [ins[o] if o.__class__ is int else o.value for o in prim.operands], outs[0])


def astype(lane, prim, ins, outs):
    np.copyto(outs[0], ins[0], casting="unsafe")


def prepare_elementwise(prim, ins, outs, scratch):
    env = _Env(ins, outs[0])
    a = tuple(env.operand(o, []) for o in prim.operands)
    return env.program([_call(prim.fn, a, env.k, outs[0].dtype)])


def prepare_astype(prim, ins, outs, scratch):
    return lambda ins, outs: np.copyto(outs[0], ins[0], casting="unsafe")


def _last_uses(steps: tuple, operands_at: int) -> list:
    """Per step, the last step that reads it (itself when none does)."""
    last = list(range(len(steps)))
    for j, st in enumerate(steps):
        for o in st[operands_at]:
            if o.__class__ is int and o < 0:
                last[-o - 1] = j
    return last


def _release(operands: tuple, j: int, last_use: list, at: list, live: set, free: dict, key) -> None:
    """Temporaries read for the last time by step ``j``: free for later outputs (``free[key(t)]``)."""
    for o in operands:
        if o.__class__ is int and o < 0 and last_use[-o - 1] == j and -o - 1 in live:
            live.discard(-o - 1)
            free.setdefault(key(at[-o - 1]), []).append(at[-o - 1])


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


def prepare_fused(prim, ins, outs, scratch):
    """:func:`fused`, prepared: its temporaries chosen once, in ``scratch``."""
    env = _Env(ins, outs[0])
    steps, shape = prim.steps, outs[0].shape
    last = len(steps) - 1
    at: list = [None] * len(steps)
    live: set = set()
    free: dict = {}  # dtype -> temporaries no later step reads
    calls = []
    for j, (fn, operands, dtype) in enumerate(steps):
        a = tuple(env.operand(o, at) for o in operands)
        _release(operands, j, prim.last_use, at, live, free, lambda t: env.proto[t].dtype)
        dtype = np.dtype(dtype)
        if j == last:
            o = env.k
        else:
            pool = free.get(dtype)
            o = pool.pop() if pool else env.add(scratch.take(shape, dtype))
            live.add(j)
        at[j] = o
        calls.append(_call(fn, a, o, env.proto[o].dtype))
    return env.program(calls)


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


def prepare_rowfused(prim, ins, outs, scratch):
    """:func:`rowfused`, prepared: temporaries chosen once, in ``scratch`` (an elementwise step may
    write into a temporary it reads for the last time, a reduction or softmax only into another)."""
    out = outs[0]
    env = _Env(ins, out)
    lead, steps = out.shape[:-1], prim.steps
    last = len(steps) - 1
    last_use = _last_uses(steps, 2)
    at: list = [None] * len(steps)
    live: set = set()
    free: dict = {}  # (shape, dtype) -> temporaries no later step reads

    def key(t):
        return env.proto[t].shape, env.proto[t].dtype
    calls = []
    for j, (kind, op, operands, dtype, full) in enumerate(steps):
        a = tuple(env.operand(o, at) for o in operands)
        ew = kind == "elementwise" or kind == "astype"
        if ew:
            _release(operands, j, last_use, at, live, free, key)
        if j == last:
            o = env.k
        else:
            shape, dtype = lead + ((prim.n,) if full else (1,)), np.dtype(dtype)
            pool = free.get((shape, dtype))
            o = pool.pop() if pool else env.add(scratch.take(shape, dtype))
            live.add(j)
        if not ew:
            _release(operands, j, last_use, at, live, free, key)
        at[j] = o
        if kind == "elementwise":
            calls.append(_call(op, a, o, env.proto[o].dtype))
        elif kind == "astype":
            calls.append(lambda env, i=a[0], o=o: np.copyto(env[o], env[i], casting="unsafe"))
        else:  # a reduction or softmax over the last axis: the member's own primitive says how
            f = (_reducer if kind == "reduce" else _softmaxer)(op, env.proto[a[0]], env.proto[o], scratch)
            calls.append(lambda env, f=f, i=a[0], o=o: f(env[i], env[o]))
    return env.program(calls)


# -- reductions and softmax ------------------------------------------------------------------------

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


def c_contiguous(x):
    """``x`` C-contiguous (a copy of a strided view): numpy's summation order follows memory layout, so a
    sum of a folded transpose would otherwise depend on whether the view was folded, or on the layout a
    compiled plan gave the value (the CPU fuzz found 1-ulp differences between commands and replays)."""
    return x if x.flags.c_contiguous else np.ascontiguousarray(x)


def reduce(lane, prim, ins, outs):
    x, out = c_contiguous(ins[0]), outs[0]
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


def _reducer(prim, x, out, scratch):
    """``f(x, out)``: the reduction ``prim`` as :func:`reduce` computes it (stored into ``out`` when
    the dtypes agree and ``x`` is C-contiguous; else :func:`reduce` itself)."""
    acc = _accumulator(out.dtype)
    row = _ROW_UFUNCS.get(prim.name)

    def plain(x, out):
        reduce(None, prim, [x], [out])
    if row is None or not prim.keepdims or x.dtype != acc or out.dtype != acc:
        return plain
    uf, with_dtype = row
    axes, dtype = prim.axes, acc if with_dtype else None
    if prim.name != "mean":
        def run(x, out):
            if not x.flags.c_contiguous:
                return plain(x, out)
            uf.reduce(x, axes, dtype, out, True)
        return run
    n = math.prod(x.shape[a] for a in axes)

    def mean(x, out):  # np.sum(x, axis, keepdims=True) / n
        if not x.flags.c_contiguous:
            return plain(x, out)
        uf.reduce(x, axes, None, out, True)
        np.true_divide(out, n, out=out)
    return mean


def softmax(lane, prim, ins, outs):
    x, out = c_contiguous(_compute(ins[0], outs[0].dtype)), outs[0]
    e = np.exp(x - np.max(x, axis=prim.axes, keepdims=True, initial=-np.inf))  # initial: empty axes
    np.copyto(out, e / np.sum(e, axis=prim.axes, keepdims=True), casting="unsafe")


def _softmaxer(prim, x, out, scratch):
    """``f(x, out)``: the softmax ``prim`` as :func:`softmax` computes it."""
    dt = out.dtype
    if x.dtype != dt or dt not in (float32, float64) or prim.axes != (x.ndim - 1,):
        return lambda x, out: softmax(None, prim, [x], [out])
    axes = prim.axes
    row = x.shape[:-1] + (1,)
    m, s, e = scratch.take(row, dt), scratch.take(row, dt), scratch.take(x.shape, dt)

    def run(x, out):
        if not x.flags.c_contiguous:
            return softmax(None, prim, [x], [out])
        np.maximum.reduce(x, axes, None, m, True, -np.inf)
        np.subtract(x, m, out=e)
        np.exp(e, out=e)
        np.add.reduce(e, axes, None, s, True)
        np.true_divide(e, s, out=out)
    return run


def prepare_softmax(prim, ins, outs, scratch):
    f = _softmaxer(prim, ins[0], outs[0], scratch)
    return lambda ins, outs: f(ins[0], outs[0])
