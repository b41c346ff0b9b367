"""Layout ops that make no copy where no one can observe them (issue 15: "views").

laneflow arrays are values, so ``x.reshape(...)``, ``x.T``, ``x[..., :d]`` and ``broadcast_to`` are
nodes of their own, and evaluated one by one each is a copy. This pass, run with the other scheduling
passes (``schedule.passes``), folds them away where nothing can see the difference:

- a chain of layout nodes is one *view* of the first non-layout value (its *base*): shape, element
  strides and an element offset (:func:`view_of`), composed the way numpy composes views;
- a consumer that reads a layout node gets the base as its input and the view as
  ``prim.in_views[position]`` (:func:`with_views`): the backend hands the kernel a data handle over the
  base's memory (``Backend.strided_view``). A *contiguous* view (a reshape, a leading slice) suits any
  folding consumer; a strided one (a transpose, an inner slice) only the kernel kinds a backend lists in
  ``Backend.strided_kinds`` (cuBLASLt reads transposed and strided matrices; numpy reads anything);
- a layout node read by something that cannot take the view becomes one copy of the composed view
  (:class:`Strided`), so a transpose followed by a reshape is one copy, not two;
- a layout node that nothing reads any more, and that no user array holds, is dropped.

The consumer reads the base buffer itself, so the encoder's hazards, buffer lifetimes and compiled
plans' memory plans see the true dependency: no memory is ever aliased between two values. An input
read through a view is never written in place (``schedule._donor``). Positions a kernel validates on
the host (index arrays) are never folded, nor are index ops, setitem and grouped matmuls.

``LANEFLOW_VIEWS=0`` turns the pass off (:func:`set_enabled` at run time); results are the same either
way, except that a matmul on a transposed operand may pick another cuBLASLt algorithm (rounding).
"""

from __future__ import annotations

import functools
import os

from ..ops import table
from ..shapes import basic_index_view, contiguous_strides, is_contiguous
from .fusion import FusedNode
from .node import ArrayData, Primitive

_enabled = os.environ.get("LANEFLOW_VIEWS", "") != "0"

#: The layout kinds that are views of their input.
LAYOUT = frozenset(("reshape", "transpose", "broadcast_to", "getitem", "strided"))
#: Consumer kinds that may read an input through a view (every backend takes contiguous views there).
FOLDS_INTO = frozenset(("elementwise", "astype", "fused", "rowfused", "reduce", "argreduce", "softmax", "logsumexp", "matmul",
                        "norm", "attention", "dynamic_update_slice"))
#: Kinds that take a view at some input positions only: dynamic_update_slice reads its update through
#: one, never the array it writes (that one is copied, or donated and written in place).
FOLD_POSITIONS = {"dynamic_update_slice": (1,)}


def set_enabled(on: bool) -> None:
    """Turn layout folding on or off for this process (``LANEFLOW_VIEWS=0`` at start-up: off)."""
    global _enabled
    _enabled = bool(on)


def enabled() -> bool:
    return _enabled


class Strided(Primitive):
    """A copy of a view of the input: ``out = as_strided(base, shape, strides, offset)`` (element
    strides and offset), contiguous, in row-major order of ``shape`` (the output may have another
    shape of the same size: a reshape that had to copy). What a chain of layout ops becomes when its
    reader needs memory of its own."""

    kind = "strided"

    def __init__(self, shape: tuple, strides: tuple, offset: int, name: str):
        super().__init__(name)
        self.shape, self.strides, self.offset = shape, strides, offset


# -- view algebra (pure: shapes, element strides and offsets) -------------------------------------

@functools.lru_cache(maxsize=4096)
def reshape_view(shape: tuple, strides: tuple, new: tuple) -> tuple | None:
    """Strides of a view of (shape, strides) reshaped to ``new`` without a copy, or None when the
    reshape must copy (numpy's rule: every group of old dims that maps onto a group of new dims is
    contiguous within itself). Remembered per arguments: a model's forward asks the same few
    questions at every uncached eval (the largest part of the views pass there)."""
    if 0 in shape:
        return None
    old = [(s, st) for s, st in zip(shape, strides) if s != 1]
    keep = [k for k, s in enumerate(new) if s != 1]
    sq = [new[k] for k in keep]
    out_sq = [0] * len(sq)
    oi = ni = 0
    while oi < len(old) and ni < len(sq):
        op, np_ = old[oi][0], sq[ni]
        oj, nj = oi + 1, ni + 1
        while op != np_:
            if np_ < op:
                np_ *= sq[nj]
                nj += 1
            else:
                op *= old[oj][0]
                oj += 1
        for k in range(oi, oj - 1):
            if old[k][1] != old[k + 1][0] * old[k + 1][1]:
                return None
        out_sq[nj - 1] = old[oj - 1][1]
        for k in range(nj - 1, ni, -1):
            out_sq[k - 1] = out_sq[k] * sq[k]
        oi, ni = oj, nj
    res = [0] * len(new)
    for k, st in zip(keep, out_sq):
        res[k] = st
    return tuple(res)


def step_view(prim: Primitive, in_shape: tuple, view: tuple, out_shape: tuple) -> tuple | None:
    """The view (strides, offset) of a layout node's output, given its input's view (shape
    ``in_shape``, strides, offset); None when this op cannot be a view of it."""
    strides, offset = view
    k = prim.kind
    if k == "reshape":
        st = reshape_view(in_shape, strides, out_shape)
        return None if st is None else (st, offset)
    if k == "transpose":
        return tuple(strides[p] for p in prim.perm), offset
    if k == "broadcast_to":
        pad = len(out_shape) - len(in_shape)
        return tuple(0 if d < pad or in_shape[d - pad] == 1 else strides[d - pad]
                     for d in range(len(out_shape))), offset
    if k == "getitem":
        if any(e.__class__ is tuple for e in prim.index):
            return None
        shape, st, off = basic_index_view(in_shape, strides, offset, prim.index)
        return st, off
    if k == "strided":
        # a view of a view: compose the element maps (strides over the input's strides)
        if not is_contiguous(in_shape, strides):
            return None
        base = offset
        return prim.strides, base + prim.offset
    return None


# -- the pass ---------------------------------------------------------------------------------------

def fold(items: list) -> list | None:
    """``items`` (schedule items, inputs before users) with layout nodes folded into their readers;
    None when nothing changed."""
    if not _enabled:
        return None
    views: dict = {}  # layout node -> (base, strides, offset)
    copies: dict = {}  # a reshape that must copy, of a view: it copies the view (in its order) itself
    for d in items:
        # a layout node that may become a view (a one-output reshape, transpose, broadcast, slice, strided
        # view; a getitem with index arrays gathers); tested inline: this loop sees every uncached node
        p = d.prim if type(d) is ArrayData else None
        if p is not None and p.kind in LAYOUT and d.siblings is None and not (p.kind == "getitem" and len(d.inputs) > 1):
            src = d.inputs[0]
            v = views.get(src)
            if v is None:
                v = (src, contiguous_strides(src.shape), 0)
            got = step_view(d.prim, src.shape, (v[1], v[2]), d.shape)
            if got is not None:
                views[d] = (v[0], got[0], got[1])
            elif src in views and d.prim.kind == "reshape":
                copies[d] = (v[0], src.shape, v[1], v[2])
    if not views:
        return None
    changed = False
    for d in items:
        if type(d) is ArrayData:
            if d.prim is None:
                continue
            if d in views:
                changed |= _collapse(d, views[d])
            elif d in copies:  # (row-major order is the reshape's: the copy of the view is the result)
                base, shape, strides, offset = copies[d]
                d.inputs[0].users -= 1
                base.users += 1
                d.inputs = (base,)
                d.prim = Strided(shape, strides, offset, d.prim.name)
                changed = True
            elif d.prim.kind in FOLDS_INTO and d.siblings is None:
                changed |= _fold_into(d, views)
        elif type(d) is FusedNode:
            changed |= _fold_into_fused(d, views)
    if not changed:
        return None
    out = []
    dropped = set()
    for d in reversed(items):  # users before inputs: a dropped reader releases its input first
        if d in views and d.users == 0 and d.arrays == 0 and type(d) is ArrayData:
            for i in d.inputs:
                i.users -= 1
            d.inputs = ()
            dropped.add(d)
            continue
        out.append(d)
    out.reverse()
    return out


def _collapse(d: ArrayData, v: tuple) -> bool:
    """A layout node over another layout node becomes one copy of the composed view of the base."""
    base, strides, offset = v
    if d.inputs[0] is base:
        return False
    d.inputs[0].users -= 1
    base.users += 1
    d.inputs = (base,)
    d.prim = Strided(d.shape, strides, offset, d.prim.name)
    return True


def _accepts(d, pos: int, shape: tuple, strides: tuple, backend) -> bool:
    if table.validated_on_host(d.prim, pos):
        return False
    only = FOLD_POSITIONS.get(d.prim.kind)
    if only is not None and pos not in only:
        return False
    return is_contiguous(shape, strides) or d.prim.kind in backend.strided_kinds


def _fold_into(d: ArrayData, views: dict) -> bool:
    for i in d.inputs:  # (most readers read no view: one look each before any list is made)
        if i in views:
            break
    else:
        return False
    backend = d.stream.backend
    ins = list(d.inputs)
    old = getattr(d.prim, "in_views", None)
    vs = list(old) if old is not None else [None] * len(ins)
    changed = False
    for pos, i in enumerate(ins):
        v = views.get(i)
        if v is None or vs[pos] is not None or not _accepts(d, pos, i.shape, v[1], backend):
            continue
        base = v[0]
        i.users -= 1
        base.users += 1
        ins[pos] = base
        # a view that is its base (a reshape and back, x.reshape(-1).reshape(x.shape)): the input is the
        # base itself, no view; the reader keeps the C submit path, which leaves readers of views to Python
        if not (i.shape == base.shape and v[2] == 0 and tuple(v[1]) == contiguous_strides(base.shape)):
            vs[pos] = (i.shape, v[1], v[2])
        changed = True
    if changed:
        d.inputs = tuple(ins)
        if old is not None or any(x is not None for x in vs):
            d.prim = with_views(d.prim, tuple(vs))
    return changed


def _fold_into_fused(f, views: dict) -> bool:
    backend = f.stream.backend
    old = getattr(f.prim, "in_views", None)
    vs = list(old) if old is not None else [None] * len(f.inputs)
    swap: dict = {}
    for pos, i in enumerate(f.inputs):
        v = views.get(i)
        if v is None or vs[pos] is not None or i in swap:
            continue
        if not (is_contiguous(i.shape, v[1]) or f.prim.kind in backend.strided_kinds):
            continue
        if f.inputs.count(i) != 1:
            continue
        swap[i] = v[0]
        vs[pos] = (i.shape, v[1], v[2])
    if not swap:
        return False
    # every read of a swapped input moves to its base: the members' inputs, and the group's
    for m in f.members:
        if any(i in swap for i in m.inputs):
            new = []
            for i in m.inputs:
                b = swap.get(i)
                if b is not None:
                    i.users -= 1
                    b.users += 1
                    new.append(b)
                else:
                    new.append(i)
            m.inputs = tuple(new)
    f.inputs = [swap.get(i, i) for i in f.inputs]
    f.prim = with_views(f.prim, tuple(vs))
    return True


def with_views(prim: Primitive, vs: tuple) -> Primitive:
    """A copy of ``prim`` whose kernel reads input k through view ``vs[k]`` ((shape, element strides,
    element offset) over the input's memory, or None: the input as it is)."""
    p = prim.__class__.__new__(prim.__class__)
    p.__dict__.update(prim.__dict__)
    p.__dict__.pop("_ck", None)
    p.in_views = vs
    return p
