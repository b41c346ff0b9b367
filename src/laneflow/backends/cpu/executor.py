"""A compiled plan on the CPU as one command: every step's numpy kernel in turn, on one lane.

The CPU's whole-plan executor (``Backend.graph_plan``), what a CUDA graph is on the GPU: one command
per call instead of one per step, so a repeated step costs one queue hand-over to a worker thread and
one loop over pre-bound kernels. The command reads the arguments and the plan's captured values, and
writes the plan's arena (intermediates, in the regions of ``graph/memory_plan.py``) and the call's
output buffers, made fresh for each call; the encoder orders it with everything around it as any
command. Steps run in the plan's order, a topological order of its data dependencies, so the arena's
sharing of regions is safe inside the command too.

The first call binds every step (``CPUPlan._bind``): its kernel prepared for these operands
(``prepared.py``: the numpy calls decided once, temporaries in the plan's ``Scratch``), and its inputs
and outputs resolved to the arrays that stay the same from call to call (arena views, captured values,
the views of them a step reads); a later call fills in only its arguments and returned outputs. A
layout copy of an argument (a weight's transpose) is made again only for another value (``_Kept``).
"""

from __future__ import annotations

import weakref

import numpy as np

from ...errors import ExecutionError, LaneflowError
from ...runtime.buffer import Buffer
from ...runtime.lane import HostCommand, describe
from ...graph.views import LAYOUT
from .kernels import as_view
from .prepared import Scratch


class CPUPlan:
    """The executor of one plan on a CPU stream."""

    def __init__(self, backend, plan, stream):
        for step in plan.steps:
            if step.stream.backend is not backend:
                raise LaneflowError("steps run on more than one backend")
        self.backend, self.stream = backend, stream
        self.steps = plan.steps
        # the primitives as they are now: a cached plan's scalars may change after this (eval cache)
        self.prims = [step.prim.with_own_scalars() if step.prim.scalars() else step.prim for step in plan.steps]
        arena = plan.arena or {}
        self.views = {slot: view for slot, (_, view) in arena.items()}
        self.regions: list[Buffer] = []
        for region, _ in arena.values():
            if not any(region is r for r in self.regions):
                self.regions.append(region)
        self.consts = []
        for step in plan.steps:
            for kind, v in step.srcs:
                if kind == "const" and not any(v.buffer is c for c in self.consts):
                    self.consts.append(v.buffer)
        # captured values on a GPU: every call copies from device memory (ThreadLane.driver_seq)
        self.consts_on_device = any(c.device.type != "cpu" for c in self.consts)
        returned = {ref[1] for ref, *_ in plan.outputs if ref[0] == "slot"}
        self.inplace = plan.inplace  # slot -> donated argument it may be written into
        self.returned = sorted(returned | set(self.inplace))
        self.spec_of = {slot: spec for step in plan.steps for slot, spec in zip(step.slots, step.specs)}
        # per step: (primitive, inputs as (0, slot) | (1, argument) | (2, a captured value's data),
        # output slots); bound to arrays and prepared at the first call (_bind)
        code = {"slot": 0, "arg": 1}
        self.program = [
            (prim, tuple((code[k], v) if k in code else (2, v.buffer.data) for k, v in step.srcs), tuple(step.slots))
            for step, prim in zip(plan.steps, self.prims)]
        self.bound: list | None = None
        self.scratch = Scratch()  # the prepared kernels' temporaries (one command runs at a time)
        self.kept = _Kept(self.program, self.views, self.spec_of)
        self.launches = 0

    def stats(self) -> dict:
        return {"mode": "one command", "steps": len(self.steps), "launches": self.launches,
                "arena_bytes": sum(r.nbytes for r in self.regions), "kept_bytes": self.kept.nbytes}

    def run(self, datas: list, stream, donated: frozenset = frozenset()) -> "_Outputs":
        """Encode the call's one command (under the scheduling lock); returns its outputs. A slot
        written in place (``plan.inplace``) of an argument in ``donated`` is that argument's buffer."""
        bufs = [d.buffer for d in datas]
        outs: dict[int, Buffer] = {}
        for slot in self.returned:
            arg = self.inplace.get(slot)
            if arg is not None and arg in donated:
                outs[slot] = bufs[arg]
                continue
            spec = self.spec_of[slot]
            outs[slot] = self.backend.allocate(spec.device, spec.shape, spec.dtype, "compiled plan")
        returned, kept = self.returned, self.kept
        now = kept.values(datas)

        def run_all(lane, bufs=bufs, outs=outs) -> None:
            # this call's arrays: the arguments, then the returned outputs
            cur = [b.data for b in bufs]
            cur += [outs[slot].data for slot in returned]
            bound = self.bound
            skip = kept.unchanged(now)
            if bound is None:
                self.bound = self._bind(lane, cur)
                kept.ran(now)
                return
            for j, (run, prim, ins, res, holes) in enumerate(bound):
                if j in skip:
                    continue
                if holes:
                    ins, res = ins.copy(), res.copy()
                    for at, pos, k, view in holes:
                        x = cur[k]
                        (res if at else ins)[pos] = x if view is None else as_view(x, *view)
                try:
                    run(ins, res)
                except LaneflowError:
                    raise
                except Exception as e:  # noqa: BLE001 - the failing op is named, as a command would be
                    raise ExecutionError(prim.name, e, describe(ins, res, lane)) from e
            kept.ran(now)

        reads = list({id(b): b for b in (*self.consts, *bufs)}.values())
        # a HostCommand: an lf.eval that waits for it may run it itself when the lane is idle
        device_reads = self.consts_on_device or any(b.device.type != "cpu" for b in bufs)
        stream.encoder.submit(HostCommand("compiled plan", run_all, reads, [*self.regions, *outs.values()],
                                          device_reads), stream.lanes[0])
        self.launches += 1
        self._last = {slot: outs[slot] for slot in self.inplace}
        return _Outputs(outs)

    def _bind(self, lane, cur: list) -> list:
        """Runs the first call, step by step, and returns the steps bound for later calls: per step
        ``(run, primitive, inputs, outputs, holes)``, the kernel prepared for these operands (``prepared.py``),
        its inputs and outputs with the arrays that are the same at every call (the arena's views,
        captured values, the views of them it reads), and ``holes``: ``(is output, position, index in
        the call's arrays, view)`` for the others (arguments, returned outputs)."""
        n_args = len(cur) - len(self.returned)
        where = {slot: n_args + k for k, slot in enumerate(self.returned)}
        views, backend = self.views, self.backend
        bound = []
        for prim, srcs, slots in self.program:
            kern = backend.kernel(prim.kind)
            prepare, reads = getattr(kern, "prepare", None), getattr(kern, "views", None)
            vs = reads(prim) if reads is not None else prim.__dict__.get("in_views")
            ins, holes = [], []
            for pos, (k, v) in enumerate(srcs):
                view = vs[pos] if vs is not None else None
                if k == 2 or k == 0 and v in views:
                    x = v if k == 2 else views[v]
                else:
                    x = cur[v if k == 1 else where[v]]
                    holes.append((0, pos, v if k == 1 else where[v], view))
                ins.append(x if view is None else as_view(x, *view))
            res = []
            for pos, slot in enumerate(slots):
                if slot in views:
                    res.append(views[slot])
                else:
                    res.append(cur[where[slot]])
                    holes.append((1, pos, where[slot], None))
            try:
                if prepare is None:
                    run = _plain(kern, prim)
                else:
                    self.scratch.step()
                    run = prepare(prim, ins, res, self.scratch)
                run(ins, res)
            except LaneflowError:
                raise
            except Exception as e:  # noqa: BLE001 - the failing op is named, as a command would be
                raise ExecutionError(prim.name, e, describe(ins, res, lane)) from e
            for at, pos, _, _ in holes:  # (this call's arrays are not kept)
                (res if at else ins)[pos] = None
            bound.append((run, prim, ins, res, holes))
        return bound

    def inplace_buffer(self, slot: int) -> Buffer:
        """The buffer the last call wrote ``slot`` (a donated argument's, or a fresh one) into."""
        return self._last[slot]

    def own(self, slot: int, d) -> None:
        """(CUDA graphs track who holds their state buffers; on the CPU a donated buffer is the caller's.)"""


class _Kept:
    """The layout copies a plan keeps from call to call: a transpose, reshape or slice of an argument
    (or a captured value) runs again only when the argument is another value than at the last call.
    numpy makes no such copy (it reads a view: a model's head multiplies by the embedding's transpose
    as it is), and laneflow must (a matmul reads a contiguous operand, for bits that do not depend on
    addresses); for a value that does not change between calls, such as a weight, the copy is made
    once. Values are immutable (a buffer is written in place only when nothing can see its value any
    more), so the same value, by identity, has the same contents; one whose buffer is shared outside
    laneflow (``exported``) counts as another. The copies get memory of their own instead of the
    arena's, at most :data:`KEEP_BYTES` a plan."""

    def __init__(self, program: list, views: dict, spec_of: dict):
        self.arg: dict = {}  # kept step -> the argument it copies (None: a captured value)
        self.nbytes = 0
        for j, (prim, srcs, slots) in enumerate(program):
            if prim.kind not in LAYOUT or len(srcs) != 1 or srcs[0][0] == 0 or not all(s in views for s in slots):
                continue
            nbytes = sum(spec_of[s].nbytes for s in slots)
            if self.nbytes + nbytes <= KEEP_BYTES:
                self.nbytes += nbytes
                self.arg[j] = srcs[0][1] if srcs[0][0] == 1 else None
                for s in slots:
                    views[s] = np.empty(spec_of[s].shape, spec_of[s].dtype)
        self.args = sorted({i for i in self.arg.values() if i is not None})
        self.held: dict | None = None  # argument -> weak reference to the value the copies are of

    def values(self, datas: list) -> dict | None:
        """At a call's encoding: the values of the kept steps' arguments (held by the command)."""
        return {i: datas[i] for i in self.args} if self.arg else None

    def unchanged(self, now: dict | None) -> frozenset:
        """On the lane, before a call's steps run: the kept steps whose copies are of these values."""
        held, self.held = self.held, None  # (until the steps have run: an error leaves none valid)
        if held is None or now is None:
            return frozenset()
        return frozenset(j for j, i in self.arg.items() if i is None or (
            held[i]() is now[i] and not now[i].buffer.exported))

    def ran(self, now: dict | None) -> None:
        """After every step of a call ran: the copies are of its values."""
        if now is not None:
            self.held = {i: weakref.ref(d) for i, d in now.items()}


#: The most bytes of kept layout copies (``_Kept``) one CPU plan holds.
KEEP_BYTES = 16 << 20


def _plain(kern, prim):
    """A kernel that is not prepared, called as ``run(ins, outs)`` (CPU kernels do not read the lane)."""
    return lambda ins, outs: kern(None, prim, ins, outs)


class _Outputs:
    """A call's output buffers, as the lease of a CUDA graph's call gives them (``specs``,
    ``materialize`` for a compiled call's values, ``buffer_of`` for the plan cache)."""

    __slots__ = ("bufs", "specs")

    def __init__(self, bufs: dict):
        self.bufs = bufs
        self.specs = {slot: slot for slot in bufs}

    def buffer_of(self, spec: int) -> Buffer:
        return self.bufs[spec]

    def materialize(self, d) -> Buffer:
        b = d.buffer = self.bufs[d.spec]
        return b
