"""Fusing last-axis reductions with their elementwise producers and consumers into one row kernel.

A hand-written layer norm (``xc = x - x.mean(-1, keepdims=True)``, ``var = (xc * xc).mean(-1, keepdims=True)``,
``xc / sqrt(var + eps) * w + b``) is nine ops, and a softmax with a scale and a mask is three or more:
one command each, every intermediate stored and read back. Every value in such a group has either
the *full* shape ``P + (N,)`` or the *per-row* shape ``P + (1,)``, and every reduction runs over the
last axis, so one program per row computes the whole group: the GPU kernel
(``backends/cuda/kernels/rowfused.py``) gives each row a block, which loops over the row once per
reduction level (a block-wide reduction after each) and once more to write the root; the CPU kernel
runs the members' own numpy kernels one after another (one command instead of many, same bits).

The pass runs before elementwise fusion (``graph/fusion.py``). It starts from the most downstream
candidate and grows backwards: a producer joins when it is pending, has no user-visible array, is
of a fusible kind (elementwise and astype as in elementwise fusion; ``sum mean max min prod`` over
the last axis with ``keepdims=True``; ``softmax`` over the last axis), has the full or the per-row
shape, and *every* one of its users is already in the group (a value read twice, like ``xc``,
joins once both readers have). A group without a reduction is left to elementwise fusion.

Numerics: elementwise steps compute and round exactly as their single-op kernels do; a reduction
accumulates in the dtype its own kernel uses (float32 for half types) but in another order, so a
fused float result may differ from the unfused one in the last bits of a reduction (within the
tolerances ``tests/test_rowfusion.py`` states: a few ulps of the accumulator dtype relative to the
row's magnitude). On the CPU the results are the unfused ones, bit for bit. ``LANEFLOW_FUSE=0``
turns this pass off with the other fusions.
"""

from __future__ import annotations

from ..ops import table
from . import fusion
from .fusion import FusedNode
from .node import ArrayData, Primitive, Scalar

#: Reductions a row program computes (``var``/``std`` are two-pass of their own and stay single ops).
ROW_REDUCTIONS = frozenset(("sum", "mean", "max", "min", "prod"))
#: Most members in one row program, and most inputs (each may need its own strides).
MAX_MEMBERS = 48
#: Kinds a row program needs at least one of.
ROOT_KINDS = frozenset(("reduce", "softmax"))
MAX_INPUTS = 16


class RowFused(Primitive):
    """Steps of one row program. ``steps[j] = (kind, op, operands, dtype, full)``:

    - ``kind`` "elementwise" (``op`` the function), "astype" (``op`` "identity"), "reduce" (``op``
      the member's :class:`~laneflow.ops.primitives.Reduce`) or "softmax" (``op`` its primitive);
    - ``operands``: an input index (``k >= 0``), an earlier step (``-(j + 1)``) or a Scalar;
    - ``full``: whether the step has the full shape (else per-row: a reduction and what is computed
      from reductions).

    ``n`` is the row length N; the last step is the output."""

    kind = "rowfused"
    plain = False

    def __init__(self, steps: tuple, names: list, n: int):
        shown = names if len(names) <= 6 else names[:3] + ["..."] + names[-2:]
        super().__init__(f"fused {', '.join(shown)}" + (f" ({len(names)} ops)" if len(names) > 6 else ""))
        self.steps = steps
        self.n = n

    def scalars(self) -> tuple:
        return tuple(o for st in self.steps for o in st[2] if o.__class__ is Scalar)

    def with_own_scalars(self) -> "RowFused":
        p = RowFused.__new__(RowFused)
        p.__dict__.update(self.__dict__)
        p.__dict__.pop("_ck", None)
        p.steps = tuple((k, op, tuple(Scalar(o.value) if o.__class__ is Scalar else o for o in ops), dt, full)
                        for k, op, ops, dt, full in self.steps)
        return p


def _row_reduce(p) -> bool:
    return (p.kind == "reduce" and p.name in ROW_REDUCTIONS and p.keepdims and len(p.axes) == 1)


def _member_kind(d: ArrayData) -> str | None:
    """"e" elementwise/astype, "r" a row reduction, "s" a row softmax, None: not a row-program op."""
    p = d.prim
    if p is None or d.siblings is not None or p.__dict__.get("in_views") is not None:
        return None
    k = p.kind
    if k in ("elementwise", "astype"):
        return "e" if table.fuses(p) else None
    nd = len(d.shape)
    if nd == 0:
        return None
    if k == "reduce" and _row_reduce(p) and p.axes[0] == nd - 1:
        return "r"
    if k == "softmax" and p.axes == (nd - 1,):
        return "s"
    return None


def fuse_rows(items: list) -> list | None:
    """``items`` (inputs before users) with row programs replaced by :class:`FusedNode` s of a
    :class:`RowFused`, or None when none forms."""
    if not fusion.enabled():
        return None
    for d in items:  # the common eval has no reduction at all: one cheap scan, then nothing to do
        if type(d) is ArrayData and d.prim.kind in ROOT_KINDS:
            break
    else:
        return None
    kinds: dict = {}
    seeded: set = set()  # nodes with a row reduction or softmax among their fusible ancestors (or themselves)
    pos: dict = {}
    for k, d in enumerate(items):
        if type(d) is not ArrayData:
            continue
        pos[d] = k
        mk = _member_kind(d)
        if mk is None or not d.stream.backend.fuses_elementwise:
            continue
        kinds[d] = mk
        if mk != "e" or any(i in seeded for i in d.inputs):
            seeded.add(d)
    if not any(kinds[d] != "e" for d in seeded):
        return None
    absorbed: set = set()
    groups: dict = {}
    for d in reversed(items):
        if type(d) is not ArrayData or d not in seeded or d in absorbed:
            continue
        g = _grow(d, kinds, pos, absorbed)
        if g is not None:
            members, n = g
            absorbed.update(m for m in members if m is not d)
            groups[d] = _build(d, members, pos, kinds, n)
    if not groups:
        return None
    return fusion.replace_groups(items, absorbed, groups)


def _grow(root: ArrayData, kinds: dict, pos: dict, taken: set) -> tuple | None:
    """(members, N) of the row program rooted at ``root``, or None when it holds no reduction."""
    backend = root.stream.backend
    rk = kinds[root]
    if rk == "r":
        full = root.inputs[0].shape
    elif rk == "s":
        full = root.shape
    else:
        full = root.shape if root.shape[-1] != 1 else None  # a per-row root: N comes with its reduction
    lead = root.shape[:-1]
    if len(lead) + 1 > 9:
        return None
    limit = backend.fuse_max_elements
    members = {root}
    uses: dict = {}  # candidate -> reads of it by members so far

    def note(m: ArrayData) -> None:
        for i in m.inputs:
            uses[i] = uses.get(i, 0) + 1

    note(root)
    grown = True
    while grown and len(members) < MAX_MEMBERS:
        grown = False
        for i in list(uses):
            if i in members or i in taken or uses[i] != i.users or i.arrays or i.buffer is not None:
                continue
            ik = kinds.get(i)
            if ik is None or i.device != root.device or i.stream is not root.stream:
                continue
            shape = i.shape
            if shape[:-1] != lead:
                continue
            if ik == "r":
                src = i.inputs[0].shape
                if src[:-1] != lead or (full is not None and src != full):
                    continue
                if full is None:
                    full = src
            elif shape[-1] != 1 and full is not None and shape != full:
                continue
            elif shape[-1] != 1 and full is None:
                full = shape
            if limit is not None and full is not None and _size(full) > limit:
                continue
            members.add(i)
            note(i)
            grown = True
            if len(members) >= MAX_MEMBERS:
                break
    if full is None or limit is not None and _size(full) > limit:
        return None
    if len(members) < 2 or not any(kinds[m] != "e" for m in members):
        return None  # no reduction, or a reduction alone (its own tuned kernel serves it)
    # the group's inputs: values read by members from outside
    outside = {i for m in members for i in m.inputs if i not in members}
    if len(outside) > MAX_INPUTS:
        return None
    return sorted(members, key=pos.__getitem__), full[-1]


def _size(shape: tuple) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _build(root: ArrayData, members: list, pos: dict, kinds: dict, n: int) -> FusedNode:
    def step(m: ArrayData) -> tuple:
        p = m.prim
        mk = kinds[m]
        if mk == "e":
            kind, op, operands = ((p.kind, p.fn, p.operands) if p.kind == "elementwise"
                                  else ("astype", "identity", (0,)))
        else:
            kind, op, operands = ("reduce" if mk == "r" else "softmax"), p, (0,)
        return (kind, op), operands, (m.dtype, m.shape[-1] == n and mk != "r")
    steps, inputs = fusion.build_steps(members, step)
    prim = RowFused(tuple(steps), [m.prim.name for m in members], n)
    return FusedNode(prim, root, members, inputs)
