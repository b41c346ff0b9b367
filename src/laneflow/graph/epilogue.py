"""Matmul epilogues: a bias add, a residual add and a tanh GELU after a matmul become part of it.

A transformer's projection is ``x @ w + b``, often followed by ``h + (...)`` (the residual) or a
GELU. Run as written that is a matmul and one or two elementwise kernels, each storing and reloading
the product. cuBLASLt computes ``act(a @ b + bias + C)`` in one call (epilogues ``BIAS`` and
``GELU_BIAS``, the residual as its ``C`` operand with ``beta = 1``), so this pass, run before
elementwise fusion (``schedule.passes``), rewrites the add (or the GELU) into a
:class:`~laneflow.ops.primitives.MatmulEpilogue` node that reads the matmul's operands, the bias row
and the residual. The matmul node itself disappears.

What is absorbed, and when:

- ``add(m, bias)`` (either order): ``bias`` has shape ``(N,)``, N the product's last dimension;
- ``add(m, r)`` (either order): ``r`` has the product's shape (the residual);
- ``gelu_tanh(m)`` where ``m`` already has its bias and no residual (cuBLASLt's GELU is the tanh
  form, ``lf.nn.gelu(x, approximate="tanh")``; the plain-op GELU, eight elementwise ops, fuses into one
  elementwise kernel instead);

always with ``m`` a pending product that only this op reads and no array holds, one float dtype for
the product, the add and the operand, and both nodes on one stream. The epilogue accumulates in the
compute dtype and rounds once, where the unfused graph rounds after the product and after each add:
for float32 and float64 the bits may differ in the last place, for the half types by one rounding
of the half type (the tests bound both). A backend opts in per dtype with ``Backend.matmul_epilogues``;
``LANEFLOW_FUSE=0`` turns this pass off with the other fusions.
"""

from __future__ import annotations

from ..ops.primitives import Matmul, MatmulEpilogue
from . import fusion
from .node import ArrayData


_PRIMS: dict = {}


def _product(m, e: ArrayData, pos: dict):
    """``m`` when it is a product ``e`` may absorb, else None."""
    if (type(m) is ArrayData and m.buffer is None and m in pos and m.users == 1 and m.arrays == 0
            and m.siblings is None and m.stream is e.stream and m.shape == e.shape and m.dtype == e.dtype):
        p = m.prim
        if ((p.__class__ is Matmul or p.__class__ is MatmulEpilogue) and p.__dict__.get("in_views") is None
                and m.size and len(m.inputs[1].shape) >= 2 and m.inputs[0].shape[-1]):
            return m  # (a product with a 1-D right operand or an empty contraction keeps its own kernels)
    return None


def _absorb(e: ArrayData, m: ArrayData, extra: tuple, bias: bool, residual: bool, act) -> None:
    p = m.prim
    old_bias, old_res = (p.bias, p.residual) if p.__class__ is MatmulEpilogue else (False, False)
    ins = list(m.inputs[:2])
    rest = list(m.inputs[2:])
    if old_bias or bias:
        ins.append(rest.pop(0) if old_bias else extra[0])
    if old_res or residual:
        ins.append(rest.pop(0) if old_res else extra[-1])
    key = (old_bias or bias, old_res or residual, act if act is not None else
           (p.act if p.__class__ is MatmulEpilogue else None))
    prim = _PRIMS.get(key)
    if prim is None:  # one primitive per kind of epilogue: its cache key is computed once
        prim = _PRIMS[key] = MatmulEpilogue(*key)
    e.prim = prim
    # e reads m's operands instead of m: m loses its one user, its inputs change reader
    m.users -= 1
    e.inputs = tuple(ins)
    m.inputs = ()


def fold(items: list) -> list | None:
    """``items`` with epilogues absorbed into their products, or None when nothing changed."""
    if not fusion._enabled:
        return None
    pos = None
    dropped: set = set()
    for e in items:
        if type(e) is not ArrayData or e.siblings is not None or e.prim is None:
            continue
        p = e.prim
        if p.kind != "elementwise" or e.dtype not in e.stream.backend.matmul_epilogues:
            continue
        fn = p.fn
        if fn == "add" and p.operands == (0, 1):
            if pos is None:
                pos = {d: k for k, d in enumerate(items) if type(d) is ArrayData}
            for side in (0, 1):
                m = _product(e.inputs[side], e, pos)
                if m is None or m in dropped:
                    continue
                other = e.inputs[1 - side]
                mp = m.prim
                has = (mp.bias, mp.residual, mp.act) if mp.__class__ is MatmulEpilogue else (False, False, None)
                if other is m or other.dtype != e.dtype or has[2] is not None:
                    continue
                if other.shape == (e.shape[-1],) and not has[0] and not has[1]:
                    _absorb(e, m, (other,), True, False, None)
                elif other.shape == e.shape and not has[1]:
                    _absorb(e, m, (other,), False, True, None)
                else:
                    continue
                dropped.add(m)
                break
        elif fn == "gelu_tanh" and p.operands == (0,):
            if pos is None:
                pos = {d: k for k, d in enumerate(items) if type(d) is ArrayData}
            m = _product(e.inputs[0], e, pos)
            if (m is not None and m not in dropped and m.prim.__class__ is MatmulEpilogue and m.prim.bias
                    and not m.prim.residual and m.prim.act is None):
                _absorb(e, m, (), False, False, "gelu_tanh")
                dropped.add(m)
    if not dropped:
        return None
    return [d for d in items if d not in dropped]
