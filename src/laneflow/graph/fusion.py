"""Fusing chains of elementwise ops (and dtype conversions) of one evaluation into one command.

Python host time, not the GPU, limits a chain of small elementwise ops: each op as its own command
costs an allocation, a launch and an event record. At ``lf.eval`` this pass merges an elementwise
node with the elementwise nodes that feed only it: a producer is absorbed when it is pending, has
exactly one use (its consumer) and no user-visible array, has the shape of the group (every step has
the output's shape; inputs from outside may broadcast: a keepdims reduction, a bias row), fuses by
the op table (``power``, whose integer case has a host-side check, does not) and the group stays within :data:`MAX_FUSE` ops. The group becomes one :class:`FusedNode` computing the root;
its inputs are the group's external values.

Results are those of the unfused ops, bit for bit: each step computes in its own loop dtype and is
rounded to its own dtype, as if stored and loaded (CUDA kernels compile with ``--fmad=false``, so
the compiler cannot contract a multiply of one step with an add of the next). The decision depends on
the program alone (never on lanes or streams); a group runs on its root's stream.

A backend opts in with ``Backend.fuses_elementwise``, and may cap the size of arrays it fuses
(``fuse_max_elements``). The CPU backend fuses arrays of up to 65,536 elements: there fusion saves
the per-command host cost (numpy still runs each step); above that numpy's time dominates, and a
fused tree would run branches one after another that lanes could run at once. The CUDA backend fuses
arrays of any size: one kernel reads each input once and writes one output, where separate kernels
would store and reload every intermediate. ``LANEFLOW_FUSE=0`` turns fusion off everywhere.
"""

from __future__ import annotations

import os

from ..ops import table
from .node import ArrayData, Primitive, Scalar

#: Most ops in one fused kernel (a longer chain becomes several kernels that each compile once).
MAX_FUSE = 32

_enabled = os.environ.get("LANEFLOW_FUSE", "") != "0"


def set_enabled(on: bool) -> None:
    """Turn elementwise fusion on or off for this process (``LANEFLOW_FUSE=0`` at start-up: off)."""
    global _enabled
    _enabled = bool(on)


def enabled() -> bool:
    """Whether fusion (elementwise, row programs, matmul epilogues) is on."""
    return _enabled


_KINDS = ("elementwise", "astype")


class Fused(Primitive):
    """Elementwise steps run as one kernel. ``steps[j] = (fn, operands, dtype)``: an operand is an
    input index (``k >= 0``), an earlier step (``-(j + 1)``) or a :class:`~laneflow.ops.primitives.Scalar`;
    the last step is the output."""

    kind = "fused"
    plain = False

    def __init__(self, steps: tuple, names: list):
        # errors and traces name every op of the group: "fused multiply, sqrt, add"
        shown = names if len(names) <= 6 else names[:3] + ["..."] + names[-2:]
        super().__init__(f"fused {', '.join(shown)}" + (f" ({len(names)} ops)" if len(names) > 6 else ""))
        self.steps = steps
        # per step, the last step that reads it (itself when none does): a backend running the
        # steps one by one frees each temporary there (the CPU kernel); a function of ``steps``
        last_use = list(range(len(steps)))
        for j, (_, operands, _) in enumerate(steps):
            for o in operands:
                if o.__class__ is int and o < 0:
                    last_use[-o - 1] = j
        self.last_use = tuple(last_use)

    def scalars(self) -> tuple:
        return tuple(o for _, operands, _ in self.steps for o in operands if o.__class__ is Scalar)

    def with_own_scalars(self) -> "Fused":
        p = Fused.__new__(Fused)
        p.__dict__.update(self.__dict__)
        p.__dict__.pop("_ck", None)  # (its cached scalars are the original's)
        p.steps = tuple((fn, tuple(Scalar(o.value) if o.__class__ is Scalar else o for o in operands), dtype)
                        for fn, operands, dtype in self.steps)
        return p


class FusedNode:
    """One fused command in a schedule: the primitive, the node it produces and the absorbed ones."""

    __slots__ = ("prim", "root", "members", "inputs", "stream")

    def __init__(self, prim: Fused, root: ArrayData, members: list, inputs: list):
        self.prim, self.root, self.members, self.inputs = prim, root, members, inputs
        self.stream = root.stream


def _fusible(d: ArrayData) -> bool:
    p = d.prim
    if p is None or d.siblings is not None:
        return False
    return p.kind in _KINDS and table.fuses(p)


def fuse(items: list) -> list | None:
    """``items`` (nodes and other schedule items, inputs before users) with elementwise groups
    replaced by :class:`FusedNode` s, or None when nothing fuses."""
    if not _enabled:
        return None
    cand = None
    for d in items:
        if type(d) is ArrayData and d.prim.kind in _KINDS:
            backend = d.stream.backend
            if backend.fuses_elementwise:
                cand = True
                break
    if cand is None:
        return None
    pos = {}
    for k, d in enumerate(items):
        if type(d) is ArrayData:
            pos[d] = k
    absorbed: set = set()
    fused: dict = {}  # root -> FusedNode
    for d in reversed(items):
        if type(d) is not ArrayData or d in absorbed or not _fusible(d):
            continue
        backend = d.stream.backend
        if not backend.fuses_elementwise:
            continue
        limit = backend.fuse_max_elements
        if limit is not None and d.size > limit:
            continue
        members = [d]
        stack = [d]
        while stack and len(members) < MAX_FUSE:
            m = stack.pop()
            for i in m.inputs:
                if (i.buffer is None and i.users == 1 and i.arrays == 0 and i in pos and i not in absorbed
                        and i.shape == d.shape and i.device == d.device and _fusible(i)
                        and len(members) < MAX_FUSE):
                    absorbed.add(i)
                    members.append(i)
                    stack.append(i)
        if len(members) > 1:
            fused[d] = _build(d, members, pos)
    if not fused:
        return None
    return replace_groups(items, absorbed, fused)


def replace_groups(items: list, absorbed: set, groups: dict) -> list:
    """``items`` without the ``absorbed`` nodes, each group's root replaced by its :class:`FusedNode`."""
    out = []
    for d in items:
        if type(d) is ArrayData:
            if d in absorbed:
                continue
            f = groups.get(d)
            if f is not None:
                out.append(f)
                continue
        out.append(d)
    return out


def _build(root: ArrayData, members: list, pos: dict) -> FusedNode:
    members.sort(key=pos.__getitem__)  # inputs before users

    def step(m: ArrayData) -> tuple:
        p = m.prim
        # astype is the "identity" step: the input converted to the node's dtype, as its kernel does
        fn, operands = (p.fn, p.operands) if p.kind == "elementwise" else ("identity", (0,))
        return (fn,), operands, (m.dtype,)
    steps, inputs = build_steps(members, step)
    return FusedNode(Fused(tuple(steps), [m.prim.name for m in members]), root, members, inputs)


def build_steps(members: list, describe) -> tuple[list, list]:
    """The steps of a fused kernel, one per member (in order, inputs before users), and the values it
    reads from outside. ``describe(m)`` gives ``(head, operands, tail)``; the step is ``(*head,
    resolved operands, *tail)``, the operands resolved by :func:`step_operands`. Both fusion passes
    (this one and graph/rowfusion.py) build their steps so."""
    step_of = {m: j for j, m in enumerate(members)}
    inputs: list = []
    in_index: dict = {}
    steps = []
    for m in members:
        head, operands, tail = describe(m)
        steps.append((*head, step_operands(m, operands, step_of, in_index, inputs), *tail))
    return steps, inputs


def step_operands(m: ArrayData, operands: tuple, step_of: dict, in_index: dict, inputs: list) -> tuple:
    """A member's operands as a fused step reads them: a Scalar as it is, an earlier member as
    ``-(step + 1)``, a value from outside as its input number (appended to ``inputs`` when new)."""
    ops = []
    for o in operands:
        if o.__class__ is not int:
            ops.append(o)  # a Scalar
            continue
        i = m.inputs[o]
        j = step_of.get(i)
        if j is not None:
            ops.append(-(j + 1))
            continue
        k = in_index.get(i)
        if k is None:
            k = in_index[i] = len(inputs)
            inputs.append(i)
        ops.append(k)
    return tuple(ops)
