"""Trace-guided replay, the op side: ``taped(op)`` makes a public op recordable and replayable.

``graph/tape.py`` says when a step is recorded and when a tape is replayed. Here: a recorder runs each
call as usual and notes it (:class:`Call`); a replayer answers a call that matches the tape's next one
by making the recorded nodes on the call's arrays, skipping the op's own argument checks and shape and
dtype inference. A call matches when it is the same op with the same static arguments (equal values of
the same types, ``-0.0`` apart from ``0.0``), on the same stream, and each array argument is the
result the tape says (an earlier call's, by identity) or, where the tape has a leaf, an evaluated
array of the same shape, dtype and device (leaves that were distinct must be distinct again). What an
op builds depends on nothing else (the ops are pure: random numbers, in-place updates, host reads and
data-dependent shapes are not taped), so the nodes are those the op would make.

Only top-level calls are taped: an op that calls other ops inside is one call of the tape.
"""

from __future__ import annotations

from operator import attrgetter, is_
from threading import get_ident
from typing import Any, Callable

from ..array import Array
from ..defaults import _stack, current_stream
from ..graph import early as _early
from ..graph import eval_templates as _templates
from ..graph import speculate as _speculate
from ..graph import tape as _g
from ..graph import tracer as _tracer
from ..graph.node import ArrayData
from . import tape_steps as _steps

_STATE = _g.STATE
_tracing = _tracer.ACTIVE
_watch = _speculate.WATCH
_new = object.__new__
_MISS = _steps.MISS
_PRIM = attrgetter("prim")
_USERS = attrgetter("users")
_ARRAYS = attrgetter("arrays")
#: nodes one call may make (a call that reaches further back than this is not taped)
MAX_NODES_PER_CALL = 64


def taped(fn: Callable) -> Callable:
    """``fn``, recorded and replayed by the tape (``graph/tape.py``) when one is active; otherwise one
    slot read more than calling ``fn``."""

    def op(*args: Any, **kw: Any) -> Any:
        s = _STATE[0]
        if s is None:
            return fn(*args, **kw)
        try:
            return s.call(fn, args, kw)
        except Exception:
            if s.cut:  # another thread ended this replay or recording under the call: run it as usual
                return fn(*args, **kw)
            raise

    op.__name__, op.__qualname__, op.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    op.__module__, op.__wrapped__ = fn.__module__, fn  # type: ignore[attr-defined]
    return op


# -- one recorded call ----------------------------------------------------------------------------------

class Call:
    """One op call of a tape: the op, its arguments (``names`` of keywords; ``arrays``: (position,
    element, ref), the element of a list or tuple there or None, ref >= 0 a tape position, < 0 a leaf
    slot ``-1 - ref``; ``static``: (position, element, value, how); ``containers``: (position, list or
    tuple, length) of the lists and tuples that hold arrays), the
    nodes it made (``nodes``: primitive, shape, dtype, stream, input indices into the call's values,
    sibling group), the values it reads from outside its arguments (``extra``: a tape position, or an
    evaluated ArrayData held as is), and its result (``outs``: indices into the call's values, or
    ``-1 - i`` for argument ``i`` itself; ``kind``: None for one array, else tuple or list)."""

    __slots__ = ("fn", "n", "names", "arrays", "static", "containers", "nodes", "groups", "extra", "outs", "kind",
                 "stream", "depth")


class Tape:
    """A recorded step: its calls, the entry it hits, the stream its first call ran on (and how deep in
    ``lf.stream`` scopes), its leaves as recorded and their metadata. A leaf is held (a replay's fast
    check: the same array again, as weights are) until a replay binds another array to its slot (the
    step's input): then the tape lets the recorded one go."""

    __slots__ = ("calls", "first", "entry", "stream", "depth", "leaf_meta", "leaves", "leaf_ids", "misses",
                 "replayer", "steps", "template", "perm", "leaf_base", "slot_at", "users", "held", "unheld", "made")

    def __init__(self, calls: list, entry, leaves: list):
        self.calls, self.entry, self.leaves = calls, entry, leaves
        self.stream, self.depth = calls[0].stream, calls[0].depth  # (where a replay may begin)
        self.leaf_meta = [(d.shape, d.dtype, d.device) for d in leaves]
        self.leaf_ids = set(map(id, leaves))
        self.first = calls[0].fn
        self.misses = 0
        self.template = self.perm = self.leaf_base = self.slot_at = self.users = self.held = self.unheld = None
        self.made = None  # (Recorder.hit, Replayer.found)
        self.replayer = Replayer(self)
        self.steps = _steps.Steps(self, self.replayer)


# -- the three states ---------------------------------------------------------------------------------

class Armed:
    """After an evaluation: the thread's next op call may start a replay (a tape whose first call it
    matches, on this stream) or the recording the plan cache asked for."""

    __slots__ = ("thread",)
    cut = False

    def __init__(self, thread: int):
        self.thread = thread

    def busy(self) -> bool:
        return False

    def abandoned(self) -> bool:
        return True

    def finish(self) -> None:
        pass

    def hit(self, entry, order: list, leaves: list) -> None:
        pass

    def found(self, roots) -> None:
        return None

    def call(self, fn: Callable, args: tuple, kw: dict) -> Any:
        me = get_ident()
        if me != self.thread:
            return fn(*args, **kw)
        _STATE[0] = None
        if (fn not in _g.FIRSTS and not _g.WANT) or _tracing[0] or _early.EVERY:
            return fn(*args, **kw)  # (no tape starts with this op, none is wanted: an eval per op costs no more)
        st = current_stream()
        for t in _g.TAPES.get((fn, st), ()):
            if not st._closed:
                rp = t.replayer
                rp.start(me, st)
                _STATE[0] = rp
                try:
                    r = rp.call(fn, args, kw)
                except Exception:  # noqa: BLE001 - not this tape's call after all: the op says what is wrong
                    r = _MISS
                if r is not _MISS:
                    rp.probe = False
                    return r
                rp.stop()
                _STATE[0] = None
        w = _wanted(st, args, kw)
        if w is not None and w.alive:
            rec = Recorder(me, w)
            _STATE[0] = rec
            return rec.call(fn, args, kw)
        return fn(*args, **kw)


def _passthrough(fn: Callable, args: tuple, kw: dict) -> Any:
    return fn(*args, **kw)


class Replayer:
    """Answers the thread's op calls from a tape while they match it: ``call`` is the compiled step of
    the tape's next call (``ops/tape_steps.py``), which checks the call and makes its nodes; ``made``:
    the nodes made so far, by tape position; ``bound``: the array bound to each leaf slot."""

    __slots__ = ("tape", "thread", "st", "stack", "depth", "call", "done", "made", "bound", "bound_ids", "rebound",
                 "hosted", "probe", "ok", "diverged", "own", "cut")

    def __init__(self, tape: Tape):
        self.tape = tape
        self.made = self.bound = self.stack = self.call = None
        self.cut = False

    def start(self, thread: int, st) -> None:
        """A new replay of the tape, by ``thread`` on the stream ``st`` (its current stream, as the
        stream scopes of ``thread`` say now: ``stack``, ``depth``)."""
        self.thread, self.st = thread, st
        self.stack = _stack()
        self.depth = len(self.stack)
        self.made = []
        self.bound = [None] * len(self.tape.leaves)
        self.bound_ids = set()
        self.rebound = []  # the slots bound to another array than the recorded one
        self.done = self.hosted = self.ok = self.diverged = self.own = self.cut = False
        self.probe = True  # while its first call is tried: a mismatch only says "not this tape"
        self.call = self.tape.steps.first

    def stop(self) -> None:
        """Let go of the replay's nodes (they hold the step's buffers: a CUDA graph's output set stays
        busy while anything holds it)."""
        self.made = self.bound = self.stack = self.call = None

    def busy(self) -> bool:
        return True

    def bind(self, slot: int, d: ArrayData) -> bool:
        """Whether ``d`` may be the leaf of ``slot`` (its first use in this replay, ``d`` not the
        recorded leaf): evaluated, with the recorded metadata, and no other slot's leaf."""
        shape, dtype, device = self.tape.leaf_meta[slot]
        if ((d.prim is not None and d.prim.kind != "constant") or d.shape != shape or d.dtype != dtype
                or d.device is not device):
            return False
        i = id(d)
        t = self.tape
        if i in self.bound_ids or i in t.leaf_ids:
            return False
        self.bound_ids.add(i)
        self.rebound.append(slot)
        if d.prim is not None:
            self.hosted = True  # (host data, uploaded by the evaluation: not a leaf of the plan yet)
        old = t.leaves[slot]
        if old is not None:  # a leaf that changes (the step's input): the tape no longer holds the old one
            t.leaves[slot] = None
            t.leaf_ids.discard(id(old))
            if t.slot_at is not None:
                for p in t.slot_at.get(slot, ()):
                    t.leaf_base[p] = None
        return True

    def diverge(self, fn: Callable, args: tuple, kw: dict) -> Any:
        """The program left the tape: the rest of the step runs as usual (what was made stays). The
        replayer stays the state until the step's evaluation, which says whether the tape failed its
        own plan (a miss) or the step was another program's that starts alike (nothing counted)."""
        if get_ident() != self.thread:
            return fn(*args, **kw)
        if self.probe:
            return _MISS
        _g.STATS["tape_divergences"] += 1
        self.diverged = True
        self.made = self.bound = None
        self.call = _passthrough
        return fn(*args, **kw)

    def abandoned(self) -> bool:
        """Another thread evaluated: whether that was this replay's step (its nodes evaluated), which
        ends the replay uncounted (else it would hold the step's values until this thread evaluates).
        The owner may be inside a step function, which then fails on the emptied fields: ``cut`` tells
        the op wrapper to run that call as usual."""
        made = self.made
        if made is not None and not any(d.prim is None for d in made):
            return False
        self.cut = True
        self.stop()
        return True

    def hit(self, entry, order: list, leaves: list) -> None:
        if entry is self.tape.entry:
            self.own = True
            self.ok = self.done and not self.diverged

    def found(self, roots) -> tuple | None:
        """``eval_templates.find``'s answer for ``roots`` after this whole replay, from the tape: its
        nodes in the template's order (``tape.perm``), the leaves bound to its slots, with the users each
        node had in the recorded graph at its evaluation and the same nodes held by arrays (the
        template's key reads whether an array holds a node, not how many do), which matched the template (the nodes'
        primitives, shapes, dtypes, streams and inputs are the recorded ones by construction); None
        when anything differs (an array kept, a node used outside the tape, a leaf not evaluated)."""
        t = self.tape
        tpl = t.template
        if not self.done or self.diverged or tpl is None or tpl is not t.entry.template or not t.entry.alive:
            return None
        if len(self.made) != t.made:  # (a node of another thread's, in a race: let the match decide)
            return None
        made = self.made
        # Every node's users as recorded (not their sum: an op that is not taped, say lf.sort, may read
        # another intermediate than in the recorded step), and the same nodes held by arrays (what the
        # template's key reads of them).
        if list(map(_USERS, made)) != t.users:
            return None
        arrays = list(map(_ARRAYS, made))
        if arrays.count(0) != t.unheld or not all(map(arrays.__getitem__, t.held)):
            return None
        nodes = list(map(made.__getitem__, t.perm))
        pos = tpl.root_pos
        if len(roots) != len(pos) or not all(map(is_, roots, map(nodes.__getitem__, pos))):
            return None
        if self.hosted:
            return None
        # the leaves: the recorded ones and those bound anew (bind kept them evaluated or host data,
        # and apart from every other leaf)
        leaves = t.leaf_base.copy()
        bound, slot_at = self.bound, t.slot_at
        for slot in self.rebound:
            for p in slot_at.get(slot, ()):
                leaves[p] = bound[slot]
        return tpl, (nodes, leaves, _templates.scalars_of(tpl, nodes))

    def finish(self) -> None:
        """At the step's evaluation: a replay that gave the tape's plan its graph; a miss when the tape
        failed its own plan (the plan hit after a divergence, or a whole replay whose graph was
        another); nothing when a step that started alike diverged into another plan."""
        t = self.tape
        self.stop()
        if self.ok:
            t.misses = 0
            _g.STATS["tape_replays"] += 1
            return
        if not (self.own or (self.done and not self.diverged)):
            return
        t.misses += 1
        _g.STATS["tape_misses"] += 1
        if t.misses >= _g.MAX_MISSES:
            _g.drop(t)


class Recorder:
    """Runs the thread's op calls as usual and notes them, until the evaluation that ends the step (which
    confirms the tape when it hits an entry without one with recorded nodes only)."""

    __slots__ = ("thread", "entry", "calls", "pos", "made", "slots", "leaves", "tape", "ours", "cut")

    def __init__(self, thread: int, entry):
        self.thread, self.entry = thread, entry
        self.cut = False
        # whether the step works on the entry's stream: a recording that gives no tape counts against
        # the entry only then (another program's step, say one that bypasses the cache, may come first)
        self.ours = False
        self.calls: list = []
        self.pos: dict = {}  # id(node) -> tape position (``made`` keeps the nodes, so ids stay theirs)
        self.made: list = []
        self.slots: dict = {}  # id(leaf) -> slot (its index in ``leaves``)
        self.leaves: list = []
        self.tape = None

    def busy(self) -> bool:
        return True

    def found(self, roots) -> None:
        return None

    def abandoned(self) -> bool:
        """Another thread evaluated: whether that was this recording's step (then given up, uncounted)."""
        if self.calls is not None and not any(d.prim is None for d in self.made):
            return False
        self.ours, self.cut = False, True
        self.give_up(None, (), {}, "another thread evaluated the step")
        return True

    def call(self, fn: Callable, args: tuple, kw: dict) -> Any:
        if get_ident() != self.thread:
            return fn(*args, **kw)
        note = self._note(fn, args, kw)
        if note is None:
            return self.give_up(fn, args, kw, f"{_name(fn)}: an argument the tape cannot compare (not an array, a"
                                f" number, a string, a dtype, a stream, a device, a slice or a list or tuple"
                                f" of those), or an array not made by the step's recorded calls and not"
                                f" evaluated")
        _STATE[0] = None  # calls inside this one are not noted
        reads = _g.HOST_READS[0]
        try:
            r = fn(*args, **kw)
        except BaseException:
            if _STATE[0] is None:
                _STATE[0] = self
            self.give_up(None, (), {}, f"{_name(fn)} raised")
            raise
        # it evaluated something or read an array's values (a mask, a count: values the nodes it
        # made depend on, which a replay would not read again), rebound an argument, or returned
        # no arrays
        if _STATE[0] is not None:
            self.give_up(None, (), {}, f"{_name(fn)} evaluated arrays")
        elif _g.HOST_READS[0] != reads:
            self.give_up(None, (), {}, f"{_name(fn)} read array values on the host")
        elif not self._noted(note, r):
            self.give_up(None, (), {}, f"{_name(fn)} returned no arrays, rebound an argument or made more than"
                                       f" {MAX_NODES_PER_CALL} nodes")
        else:
            _STATE[0] = self
        return r
        _STATE[0] = self
        return r

    def give_up(self, fn: Callable | None, args: tuple, kw: dict, why: str) -> Any:
        """The step cannot be taped (``why``: ``plan_cache_info()["tape_last_failure"]`` shows it): stop
        noting (a failed recording for the entry) and run the call."""
        if _STATE[0] is self:
            _STATE[0] = None
        if self.calls is not None:
            _g.LAST_FAILURE[0] = why
            _g.FAILURES[0] += 1
            self.calls = None
            self.made, self.leaves = [], []
            (_failed if self.ours else _idle)(self.entry)
        return fn(*args, **kw) if fn is not None else None

    def _note(self, fn: Callable, args: tuple, kw: dict) -> tuple | None:
        """The call's arguments as a :class:`Call` records them, or None when it cannot be taped."""
        if self.calls is None or _tracing[0]:
            return None
        names = tuple(kw)
        vals = args + tuple(kw.values()) if kw else args
        arrays, static, datas, objs, containers = [], [], [], [], []
        for k, v in enumerate(vals):
            c = v.__class__
            if c is Array:
                if not self._array(k, None, v, arrays, datas, objs):
                    return None
            elif (c is list or c is tuple) and any(x.__class__ is Array for x in v):
                containers.append((k, c, len(v)))  # (lf.concatenate([a, b]), x[(i, slice(None))])
                for m, x in enumerate(v):
                    if x.__class__ is Array:
                        if not self._array(k, m, x, arrays, datas, objs):
                            return None
                    else:
                        how = _steps.plain(x)
                        if not how:
                            return None
                        static.append((k, m, _steps.snapshot(x), how))
            else:
                how = _steps.plain(v)
                if not how:
                    return None
                static.append((k, None, _steps.snapshot(v), how))
        return fn, names, vals, arrays, static, datas, objs, containers

    def _array(self, k: int, m: int | None, v: Array, arrays: list, datas: list, objs: list) -> bool:
        """Note the array argument ``v`` (at position ``k``, element ``m`` of a list or tuple there):
        an earlier call's result, or a leaf (evaluated, or host data); False when it is neither."""
        d = v._data
        p = self.pos.get(id(d))
        if p is None:
            if d.prim is not None and d.prim.kind != "constant":
                return False  # made outside the taped calls, not evaluated and not host data
            s = self.slots.get(id(d))
            if s is None:
                s = self.slots[id(d)] = len(self.leaves)
                self.leaves.append(d)
            p = -1 - s
        arrays.append((k, m, p))
        datas.append(d)
        objs.append(v)
        return True

    def _noted(self, note: tuple, r: Any) -> bool:
        fn, names, vals, arrays, static, datas, objs, containers = note
        if any(o._data is not d for o, d in zip(objs, datas)):
            return False  # an argument was rebound
        if r.__class__ is Array:
            kind, rs = None, [r]
        elif r.__class__ in (tuple, list) and r and all(x.__class__ is Array for x in r):
            kind, rs = r.__class__, list(r)
        else:
            return False
        index = {}
        for k, d in enumerate(datas):
            index.setdefault(id(d), k)
        extra, new = self._reach([x._data for x in rs], index)
        if new is None:
            return False
        env_n = len(datas)
        for x in extra:
            index[id(x)] = env_n
            env_n += 1
        c = Call()
        c.fn, c.names, c.n, c.arrays, c.static, c.containers = fn, names, len(vals), arrays, static, containers
        c.stream, c.depth = current_stream(), len(_stack())  # (what the op's stream=None means here)
        c.extra = [self.pos[id(x)] if x.prim is not None else x for x in extra]
        c.nodes, groups = [], {}
        for d in new:
            if d.__class__ is not ArrayData:  # (a replay makes plain nodes, field by field)
                return False
            index[id(d)] = env_n
            env_n += 1
            prim = d.prim
            if prim.kind == "constant":  # host data: its upload lets go of it, so each replay gets a copy
                prim = _steps.HostData(prim.value, prim.name)
            c.nodes.append((prim, d.shape, d.dtype, d.stream, [index[id(i)] for i in d.inputs]))
            if d.siblings is not None:
                groups.setdefault(id(d.siblings), []).append(index[id(d)])
        c.groups = list(groups.values())
        outs = []
        for x in rs:
            for k, o in enumerate(vals):
                if x is o:
                    outs.append(-1 - k)
                    break
            else:
                outs.append(index[id(x._data)])
        c.outs, c.kind = outs, kind
        for d in new:
            self.pos[id(d)] = len(self.made)
            self.made.append(d)
            if d.stream is self.entry.stream:
                self.ours = True
        self.calls.append(c)
        return True

    def _reach(self, outs: list, index: dict) -> tuple:
        """The nodes the call made (pending values its results reach, not its arguments and not made
        by an earlier call), inputs first, and the values outside its arguments they read (earlier
        calls' nodes, evaluated arrays); (None, None) when that is more than a call may make."""
        new, extra, seen = [], [], set(index)
        stack = [(d, False) for d in reversed(outs)]
        while stack:
            d, done = stack.pop()
            if done:
                new.append(d)
                continue
            if id(d) in seen:
                continue
            seen.add(id(d))
            if d.prim is None or id(d) in self.pos:
                extra.append(d)
                continue
            if len(new) + len(stack) > MAX_NODES_PER_CALL:
                return None, None
            group = d.siblings or (d,)
            for g in group:  # siblings are made together: all of them are the call's
                if g is not d:
                    seen.add(id(g))
            stack.append((d, True))
            for g in group:
                if g is not d:
                    stack.append((g, True))
            for g in group:
                for i in reversed(g.inputs):
                    if id(i) not in seen:
                        stack.append((i, False))
        return extra, new

    def hit(self, entry, order: list, leaves: list) -> None:
        """The evaluation ending the recording hits ``entry``: the tape is ``entry``'s if its graph is
        made of recorded nodes only (the wanted entry, or another without a tape: a program that
        evaluates several times a step records one piece at a time). The tape keeps where the graph's
        nodes are (``perm``), its leaves (``leaf_base``, with the positions of each slot's: ``slot_at``),
        the nodes' users and which are held by arrays, for a replay's evaluation to skip the template
        match (``found``)."""
        if self.calls and entry.alive and _g.untaped(entry):
            pos = self.pos
            if all(id(d) in pos for d in order):
                tape = self.tape = Tape(self.calls, entry, self.leaves)
                slots = self.slots
                # (the shortcut only where every leaf is a slot or a value outside the step: host data
                # a call made is uploaded as a leaf, and a replay makes its own)
                if entry.template is not None and all(id(d) in slots or (d.prim is None and id(d) not in pos)
                                                      for d in leaves):
                    tape.template, tape.made = entry.template, len(self.made)
                    tape.perm = [pos[id(d)] for d in order]
                    tape.leaf_base, tape.slot_at = list(leaves), {}
                    for p, d in enumerate(leaves):
                        s = slots.get(id(d))
                        if s is None:  # a value outside the step, read as it is: no slot may bind it
                            tape.leaf_ids.add(id(d))
                        else:
                            tape.slot_at.setdefault(s, []).append(p)
                    made = self.made
                    tape.users = list(map(_USERS, made))
                    tape.held = [k for k, d in enumerate(made) if d.arrays]
                    tape.unheld = len(made) - len(tape.held)

    def finish(self) -> None:
        e = self.entry
        if self.calls is None:
            return  # given up (and counted) already
        t = self.tape
        if t is not None and t.entry.alive and _g.untaped(t.entry):
            _g.unwant(t.entry)
            _g.file(t)
            _IDLE[0] = 0
        else:
            _g.FAILURES[0] += 1
            _g.LAST_FAILURE[0] = ("the step's evaluation hit no plan-cache entry without a tape, or its graph"
                                  " holds nodes the recorded calls did not make")
            (_failed if self.ours else _idle)(e)
        self.calls = None
        self.made, self.leaves = [], []


def _wanted(st, args: tuple, kw: dict):
    """The entry to record for a call that may begin a step: the one wanted on the current stream
    ``st``, on the stream the call names (``stream=``), or on an array argument's stream; None."""
    want = _g.WANT
    w = want.get(st)
    if w is None:
        named = kw.get("stream")
        w = want.get(named) if named is not None else None
        if w is None:
            for a in args:
                if a.__class__ is Array:
                    w = want.get(a._data.stream)
                    if w is not None:
                        break
    return w


def _name(fn: Callable) -> str:
    """``lf.add``, or ``Array.__add__`` for a method (``_array_methods.py``)."""
    name = getattr(fn, "__name__", str(fn))
    return f"Array.{name}" if getattr(fn, "__qualname__", "").startswith("_Methods.") else f"lf.{name}"


def _idle(entry) -> None:
    """A recording for ``entry`` that worked on other streams only (another program's step): after
    :data:`MAX_IDLE` in a row the entry is no longer wanted until its next hit asks again."""
    _IDLE[0] += 1
    if _IDLE[0] >= MAX_IDLE:
        _g.unwant(entry)
        _IDLE[0] = 0


#: recordings in a row that gave nothing and worked on no stream of the wanted entry, and their bound
_IDLE = [0]
MAX_IDLE = 4


def _failed(entry) -> None:
    """A recording of ``entry``'s step that gave no tape: after MAX_MISSES of them the entry stops asking."""
    _g.unwant(entry)
    if _g.untaped(entry):
        entry.tape = (entry.tape or 0) + 1


_g.ARM[0] = Armed
