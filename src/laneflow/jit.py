"""``lf.compile``: trace a function once per input signature, then replay its plan (the front end).

Tracing runs ``fn`` on placeholder arrays, which builds the lazy graph without running anything.
Every node that does not depend on an argument (constants, captured arrays) is evaluated once and
kept; the rest becomes a *plan*: an ordered list of steps (primitive, stream, where each input comes
from). A call binds its arguments and submits the steps through the stream encoders directly, with
no graph building, shape inference or dtype resolution. Outputs get fresh buffers on every call, so
they stay valid after the next call.

The plan and its command replay are ``graph/plan.py``; a backend may turn a plan into something
faster (the CUDA backend: one multi-lane CUDA graph, ``backends/cuda/cudagraph/``). The tracing state
that arrays consult is ``graph/tracer.py``.

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
import operator
from typing import Any, Callable

import numpy as np

from .array import Array
from .defaults import current_stream
from .errors import CompileError
from .graph import eval_cache
from .graph import schedule as _sched
from .graph import tracer
from .graph.node import ArrayData, LazyData
from .graph import plan as _plan
from .graph.plan import Plan, build_plan, executor, replay_commands
from .graph.tracer import Placeholder

__all__ = ["CompileError", "CompiledFunction", "compile"]

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
_DATA = operator.attrgetter("_data")
_ALL_LEAVES: dict = {}  # (dict, keys) or (list/tuple, length) -> the structure of a container of arrays alone


def _is_array(x: Any) -> bool:
    return x.__class__ is Array or isinstance(x, Array)


def _walk(x: Any, is_leaf: Callable[[Any], bool], leaves: list) -> Any:
    if is_leaf(x):
        leaves.append(x)
        return _LEAF
    cls = x.__class__
    if is_leaf is _is_array and (cls is dict or cls is list or cls is tuple):
        # the common containers of arrays alone (a model's weights, a KV cache): the structure this
        # function would build, remembered per keys or length (a decode step passes ~150 weights)
        vals = x.values() if cls is dict else x
        for v in vals:
            if v.__class__ is not Array:
                break
        else:
            key = (cls, tuple(x)) if cls is dict else (cls, len(x))
            tdef = _ALL_LEAVES.get(key)
            if tdef is None:
                tdef = (dict, tuple((k, _LEAF) for k in x)) if cls is dict else (cls, (_LEAF,) * len(x))
                if len(_ALL_LEAVES) < 1024:
                    _ALL_LEAVES[key] = tdef
            leaves.extend(vals)
            return tdef
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


class _Donated:
    """The value of an Array given up to a compiled function (``donate_argnums``): any use raises."""

    __slots__ = ("arrays", "fn")

    def __init__(self, fn: str):
        self.arrays, self.fn = 1, fn

    def __getattr__(self, name: str) -> Any:
        raise CompileError(f"this array was donated to the compiled function {self.fn} (donate_argnums) and its "
                           "buffer may have been reused: use the value that call returned instead")


def _donatable(d: ArrayData) -> bool:
    """Whether a call may write into ``d``'s buffer: an evaluated value that only the donated Array
    holds, that no pending op reads, whose memory is laneflow's alone and whose command did not fail.
    (Deferred device checks it carries pass on to the values computed from it, as for any read.)"""
    if d.arrays != 1 or d.users or d.siblings is not None:
        return False
    b = d.buffer
    return b is not None and not b.exported and b.error is None


class CompiledFunction:
    """What :func:`compile` returns. Call it like ``fn``; ``cache_size`` counts traced signatures."""

    def __init__(self, fn: Callable, donate_argnums: tuple = ()):
        self.fn = fn
        self.donate_argnums = donate_argnums
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
        if tracer.ACTIVE[0] and tracer.tracing():
            return self.fn(*args, **kwargs)  # nested compile: inline into the outer trace
        if self.donate_argnums:
            return self._call_donating(args, kwargs)
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
        plan = self._plan(stream, leaves, treedef, datas)
        self._last = None  # the last call's values: not held while this call picks an output set
        out = _replay(plan, datas, stream, False)
        # Keeps the last call's argument values (their buffers the plan keeps anyway, as the graph's
        # bound arguments) so that a call with the same values skips the signature. Only for calls
        # of arrays alone: a static argument is part of the signature, not of the values.
        self._last = (stream, datas, plan) if simple else None
        return out

    def _plan(self, stream: Any, leaves: list, treedef: Any, datas: list,
              donate_of: Callable[[], tuple] | None = None) -> Plan:
        """The plan of this signature (argument structure, shapes, dtypes, devices, stream), traced now
        if it is new (``donate_of()``: the donated leaf positions, asked only then)."""
        dev = stream.device  # the stream id is in the key, so None can stand for its device (cheaper to hash)
        key = (treedef, stream.id,
               tuple([(d.shape, d.dtype, None if d.device is dev or d.device == dev else d.device) for d in datas]))
        try:
            plan = self._plans.get(key)
        except TypeError:
            raise CompileError(f"compile: {self.__name__}: non-array arguments must be hashable (they are "
                               "static: a new value traces again)") from None
        if plan is None:
            plan = self._plans[key] = self._trace(leaves, treedef, donate_of() if donate_of is not None else ())
        return plan

    def _call_donating(self, args: tuple, kwargs: dict) -> Any:
        """A call that gives up the arrays of ``donate_argnums``: steps that may write in place into
        them do (``graph/plan.py: donation``), and the given Arrays are unusable afterwards."""
        stream = current_stream()
        leaves, treedef = _flatten((args, kwargs), _is_array)
        datas = list(map(_DATA, leaves))

        def given_of() -> tuple:  # a new signature: the donated leaf positions, checked before tracing
            given, k = [], 0
            for j, a in enumerate(args):
                n = len(_flatten(a, _is_array)[0])
                if j in self.donate_argnums:
                    given.extend(range(k, k + n))
                k += n
            self._check_donated(leaves, given)
            return tuple(given)

        plan = self._plan(stream, leaves, treedef, datas, given_of)
        given = plan.donate  # (the plan of a structure knows its donated positions: no second lookup)
        self._check_donated(leaves, given)
        with _sched.LOCK:
            pending = [d for d in datas if d.buffer is None]
            if pending:
                eval_cache.schedule(pending)
            targets = plan.donation_targets
            donated = frozenset(i for i in given if i in targets and _donatable(datas[i]))
        out = _replay(plan, datas, stream, True, donated)
        name = self.__name__
        for i in given:  # the given Arrays let go of their values, whatever happened to them
            a = leaves[i]
            old, a._data = a._data, _Donated(name)
            old.arrays -= 1
        return out

    def _check_donated(self, leaves: list, given) -> None:
        ids = {id(leaves[i]) for i in given}
        if len(ids) != len(given) or sum(map(ids.__contains__, map(id, leaves))) != len(given):
            raise ValueError(f"compile: {self.__name__}: a donated array is passed twice; donate it once and pass "
                             "no other reference to it")

    def _trace(self, leaves: list, treedef: Any, donate: tuple = ()) -> Plan:
        name = getattr(self.fn, "__name__", "function")
        params = [Array._wrap(ArrayData(a.shape, a.dtype, a._data.stream, Placeholder(i, name)))
                  for i, a in enumerate(leaves)]
        holders = [p._data for p in params]
        args, kwargs = _unflatten(treedef, params)
        with tracer.Trace(name, params):
            out = self.fn(*args, **kwargs)
        for i, (p, d) in enumerate(zip(params, holders)):
            if p._data is not d:
                raise CompileError(f"compile: {name} assigns into its argument {i} (x[...] = v); compiled "
                                   "functions cannot change their arguments: return the new value instead")
        outs, out_tree = _flatten(out, lambda x: isinstance(x, Array))
        if out_tree == (list, tuple([_LEAF] * len(outs))):  # a flat list: returned as built
            out_tree = _FLAT_LIST.setdefault(len(outs), out_tree)
        with _sched.LOCK:  # the captured graph may be evaluated by another thread meanwhile
            return build_plan([o._data for o in outs], holders, out_tree, donate)


def _replay(plan: Plan, datas: list, stream: Any, evaluated: bool, donated: frozenset = frozenset()) -> Any:
    """One call: ``datas`` are the argument values (``evaluated``: known to be, skip the check);
    ``donated``: the arguments whose buffers this call may write in place."""
    with _sched.LOCK:  # read the bindings where no other thread can reuse their buffers in place
        if stream._closed:
            raise CompileError(f"compile: the current stream {stream} was closed; call the function on an open "
                               "stream")
        if not evaluated:
            pending = [d for d in datas if d.buffer is None]
            if pending:
                eval_cache.schedule(pending)
        slots: list | None = None
        plan.calls += 1
        unit = plan.unit if plan.unit is not None or plan.calls < 2 else executor(plan, stream)
        lease = None
        if unit:
            try:
                lease = unit.run(datas, stream, donated) if plan.inplace else unit.run(datas, stream)
                if lease is None:
                    unit = None  # this call runs as commands (the unit said why)
            except Exception as e:  # noqa: BLE001 - capture failed: replay the commands from now on
                plan.unit, plan.unit_note = False, f"{type(e).__name__}: {e}"
                if _plan.GRAPH_MODE == "strict":
                    raise
                unit = False
        if not unit:
            slots = [None] * plan.n_slots
            replay_commands(plan, datas, slots, None, donated)
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
                        if lease is not None and ref[1] in plan.inplace:  # a graph's value in a donated buffer
                            d = made[ref[1]] = new_d(ArrayData)
                            d.buffer, d.prim, d.inputs, d.siblings = unit.inplace_buffer(ref[1]), None, (), None
                        elif lease is not None:  # a graph's value: its buffer is made on first use
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
            if plan.inplace and plan.unit:
                for slot, d in made.items():  # who holds a graph's state buffers now
                    if slot in plan.inplace:
                        plan.unit.own(slot, d)
    t = plan.treedef
    if t is _FLAT_LIST.get(len(results)):
        return results
    return _unflatten(t, results)


def compile(fn: Callable | None = None, *, donate_argnums: int | tuple = ()) -> Any:  # noqa: A001
    """Trace ``fn`` once per input signature (shapes, dtypes, devices, static arguments, current
    stream) and replay the recorded commands on later calls. Usable as a decorator.

    ``donate_argnums``: positional arguments (arrays, or lists/tuples/dicts of arrays) the caller gives
    up. A step that computes a new value of such an argument's shape and dtype from it as its last
    reader (``dynamic_update_slice``, ``setitem``'s value, an elementwise op) writes into the
    argument's buffer: a KV cache updated each step is not copied. The given Arrays cannot be used
    after the call (a clear error says so); use the returned values. An argument some other Array or
    pending op still holds is not written in place (the call copies, as without donation).

    Several devices: a function whose steps run on more than one device (arrays on ``gpu:0`` and
    ``gpu:1``, or a GPU and the CPU) is traced as usual and every call replays its commands, with the
    fences eager code gets (a peer copy on the consumer's lane after an event of the producer's, no
    host wait). It never becomes a CUDA graph, which is captured on one device's streams;
    ``f.stats()`` says so in its ``note``.

    >>> @lf.compile
    ... def step(x, w):
    ...     return lf.tanh(x @ w)
    >>> step2 = lf.compile(decode_step, donate_argnums=(2, 3))   # the caches
    """
    if isinstance(donate_argnums, int) and not isinstance(donate_argnums, bool):
        donate_argnums = (donate_argnums,)
    if (not isinstance(donate_argnums, (tuple, list))
            or any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in donate_argnums)):
        raise TypeError(f"compile: donate_argnums must be a non-negative int or a tuple of them, got {donate_argnums!r}")
    if fn is None:
        return lambda f: compile(f, donate_argnums=donate_argnums)
    if not callable(fn):
        raise TypeError(f"compile: expected a callable, got {type(fn).__name__}")
    return CompiledFunction(fn, tuple(sorted(set(donate_argnums))))
