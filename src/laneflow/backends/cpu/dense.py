"""CPU kernels of matmul (with its epilogues), lf.nn's norms and attention, prepared (``prepared.py``).

Each ``prepare_*`` decides once, for operands of these shapes and dtypes, how the kernel runs, and
returns ``run(ins, outs)``. When every operand already has the compute dtype (float32 or float64)
the results are stored into the output or a temporary of ``scratch`` as they are computed; otherwise
(half types, mixed dtypes) the kernel itself runs (``matmul``, ``norm``, ``attention``: results in
fresh arrays copied into the output). Both make the same numpy calls on the same values (see
``prepared.py`` on reductions and layouts), so the same bits.
"""

from __future__ import annotations

import numpy as np

from ...dtypes import float32, float64
from ...ops.primitives import MatmulEpilogue
from ...ops.table import GELU_TANH_C
from .prepared import SPECIAL, _accumulator


# -- matmul ----------------------------------------------------------------------------------------

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


def _product_shape(a, b) -> tuple | None:
    """The shape of ``a @ b`` when both are matrices or stacks of as many (else None: the plain code)."""
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        return None
    ba, bb = a.shape[:-2], b.shape[:-2]
    if ba and bb and ba != bb:
        return None
    return (ba or bb) + (a.shape[-2], b.shape[-1])


def prepare_matmul(prim, ins, outs, scratch):
    out = outs[0]
    acc = out.dtype
    if (acc not in (float32, float64) or any(x.dtype != acc for x in ins)
            or _product_shape(ins[0], ins[1]) != out.shape):
        return lambda ins, outs: matmul(None, prim, ins, outs)
    epi = prim.__class__ is MatmulEpilogue
    adds = (prim.bias + prim.residual) if epi else 0
    act = prim.act if epi else None
    if not adds and act is None:
        return lambda ins, outs: np.matmul(ins[0], ins[1], out=outs[0])
    gelu = _gelu_tanh(out.shape, acc, scratch) if act == "gelu_tanh" else None
    r = scratch.take(out.shape, acc) if act is not None else None

    def run(ins, outs):
        t = outs[0] if r is None else r
        np.matmul(ins[0], ins[1], out=t)
        for k in range(2, 2 + adds):  # r += bias; r += residual
            np.add(t, ins[k], out=t)
        if r is None:
            return
        if gelu is not None:
            gelu(r, outs[0])
        else:
            np.copyto(outs[0], SPECIAL[act](acc, r), casting="unsafe")
    return run


def _gelu_tanh(shape, dt, scratch):
    """``f(x, out)``: ``table._gelu_tanh`` of a float32 or float64 ``x``, its operations in its order
    (``0.5 * x * (1 + tanh(c * (x + 0.044715 * x * x * x)))``) into two temporaries and ``out``."""
    c = dt.type
    half, k, g, one = c(0.5), c(0.044715), c(GELU_TANH_C), c(1.0)
    a, t = scratch.take(shape, dt), scratch.take(shape, dt)

    def run(x, out):
        np.multiply(half, x, out=a)
        np.multiply(k, x, out=t)
        np.multiply(t, x, out=t)
        np.multiply(t, x, out=t)
        np.add(x, t, out=t)
        np.multiply(g, t, out=t)
        np.tanh(t, out=t)
        np.add(one, t, out=t)
        np.multiply(a, t, out=out)
    return run


# -- norms -----------------------------------------------------------------------------------------

def norm(lane, prim, ins, outs):
    """lf.nn.layer_norm / rms_norm over the last axis, statistics in the accumulator dtype. A strided
    input (a folded transpose) is first made C-contiguous: numpy's summation order follows memory
    layout, and the bits must not depend on whether a view was folded (the CPU fuzz found 1-ulp
    differences on a transposed input)."""
    out = outs[0]
    acc = float64 if out.dtype == float64 else float32
    x = np.ascontiguousarray(ins[0], dtype=acc)  # (ndim >= 1: ops.nn refuses 0-d)
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


def prepare_norm(prim, ins, outs, scratch):
    out, x = outs[0], ins[0]
    acc = out.dtype
    if acc not in (float32, float64) or any(i.dtype != acc for i in ins) or x.ndim < 1 or x.shape[-1] == 0:
        return lambda ins, outs: norm(None, prim, ins, outs)
    # ndarray.mean(-1, keepdims=True): a sum, then a division by the count as an np.intp (numpy's _mean)
    n, eps = np.intp(x.shape[-1]), acc.type(prim.eps)
    row = x.shape[:-1] + (1,)
    m, v = scratch.take(row, acc), scratch.take(row, acc)
    c, sq = scratch.take(x.shape, acc), scratch.take(x.shape, acc)
    layer = prim.name == "layer_norm"
    weight, bias = prim.weight, prim.bias

    def run(ins, outs):
        x, out = ins[0], outs[0]
        if not x.flags.c_contiguous:
            return norm(None, prim, ins, outs)
        if layer:  # xc = x - x.mean(-1)
            np.add.reduce(x, -1, None, m, True)
            np.true_divide(m, n, out=m, casting="unsafe")
            np.subtract(x, m, out=c)
            x = c
        np.multiply(x, x, out=sq)  # ((x * x).mean(-1) + eps) ** 0.5
        np.add.reduce(sq, -1, None, v, True)
        np.true_divide(v, n, out=v, casting="unsafe")
        np.add(v, eps, out=v)
        np.sqrt(v, out=v)
        y = out if not weight and not bias else sq
        np.true_divide(x, v, out=y)
        if weight:
            np.multiply(y, ins[1], out=out if not bias else y)
        if bias:
            np.add(y, ins[1 + weight], out=out)
    return run


# -- attention -------------------------------------------------------------------------------------

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
    allowed = _allowed(prim, Tq, Tk)
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


def _allowed(prim, Tq: int, Tk: int) -> np.ndarray:
    if prim.causal:
        return (np.arange(Tk)[None, :] <= np.arange(Tq)[:, None] + (Tk - Tq))[None, None]
    return np.ones((1, 1, Tq, Tk), bool)


def prepare_attention(prim, ins, outs, scratch):
    out = outs[0]
    acc = out.dtype
    q, k, v = ins[:3]
    if acc not in (float32, float64) or any(x.dtype != acc for x in ins) or prim.mask == "bool" or q.ndim != 4:
        return lambda ins, outs: attention(None, prim, ins, outs)
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    if (k.shape[:2] != (B, H) or v.shape[:3] != (B, H, Tk) or out.shape != (B, H, Tq, v.shape[3])
            or prim.mask == "additive" and np.broadcast_shapes(ins[3].shape, (B, H, Tq, Tk)) != (B, H, Tq, Tk)):
        return lambda ins, outs: attention(None, prim, ins, outs)
    # np.where(allowed, s, -inf): -inf written where a query may not see a key
    hidden = ~_allowed(prim, Tq, Tk)
    hide = bool(hidden.any())
    scale = acc.type(prim.scale)
    qc, vc = scratch.take(q.shape, acc), scratch.take(v.shape, acc)
    kt = scratch.take(k.shape[:2] + (k.shape[3], Tk), acc)
    s, rows = scratch.take((B, H, Tq, Tk), acc), (B, H, Tq, 1)
    m, bad = scratch.take(rows, acc), scratch.take(rows, np.dtype(bool))
    additive = prim.mask == "additive"

    def run(ins, outs):
        q, k, v = ins[0], ins[1], ins[2]
        # np.ascontiguousarray: the operand itself when it is contiguous, else a contiguous copy
        if not q.flags.c_contiguous:
            np.copyto(qc, q)
            q = qc
        if not v.flags.c_contiguous:
            np.copyto(vc, v)
            v = vc
        np.copyto(kt, k.swapaxes(-1, -2))  # (of k's contiguous copy: the same values)
        np.matmul(q, kt, out=s)
        np.multiply(s, scale, out=s)
        if additive:
            np.add(s, ins[3], out=s)
        if hide:
            np.copyto(s, -np.inf, where=hidden)
        np.maximum.reduce(s, -1, None, m, True, -np.inf)
        np.isfinite(m, out=bad)  # m where it is finite, else 0
        np.logical_not(bad, out=bad)
        np.copyto(m, 0, where=bad)
        np.subtract(s, m, out=s)
        np.exp(s, out=s)
        l = m  # (m is read no more)
        np.add.reduce(s, -1, None, l, True)
        np.greater(l, 0, out=bad)  # o / (l where l > 0, else 1), then 0 where l is not > 0
        np.logical_not(bad, out=bad)
        np.copyto(l, 1, where=bad)
        o = outs[0]
        np.matmul(s, v, out=o)
        np.true_divide(o, l, out=o)
        np.copyto(o, 0, where=bad)
    return run
