"""Plans: the steps of one traced signature of a compiled function, and their replay as commands.

A plan is what ``lf.compile`` (``laneflow/jit.py``) records from a trace: an ordered list of
:class:`Step` (a primitive, its stream, where each input comes from, the outputs it makes), built by
the same scheduling passes eager evaluation runs, so both run the same kernels. A replay binds the
arguments and submits the steps through the stream encoders directly: no graph building, shape
inference or dtype resolution. Intermediates live in a static arena (``graph/memory_plan.py``).

A backend may turn a whole plan into one executor (``Backend.graph_plan``: the CUDA backend makes a
multi-lane CUDA graph, ``backends/cuda/cudagraph/``); this module asks for it at the second call and
falls back to command replay when the backend cannot.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..errors import CompileError
from . import schedule as _sched
from .fusion import FusedNode
from .node import reads_view
from .grouping import Group
from .memory_plan import Value, plan_memory
from .views import FOLDS_INTO, LAYOUT

#: A source of a step's input: ("arg", i) the call's argument i, ("slot", k) the output of an earlier
#: step, ("const", value) a captured value evaluated once at tracing.
Source = tuple


class Spec:
    """Device, shape and dtype of one output of a step, and its size in bytes."""

    __slots__ = ("device", "shape", "dtype", "nbytes")

    def __init__(self, device, shape, dtype):
        self.device, self.shape, self.dtype = device, shape, dtype
        n = dtype.itemsize
        for s in shape:
            n *= s
        self.nbytes = n


@dataclass(slots=True)
class Step:
    """One command of a plan: ``prim`` on ``stream``, reading ``srcs`` (of shapes ``in_shapes``),
    writing the outputs ``specs``, which are the plan's slots ``first``, ``first + 1``, ..."""

    prim: Any
    stream: Any
    srcs: tuple
    specs: list
    first: int
    in_shapes: tuple = ()

    @property
    def slots(self) -> range:
        return range(self.first, self.first + len(self.specs))


class Plan:
    """The steps of one traced signature, and the static memory of its intermediates."""

    __slots__ = ("steps", "deps", "outputs", "treedef", "n_slots", "memory", "arena", "calls", "unit",
                 "unit_note", "lazy", "inplace", "donate", "donation_targets")

    def __init__(self, steps: list[Step], outputs: list, treedef: Any, n_slots: int, memory, deps,
                 inplace: dict | None = None, donate: tuple = ()):
        self.steps, self.outputs, self.n_slots, self.treedef = steps, outputs, n_slots, treedef
        #: slot -> donated argument whose buffer that slot's step writes in place (when the call donates it)
        self.inplace = inplace or {}
        self.donation_targets = frozenset(self.inplace.values())  # the arguments some step writes in place
        self.donate = donate  # the donated arguments (positions among the plan's arguments)
        # (slot, shape, dtype, stream, device) per output when every output is a distinct computed
        # value (a graph call then makes them in one tight loop), else None
        slots = [ref[1] for ref, *_ in outputs if ref[0] == "slot"]
        self.lazy = ([(ref[1], shape, dtype, st, st.device) for ref, shape, dtype, st in outputs]
                     if len(slots) == len(outputs) == len(set(slots)) and not self.inplace else None)
        self.deps = deps       # per step: the steps it reads from (step_deps)
        self.memory = memory   # MemoryPlan over intermediate slots, or None
        self.arena = None      # slot -> (region buffer, view), made at the first replay
        self.calls = 0
        self.unit = None       # the backend's whole-plan executor (a CUDA graph); False: none
        self.unit_note = ""    # why there is none

    def stats(self) -> dict:
        if self.unit:
            return self.unit.stats()
        return {"mode": "commands", "steps": len(self.steps), "note": self.unit_note,
                "arena_bytes": self.memory.arena_bytes if self.memory is not None else 0}


def build_plan(outputs: list, holders: list, out_tree: Any, donate: tuple = ()) -> Plan:
    """The plan computing ``outputs`` (graph values) from the placeholder values ``holders``. Values
    that do not depend on an argument are evaluated now, once, and captured. ``donate``: arguments
    whose buffers the call may write in place (``lf.compile(donate_argnums=...)``, :func:`donation`)."""
    places = {id(h): ("arg", i) for i, h in enumerate(holders)}
    order = _sched.toposort(outputs)
    depends: set[int] = set(places)
    for d in order:
        if d.prim.kind != "placeholder" and any(id(i) in depends for i in d.inputs):
            depends.add(id(d))
    # A layout op of a captured value (a weight's transpose) that a step reads stays in the plan, as in
    # eager evaluation, where it folds into its reader (graph/views.py) instead of being a copy made
    # once: compiled and eager then run the same kernels, bit for bit.
    for d in reversed(order):
        if id(d) in depends and (d.prim.kind in FOLDS_INTO or d.prim.kind in LAYOUT):
            for i in d.inputs:
                if id(i) not in depends and i.buffer is None and i.prim.kind in LAYOUT:
                    depends.add(id(i))
    _sched.schedule([d for d in order if id(d) not in depends]
                    + [i for d in order if id(d) in depends for i in d.inputs if id(i) not in depends])
    steps: list[Step] = []
    n_slots = 0
    todo = [d for d in order if id(d) in depends and d.prim.kind != "placeholder"]
    items = _sched.passes(todo)  # the same passes as eager evaluation, so the same kernels run
    for d in todo if items is None else items:
        if id(d) in places:
            continue  # a sibling produced it already
        srcs = []
        for i in d.inputs:
            p = places.get(id(i))
            if p is None:
                i.arrays += 1  # a captured value: the plan holds it, so it is never reused in place
                p = ("const", i)
            srcs.append(p)
        t = type(d)
        outs = d.members if t is Group else (d.root,) if t is FusedNode else (d.siblings or (d,))
        first = n_slots
        for o in outs:
            places[id(o)] = ("slot", n_slots)
            n_slots += 1
        steps.append(Step(d.prim, d.stream, tuple(srcs), [Spec(o.device, o.shape, o.dtype) for o in outs], first,
                          tuple(i.shape for i in d.inputs)))
    out_refs = []
    for o in outputs:
        p = places.get(id(o))
        if p is None:
            o.arrays += 1
            p = ("const", o)
        out_refs.append((p, o.shape, o.dtype, o.stream))
    inplace = donation(steps, out_refs, holders, donate)
    deps = step_deps(steps, inplace)
    return Plan(steps, out_refs, out_tree, n_slots, _memory_plan(steps, out_refs, deps, inplace), deps, inplace,
                tuple(donate))


def donation(steps: list[Step], out_refs: list, holders: list, donate) -> dict:
    """slot -> argument: for each donated argument, the step that may write its result into the
    argument's buffer: the last step reading the argument, reading it (once, as its first input, not
    through a view) with a primitive that ``donates``, making a value of the argument's shape and dtype.
    An argument returned as it is keeps its buffer (nothing is written into it)."""
    out: dict = {}
    returned = {ref for ref, *_ in out_refs}
    for i in donate:
        src = ("arg", i)
        if src in returned:
            continue
        readers = [j for j, st in enumerate(steps) if src in st.srcs]
        if not readers:
            continue
        st = steps[readers[-1]]
        h, spec = holders[i], st.specs[0]
        if (st.prim.donates and st.srcs[0] == src and st.srcs.count(src) == 1
                and not reads_view(st.prim, 0) and spec.shape == h.shape and spec.dtype == h.dtype):
            out[st.first] = i
    return out


def step_deps(steps: list[Step], inplace: dict | None = None) -> list[list[int]]:
    """Per step, the earlier steps whose outputs it reads (sorted): the plan's data dependencies. A
    step writing a donated argument in place (``inplace``) also follows the argument's other readers."""
    producer: dict[int, int] = {}
    deps: list[list[int]] = []
    writes = inplace or {}  # (the in-place slot is the first of its step)
    for j, step in enumerate(steps):
        ds = {producer[v] for kind, v in step.srcs if kind == "slot"}
        arg = writes.get(step.first) if writes else None
        if arg is not None:
            ds.update(k for k in range(j) if ("arg", arg) in steps[k].srcs)
        deps.append(sorted(ds))
        for slot in step.slots:
            producer[slot] = j
    return deps


def _memory_plan(steps: list[Step], out_refs: list, deps: list[list[int]], inplace: dict):
    """Regions for the intermediates (slots not returned, not written into a donated argument), when
    every step runs on one backend that can hand out views of raw memory; else None and each replay
    allocates afresh."""
    streams = {id(s.stream): s.stream for s in steps}
    devices = {st.device for st in streams.values()}
    backends = {type(st.backend) for st in streams.values()}
    if len(devices) != 1 or len(backends) != 1 or not next(iter(streams.values())).backend.plans_memory:
        return None
    returned = {ref[1] for ref, *_ in out_refs if ref[0] == "slot"}
    values: dict[int, Value] = {}
    for j, step in enumerate(steps):
        for kind, v in step.srcs:
            if kind == "slot" and v in values:
                values[v].users.append(j)
        for slot, spec in zip(step.slots, step.specs):
            if slot not in returned and slot not in inplace:
                values[slot] = Value(spec.nbytes, j)
    return plan_memory(values, deps) if values else None


#: ``LANEFLOW_GRAPH=0`` turns whole-plan executors (CUDA graphs) off; ``strict`` makes a plan that
#: cannot become one raise instead of replaying its commands (used by the GPU tests).
GRAPH_MODE = os.environ.get("LANEFLOW_GRAPH", "1")


def executor(plan: Plan, stream: Any):
    """The backend's executor for the whole plan, made at the second call (the first warms kernels,
    library handles and the arena through ordinary commands); False when there is none."""
    unit = plan.unit
    if unit is None and plan.calls > 1:
        backend = stream.backend
        if GRAPH_MODE == "0" or not plan.steps:
            unit = False
            plan.unit_note = "off or empty"
        elif any(step.prim.lane_for is not None and not step.prim.capturable for step in plan.steps):
            # collectives an executor cannot hold (MPI's run on the host) run as commands on their
            # group's communication lane, in call order
            unit = False
            plan.unit_note = "collectives run as commands on their communication lane"
        elif len({step.stream.device for step in plan.steps}) > 1:
            # a CUDA graph is captured on one device's streams; steps on several (GPUs, or a GPU and
            # the CPU) keep their commands: the encoder's fences across devices, no host wait
            unit = False
            plan.unit_note = "steps on several devices run as commands"
        else:
            try:
                unit = backend.graph_plan(plan, stream)
                if unit is None:
                    unit, plan.unit_note = False, "no whole-plan executor on this backend"
            except Exception as e:  # noqa: BLE001 - any reason: replay the commands instead
                if GRAPH_MODE == "strict":
                    raise
                unit, plan.unit_note = False, f"{type(e).__name__}: {e}"
        plan.unit = unit
    return unit


def replay_commands(plan: Plan, datas: list, slots: list, prims: dict | None = None,
                    donated: frozenset | set = frozenset()) -> None:
    """Submit the plan's steps through the encoders, intermediates in the plan's regions when it has a
    memory plan (else each output is allocated afresh). Each region is one buffer, so the encoder orders
    a region's reuse after its earlier readers, within a call and across calls. ``prims``: step index ->
    the primitive to run instead of the step's own (a copy holding this call's scalar values).
    ``donated``: arguments this call gives up: their in-place steps (``plan.inplace``) write into them."""
    steps = plan.steps
    arena = plan.arena
    if arena is None and plan.memory is None:
        arena = plan.arena = {}
    elif arena is None:
        mem = plan.memory
        backend, device = steps[0].stream.backend, steps[0].stream.device
        regions = [backend.allocate_region(device, n, "compile arena") for n in mem.region_bytes]
        arena = {}
        for step in steps:
            for slot, spec in zip(step.slots, step.specs):
                r = mem.region_of.get(slot)
                if r is not None:
                    arena[slot] = (regions[r], backend.view(regions[r], spec.shape, spec.dtype))
        plan.arena = arena
    views: list = [None] * len(slots)
    for j, step in enumerate(steps):
        prim, stream = step.prim, step.stream
        if prims is not None:
            prim = prims.get(j, prim)
        in_bufs, in_data = [], []
        for kind, v in step.srcs:
            if kind == "slot":
                b = slots[v]
                in_bufs.append(b)
                in_data.append(views[v] if views[v] is not None else b.data)
            else:
                b = datas[v].buffer if kind == "arg" else v.buffer
                in_bufs.append(b)
                in_data.append(b.data)
        out_bufs, out_data = [], []
        for slot, spec in zip(step.slots, step.specs):
            placed = arena.get(slot)
            if donated and plan.inplace.get(slot, -1) in donated:
                b = datas[plan.inplace[slot]].buffer  # the donated argument: written in place
                out_bufs.append(b)
                out_data.append(b.data)
            elif placed is None:
                b = stream.backend.allocate(spec.device, spec.shape, spec.dtype, prim.name)
                out_bufs.append(b)
                out_data.append(b.data)
            else:
                out_bufs.append(placed[0])
                out_data.append(placed[1])
                views[slot] = placed[1]
            slots[slot] = out_bufs[-1]
        if stream._closed:
            raise CompileError(f"{prim.name}: its stream {stream} was closed; the compiled function cannot run on it")
        _sched.encode_call(prim, stream, in_bufs, in_data, out_bufs, out_data)
