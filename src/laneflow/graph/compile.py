"""``lf.compile``: trace a function once per input signature, then replay its command list.

Tracing runs ``fn`` on placeholder arrays, which builds the lazy graph without running anything.
Every node that does not depend on an argument (constants, captured arrays) is evaluated once and
kept; the rest becomes a *plan*: an ordered list of steps (primitive, stream, where each input comes
from). A call binds its arguments and submits the steps through the stream encoders directly, with
no graph building, shape inference or dtype resolution. Outputs get fresh buffers on every call, so
they stay valid after the next call.

A backend may turn a plan into something faster (the CUDA backend: one multi-lane CUDA graph).

What cannot be compiled raises :class:`CompileError` naming the op: reading values on the host inside
``fn`` (``item``, ``tolist``, ``np.asarray``, ``lf.eval``), assigning into an argument
(``x[i] = v`` on a parameter; return the new value instead), and random draws without ``key=`` (the
key would be drawn once, at tracing; pass keys as arguments). Static (non-array) arguments are
compared by type and value: ``1``, ``1.0`` and ``True`` trace separately, as do ``0.0`` and ``-0.0``.
laneflow has no data-dependent shapes (boolean-mask indexing with an lf.Array is refused everywhere),
so every traced shape is static.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any, Callable

import numpy as np

from ..errors import LaneflowError
from .fusion import FusedNode
from .grouping import Group
from .memory_plan import Value, plan_memory
from .node import ArrayData, LazyData, Primitive
from . import schedule as _sched

_tracing = threading.local()


class CompileError(LaneflowError):
    """``fn`` does something a traced function cannot do; the message names the op and the fix."""


class Placeholder(Primitive):
    """An argument of a function being traced: has a shape and dtype, never a value."""

    kind = "placeholder"

    def __init__(self, index: int, fn_name: str):
        super().__init__(f"argument {index}")
        self.index, self.fn_name = index, fn_name

    def error(self) -> "CompileError":
        return CompileError(f"compile: {self.fn_name} needs the value of {self.name} while being traced (a host read such "
                "as item(), tolist(), np.asarray() or lf.eval inside the function); move it out of the "
                "compiled function or pass the value as a static (non-array) argument")


def tracing() -> bool:
    return getattr(_tracing, "depth", 0) > 0


#: How many traces run right now, in any thread. Arrays note their creation only while one runs, so
#: outside compile this costs one global read per array.
ACTIVE = [0]


def note_created(array: Any) -> None:
    created = getattr(_tracing, "created", None)
    if created is not None:
        created.add(id(array))


def check_rebind(array: Any) -> None:
    """Refuse ``x[...] = v`` / ``x += v`` inside a traced function on an array it did not create."""
    created = getattr(_tracing, "created", None)
    if created is None or id(array) in created:
        return
    name = _tracing.fn_name
    i = _tracing.params.get(id(array))
    if i is not None:
        raise CompileError(f"compile: {name} assigns into its argument {i} (x[...] = v); compiled functions "
                           "cannot change their arguments: return the new value instead")
    raise CompileError(f"compile: {name} assigns into an array it did not create (a captured array: x[...] = v "
                       "or x += v); that change would happen once, while tracing, not on every call: pass the "
                       "array as an argument and return its new value")


class _Plan:
    """The steps of one traced signature, and the static memory of its intermediates."""

    __slots__ = ("steps", "deps", "outputs", "treedef", "n_slots", "memory", "arena", "calls", "unit",
                 "unit_note", "lazy")

    def __init__(self, steps, outputs, treedef, n_slots, memory, deps):
        self.steps, self.outputs, self.n_slots = steps, outputs, n_slots
        if treedef == (list, tuple([_LEAF] * len(outputs))):  # a flat list: returned as built
            treedef = _FLAT_LIST.setdefault(len(outputs), treedef)
        self.treedef = treedef
        # (slot, shape, dtype, stream, device) per output when every output is a distinct computed
        # value (a graph call then makes them in one tight loop), else None
        slots = [ref[1] for ref, *_ in outputs if ref[0] == "slot"]
        self.lazy = ([(ref[1], shape, dtype, st, st.device) for ref, shape, dtype, st in outputs]
                     if len(slots) == len(outputs) == len(set(slots)) else None)
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


#: number of outputs -> the one treedef object of a flat list of that many arrays (compared by identity)
_FLAT_LIST: dict = {}


class _Static:
    """A static (non-array) leaf as a cache key: equal only to a value of the same type that is
    equal to it, floats compared bit for bit. ``1``, ``1.0`` and ``True`` are equal in Python but
    trace differently (the result dtype depends on the type), as do ``0.0`` and ``-0.0``; a NaN
    matches itself."""

    __slots__ = ("value", "key")

    def __init__(self, value: Any):
        self.value = value
        if isinstance(value, (float, np.floating)):
            self.key = (type(value), float(value).hex())
        else:
            self.key = (type(value), value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Static) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)


def _flatten(tree: Any, is_leaf: Callable[[Any], bool]) -> tuple[list, Any]:
    """Leaves and a structure description of nested lists, tuples and dicts."""
    leaves: list = []
    return leaves, _walk(tree, is_leaf, leaves)


# Module-level recursion, not nested closures: a recursive closure is a reference cycle, which would
# keep every leaf (a call's outputs, say) alive until the garbage collector runs.
_LEAF = ("leaf",)
_lazy: tuple = ()


def _imports() -> tuple:
    """(Array, current_stream), imported once (this module is imported before them)."""
    global _lazy
    if not _lazy:
        from ..array import Array
        from ..streams import current_stream

        _lazy = (Array, current_stream)
    return _lazy


def _is_array(x: Any) -> bool:
    Array = _imports()[0]
    return x.__class__ is Array or isinstance(x, Array)


def _walk(x: Any, is_leaf: Callable[[Any], bool], leaves: list) -> Any:
    if is_leaf(x):
        leaves.append(x)
        return _LEAF
    if isinstance(x, (list, tuple)):
        parts = []
        for v in x:  # a loop, not a generator: calls pass tens of arrays
            if is_leaf(v):
                leaves.append(v)
                parts.append(_LEAF)
            else:
                parts.append(_walk(v, is_leaf, leaves))
        return (type(x), tuple(parts))
    if isinstance(x, dict):
        return (dict, tuple((k, _walk(v, is_leaf, leaves)) for k, v in x.items()))
    return ("static", _Static(x))


def _unflatten(treedef: Any, leaves: list) -> Any:
    return _build(treedef, iter(leaves))


def _build(t: Any, it: Any) -> Any:
    tag = t[0]
    if tag == "leaf":
        return next(it)
    if tag == "static":
        return t[1].value
    if tag is dict:
        return {k: _build(v, it) for k, v in t[1]}
    parts = [next(it) if v is _LEAF else _build(v, it) for v in t[1]]
    if tag is list:
        return parts
    return tag(*parts) if hasattr(tag, "_fields") else tag(parts)  # a namedtuple takes fields


class CompiledFunction:
    """What :func:`compile` returns. Call it like ``fn``; ``cache_size`` counts traced signatures."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self._plans: dict = {}
        self._flat: dict = {}  # number of positional arrays -> the structure of (args, {})
        self._last: tuple | None = None  # (stream, argument values, plan) of the last call
        functools.update_wrapper(self, fn)

    @property
    def cache_size(self) -> int:
        return len(self._plans)

    def stats(self) -> list[dict]:
        """Per traced signature: how calls run (``"cuda graph"`` or ``"commands"``), steps, graph nodes
        and branches, captures, arena bytes; ``note`` says why a plan is not a graph."""
        return [p.stats() for p in self._plans.values()]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        Array, current_stream = _imports()
        if ACTIVE[0] and tracing():
            return self.fn(*args, **kwargs)  # nested compile: inline into the outer trace
        stream = current_stream()
        datas = None
        simple = False
        if not kwargs:  # the common call: arrays only, positional
            datas = [a._data for a in args if a.__class__ is Array]
            if len(datas) == len(args):
                last = self._last
                # the very values of the last call (weights, a kept input): the same plan, and all of
                # them evaluated already (values are immutable; ArrayData compares by identity)
                if last is not None and last[0] is stream and last[1] == datas:
                    return _replay(last[2], last[1], stream, True)  # the same list: the plan knows it
                last = None  # (a local would keep the last call's values alive through this call)
                simple = True
                leaves = list(args)
                treedef = self._flat.get(len(args))
                if treedef is None:
                    treedef = self._flat[len(args)] = _flatten((args, kwargs), _is_array)[1]
            else:
                datas = None
        if datas is None:
            leaves, treedef = _flatten((args, kwargs), _is_array)
            datas = [a._data for a in leaves]
        dev = stream.device  # the stream id is in the key, so None can stand for its device (cheaper to hash)
        key = (treedef, stream.id,
               tuple([(d.shape, d.dtype, None if d.device is dev or d.device == dev else d.device) for d in datas]))
        try:
            plan = self._plans.get(key)
        except TypeError:
            raise CompileError(f"compile: {self.__name__}: non-array arguments must be hashable (they are "
                               "static: a new value traces again)") from None
        if plan is None:
            plan = self._trace(leaves, treedef)
            self._plans[key] = plan
        self._last = None  # the last call's values: not held while this call picks an output set
        out = _replay(plan, datas, stream, False)
        # Keeps the last call's argument values (their buffers the plan keeps anyway, as the graph's
        # bound arguments) so that a call with the same values skips the signature. Only for calls
        # of arrays alone: a static argument is part of the signature, not of the values.
        self._last = (stream, datas, plan) if simple else None
        return out

    def _trace(self, leaves: list, treedef: Any) -> _Plan:
        from ..array import Array

        name = getattr(self.fn, "__name__", "function")
        params = [Array._wrap(ArrayData(a.shape, a.dtype, a._data.stream, Placeholder(i, name)))
                  for i, a in enumerate(leaves)]
        holders = [p._data for p in params]
        args, kwargs = _unflatten(treedef, params)
        _tracing.created, _tracing.fn_name = set(), name
        _tracing.params = {id(p): i for i, p in enumerate(params)}
        _tracing.depth = getattr(_tracing, "depth", 0) + 1
        ACTIVE[0] += 1
        try:
            out = self.fn(*args, **kwargs)
        finally:
            ACTIVE[0] -= 1
            _tracing.depth -= 1
            _tracing.created = _tracing.params = None
        for i, (p, d) in enumerate(zip(params, holders)):
            if p._data is not d:
                raise CompileError(f"compile: {name} assigns into its argument {i} (x[...] = v); compiled "
                                   "functions cannot change their arguments: return the new value instead")
        outs, out_tree = _flatten(out, lambda x: isinstance(x, Array))
        with _sched.LOCK:  # the captured graph may be evaluated by another thread meanwhile
            return _build_plan([o._data for o in outs], holders, out_tree)


def _build_plan(outputs: list, holders: list, out_tree: Any) -> _Plan:
    places = {id(h): ("arg", i) for i, h in enumerate(holders)}
    order = _sched.toposort(outputs)
    depends: set[int] = set(places)
    for d in order:
        if d.prim.kind != "placeholder" and any(id(i) in depends for i in d.inputs):
            depends.add(id(d))
    # Everything that does not depend on an argument is computed once, now, and captured.
    _sched.schedule([d for d in order if id(d) not in depends]
                    + [i for d in order if id(d) in depends for i in d.inputs if id(i) not in depends])
    steps = []
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
        steps.append((d.prim, d.stream, tuple(srcs), [_Spec(o.device, o.shape, o.dtype) for o in outs], first))
    out_refs = []
    for o in outputs:
        p = places.get(id(o))
        if p is None:
            o.arrays += 1
            p = ("const", o)
        out_refs.append((p, o.shape, o.dtype, o.stream))
    deps = step_deps(steps)
    return _Plan(steps, out_refs, out_tree, n_slots, _memory_plan(steps, out_refs, deps), deps)


def step_deps(steps: list) -> list[list[int]]:
    """Per step, the earlier steps whose outputs it reads (sorted): the plan's data dependencies."""
    producer: dict[int, int] = {}
    deps: list[list[int]] = []
    for j, (_, _, srcs, specs, first) in enumerate(steps):
        deps.append(sorted({producer[v] for kind, v in srcs if kind == "slot"}))
        for k in range(len(specs)):
            producer[first + k] = j
    return deps


def _memory_plan(steps: list, out_refs: list, deps: list[list[int]]):
    """Regions for the intermediates (slots not returned), when every step runs on one backend that
    can hand out views of raw memory; else None and each replay allocates afresh."""
    streams = {id(st): st for _, st, _, _, _ in steps}
    devices = {st.device for st in streams.values()}
    backends = {type(st.backend) for st in streams.values()}
    if len(devices) != 1 or len(backends) != 1 or not hasattr(next(iter(streams.values())).backend, "view"):
        return None
    returned = {ref[1] for ref, *_ in out_refs if ref[0] == "slot"}
    values: dict[int, Value] = {}
    for j, (_, _, srcs, specs, first) in enumerate(steps):
        for kind, v in srcs:
            if kind == "slot" and v in values:
                values[v].users.append(j)
        for k, spec in enumerate(specs):
            if first + k not in returned:
                values[first + k] = Value(spec.nbytes, j)
    return plan_memory(values, deps) if values else None


class _Spec:
    __slots__ = ("device", "shape", "dtype", "nbytes")

    def __init__(self, device, shape, dtype):
        self.device, self.shape, self.dtype = device, shape, dtype
        n = dtype.itemsize
        for s in shape:
            n *= s
        self.nbytes = n


#: ``LANEFLOW_GRAPH=0`` turns whole-plan executors (CUDA graphs) off; ``strict`` makes a plan that
#: cannot become one raise instead of replaying its commands (used by the GPU tests).
_GRAPH_MODE = os.environ.get("LANEFLOW_GRAPH", "1")


def _unit(plan: _Plan, stream: Any):
    """The backend's executor for the whole plan, made at the second call (the first warms kernels,
    library handles and the arena through ordinary commands)."""
    unit = plan.unit
    if unit is None and plan.calls > 1:
        make = getattr(stream.backend, "graph_plan", None)
        if make is None or _GRAPH_MODE == "0" or not plan.steps:
            unit = False
            plan.unit_note = "no whole-plan executor on this backend" if make is None else "off or empty"
        else:
            try:
                unit = make(plan, stream)
            except Exception as e:  # noqa: BLE001 - any reason: replay the commands instead
                if _GRAPH_MODE == "strict":
                    raise
                unit, plan.unit_note = False, f"{type(e).__name__}: {e}"
        plan.unit = unit
    return unit


def _replay(plan: _Plan, datas: list, stream: Any, evaluated: bool) -> Any:
    """One call: ``datas`` are the argument values (``evaluated``: known to be, skip the check)."""
    Array = _imports()[0]

    with _sched.LOCK:  # read the bindings where no other thread can reuse their buffers in place
        if stream._closed:
            raise CompileError(f"compile: the current stream {stream} was closed; call the function on an open "
                               "stream")
        if not evaluated:
            pending = [d for d in datas if d.buffer is None]
            if pending:
                _sched.schedule(pending)
        slots: list | None = None
        plan.calls += 1
        unit = plan.unit if plan.unit is not None or plan.calls < 2 else _unit(plan, stream)
        lease = None
        if unit:
            try:
                lease = unit.run(datas, stream)
                if lease is None:
                    unit = None  # this call runs as commands (the unit said why)
            except Exception as e:  # noqa: BLE001 - capture failed: replay the commands from now on
                plan.unit, plan.unit_note = False, f"{type(e).__name__}: {e}"
                if _GRAPH_MODE == "strict":
                    raise
                unit = False
        if not unit:
            slots = [None] * plan.n_slots
            _replay_commands(plan, datas, slots)
        results = []
        new_a = Array.__new__
        lazy = plan.lazy
        if lease is not None and lazy is not None:
            # The common graph call: every output a distinct value of the graph. LazyData and Array
            # made inline (tens of outputs per call; not tracing, so no note_created); prim, inputs
            # and siblings are LazyData's class attributes, the buffer slot is filled on first use.
            specs, new_l = lease.specs, LazyData.__new__
            for slot, shape, dtype, st, device in lazy:
                d = new_l(LazyData)
                d.lease, d.spec, d.shape, d.dtype, d.stream, d.device, d.users, d.arrays = (
                    lease, specs[slot], shape, dtype, st, device, 0, 1)
                a = new_a(Array)
                a._data = d
                results.append(a)
        else:
            made: dict = {}  # slot -> its value: an output returned twice is one value, never two sharing a buffer
            new_d = ArrayData.__new__
            for ref, shape, dtype, st in plan.outputs:
                kind = ref[0]
                if kind == "slot":
                    d = made.get(ref[1])
                    if d is None:
                        if lease is not None:  # a graph's value: its buffer is made on first use
                            d = made[ref[1]] = LazyData.__new__(LazyData)
                            d.lease, d.spec = lease, lease.specs[ref[1]]
                        else:  # ArrayData.__init__ inlined: every slot of an evaluated value
                            d = made[ref[1]] = new_d(ArrayData)
                            d.buffer, d.prim, d.inputs, d.siblings = slots[ref[1]], None, (), None
                        d.shape, d.dtype, d.stream, d.device, d.users, d.arrays = shape, dtype, st, st.device, 0, 0
                else:
                    d = datas[ref[1]] if kind == "arg" else ref[1]
                a = new_a(Array)
                a._data = d
                d.arrays += 1
                results.append(a)
    t = plan.treedef
    if t is _FLAT_LIST.get(len(results)):
        return results
    return _unflatten(t, results)


def _replay_commands(plan: _Plan, datas: list, slots: list) -> None:
    """Submit the plan's steps through the encoders, intermediates in the plan's regions when it has a
    memory plan (else each output is allocated afresh). Each region is one buffer, so the encoder orders
    a region's reuse after its earlier readers, within a call and across calls."""
    steps = plan.steps
    arena = plan.arena
    if arena is None and plan.memory is None:
        arena = plan.arena = {}
    elif arena is None:
        mem = plan.memory
        backend = steps[0][1].backend
        device = steps[0][1].device
        regions = [backend.allocate_region(device, n, "compile arena") for n in mem.region_bytes]
        arena = {}
        for _, _, _, specs, first in steps:
            for k, spec in enumerate(specs):
                r = mem.region_of.get(first + k)
                if r is not None:
                    arena[first + k] = (regions[r], backend.view(regions[r], spec.shape, spec.dtype))
        plan.arena = arena
    views: list = [None] * len(slots)
    for prim, stream, srcs, specs, first in steps:
        in_bufs, in_data = [], []
        for kind, v in srcs:
            if kind == "slot":
                b = slots[v]
                in_bufs.append(b)
                in_data.append(views[v] if views[v] is not None else b.data)
            else:
                b = datas[v].buffer if kind == "arg" else v.buffer
                in_bufs.append(b)
                in_data.append(b.data)
        out_bufs, out_data = [], []
        for k, spec in enumerate(specs):
            slot = first + k
            placed = arena.get(slot)
            if placed is None:
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


def compile(fn: Callable) -> CompiledFunction:  # noqa: A001 - the public name
    """Trace ``fn`` once per input signature (shapes, dtypes, devices, static arguments, current
    stream) and replay the recorded commands on later calls. Usable as a decorator.

    >>> @lf.compile
    ... def step(x, w):
    ...     return lf.tanh(x @ w)
    """
    if not callable(fn):
        raise TypeError(f"compile: expected a callable, got {type(fn).__name__}")
    return CompiledFunction(fn)
