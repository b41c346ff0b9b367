"""Grouping independent matmuls of one evaluation into one command (a grouped GEMM).

A mixture-of-experts step, or the Q/K/V projections of attention, is several matmuls that do not
depend on each other and have the same shapes. Each one as its own library call costs about 20 us of
host time on the H200 machine (cuBLASLt's own host cost, PyTorch pays it too), so 32 of them are
host-bound no matter how many lanes run them. One pointer-array batched GEMM does all of them in one
call and runs as fast as a strided batch over stacked operands (measured: ``tools/probe_grouped.py``).

The pass looks at the pending nodes of one ``lf.eval`` (or one compiled plan): matmuls on the same
device with equal operand shapes (no batch broadcasting), one dtype for both operands and the result,
that sit at the same *level* (longest path from evaluated values), so none can depend on another,
become one :class:`MatmulGroup` node (several, when there are more than the backend's
``limits.max_matmul_group``). The decision depends on the program alone, never on lanes or
streams, so one lane and many lanes (one stream and several) compute the same bits. A group runs on
the stream of its first member; the encoder orders it after the writers of every member's inputs,
whatever their streams. A backend opts in per dtype with
``Backend.groups_matmul(dtype)``; the CPU backend does not (its lanes already run matmuls in parallel,
and one command would serialise them).

``LANEFLOW_GROUP_MATMUL=0`` turns the pass off (for A/B measurements).
"""

from __future__ import annotations

import os

from .node import ArrayData, Primitive

_enabled = os.environ.get("LANEFLOW_GROUP_MATMUL", "1") != "0"


def set_enabled(on: bool) -> None:
    """Turn matmul grouping on or off for this process (``LANEFLOW_GROUP_MATMUL=0`` at start-up)."""
    global _enabled
    _enabled = bool(on)


class MatmulGroup(Primitive):
    """``n`` independent matmuls of equal shapes: inputs ``a_0..a_{n-1}, b_0..b_{n-1}``, outputs
    ``c_0..c_{n-1}`` with ``c_i = a_i @ b_i``."""

    kind = "matmul_group"
    one_allocation = True  # its outputs are alike, made and usually dropped together

    def __init__(self, n: int):
        super().__init__(f"matmul (group of {n})")
        self.n = n


class Group:
    """One grouped command in a schedule: the primitive, its member nodes and their inputs."""

    __slots__ = ("prim", "members", "inputs", "stream")

    def __init__(self, members: list[ArrayData]):
        self.members = members
        self.prim = MatmulGroup(len(members))
        self.inputs = [m.inputs[0] for m in members] + [m.inputs[1] for m in members]
        self.stream = members[0].stream


def group_matmuls(order: list[ArrayData]) -> list | None:
    """``order`` (inputs before users) as a list of nodes and :class:`Group` s, still inputs before
    users, or None when no two matmuls group (the caller then keeps ``order`` as it is).

    With groups the order becomes level by level (stable within a level): a group's members share a
    level, so every input of every member comes before the group and every user after it.
    """
    if not _enabled:
        return None
    cands: dict = {}
    allowed: dict = {}  # (backend, dtype) -> does the backend group it
    deep = False        # does any node take another pending node as input (levels above 0)?
    last = None         # (prim, backend, ok) of the last matmul: experts repeat one signature
    for d in order:
        if not deep:
            for i in d.inputs:
                if i.buffer is None:
                    deep = True
        p = d.prim
        if p.kind != "matmul" or p.gkey is None:  # gkey: the op checked shapes and dtypes (ops/matmul.py)
            continue
        backend = d.stream.backend
        if last is not None and last[0] is p and last[1] is backend:
            ok = last[2]
        else:
            ok = allowed.get((id(backend), p.gkey[2]))
            if ok is None:
                ok = allowed[(id(backend), p.gkey[2])] = backend.groups_matmul(p.gkey[2])
            last = (p, backend, ok)
        if ok:
            cands.setdefault((d.device, p.gkey), []).append(d)
    if not any(len(v) > 1 for v in cands.values()):
        return None
    # Nodes are dictionary keys by identity (ArrayData does not define equality).
    if deep:
        level: dict = {}
        for d in order:
            lv = 0
            for i in d.inputs:
                li = level.get(i)
                if li is not None and li >= lv:
                    lv = li + 1
            level[d] = lv
    group_of: dict = {}
    for members in cands.values():
        if len(members) < 2:
            continue
        if deep:
            by_level: dict = {}
            for d in members:
                by_level.setdefault(level[d], []).append(d)
            sets = by_level.values()
        else:
            sets = (members,)
        most = members[0].stream.backend.limits.max_matmul_group
        for same in sets:
            for s in range(0, len(same), most):
                chunk = same[s:s + most]
                if len(chunk) > 1:
                    g = Group(chunk)
                    for d in chunk:
                        group_of[d] = g
    if not group_of:
        return None
    items: list = []
    emitted: set = set()
    for d in sorted(order, key=level.__getitem__) if deep else order:
        g = group_of.get(d)
        if g is None:
            items.append(d)
        elif g not in emitted:
            emitted.add(g)
            items.append(g)
    return items
