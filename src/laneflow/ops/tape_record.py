"""Trace-guided replay, the recording side: a :class:`Recorder` runs the thread's op calls as usual and
notes each (:class:`Call`: the op, its static arguments, where its arrays come from, the nodes it
made), until the evaluation that ends the step confirms the tape (``ops/tape_replay.py``'s
:class:`~laneflow.ops.tape_replay.Tape`) or gives it up, saying why (``graph/tape.py``'s
``LAST_FAILURE``). ``ops/tape.py`` starts recordings.
"""

from __future__ import annotations

from threading import get_ident
from typing import Any, Callable

from ..array import Array
from ..defaults import _stack, current_stream
from ..graph import tape as _g
from ..graph import tracer as _tracer
from ..graph.node import ArrayData
from . import tape_steps as _steps
from .tape_replay import _ARRAYS, _USERS, Tape, _name

_STATE = _g.STATE
_tracing = _tracer.ACTIVE
#: nodes one call may make (a call that reaches further back than this is not taped)
MAX_NODES_PER_CALL = 64


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
        known = len(self.leaves)
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
            # A call that raised returned nothing the step can use (the ops are pure): it is not noted,
            # and the recording goes on (a program may catch it and call another way: duck typing).
            # Unless it evaluated something on the way, which ended the recording already.
            if _STATE[0] is None:
                _STATE[0] = self
                for d in self.leaves[known:]:  # (its new leaves are none of the step's)
                    del self.slots[id(d)]
                del self.leaves[known:]
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
                    tape.in_order = tape.perm == list(range(len(self.made)))
                    tape.leaf_base, tape.slot_at = list(leaves), {}
                    for p, d in enumerate(leaves):
                        s = slots.get(id(d))
                        if s is None:  # a value outside the step, read as it is: no slot may bind it
                            tape.leaf_ids.add(id(d))
                        else:
                            tape.slot_at.setdefault(s, []).append(p)
                    made = self.made
                    tape.users = list(map(_USERS, made))
                    tape.held_mask = bytes(map(bool, map(_ARRAYS, made)))

    def finish(self, looked: bool = True) -> None:
        """At the step's evaluation: the tape is filed when the step hit the wanted entry; else the
        recording failed (counted), unless the evaluation did not look for a plan (``looked`` False:
        under ``eval_cache.bypass()``), which ends it uncounted (the entry stays wanted)."""
        e = self.entry
        if self.calls is None:
            return  # given up (and counted) already
        t = self.tape
        if looked and t is not None and t.entry.alive and _g.untaped(t.entry):
            _g.unwant(t.entry)
            _g.file(t)
            _IDLE[0] = 0
        elif looked:
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
