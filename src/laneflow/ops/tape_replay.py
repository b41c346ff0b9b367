"""Trace-guided replay, the replaying side: a recorded step (:class:`Tape`) and its replay
(:class:`Replayer`), which answers the thread's op calls with the tape's compiled steps
(``ops/tape_steps.py``) while they match, and gives the evaluation that ends a whole replay its graph
without a template match (:meth:`Replayer.found`). ``ops/tape.py`` starts replays;
``ops/tape_record.py`` makes tapes.
"""

from __future__ import annotations

from operator import attrgetter, is_
from threading import get_ident
from typing import Any, Callable

from ..defaults import _stack
from ..graph import eval_templates as _templates
from ..graph import tape as _g
from ..graph.node import ArrayData
from . import tape_steps as _steps

_MISS = _steps.MISS
_STATE = _g.STATE
_USERS = attrgetter("users")
_ARRAYS = attrgetter("arrays")


class Tape:
    """A recorded step: its calls, the entry it hits, the stream its first call ran on (and how deep in
    ``lf.stream`` scopes), its leaves as recorded and their metadata. A leaf is held (a replay's fast
    check: the same array again, as weights are) until a replay binds another array to its slot (the
    step's input): then the tape lets the recorded one go."""

    __slots__ = ("calls", "first", "entry", "stream", "depth", "leaf_meta", "leaves", "leaf_ids", "misses", "tries",
                 "replayer", "steps", "template", "perm", "in_order", "leaf_base", "slot_at", "users", "held_mask", "made", "same_counts")

    def __init__(self, calls: list, entry, leaves: list):
        self.calls, self.entry, self.leaves = calls, entry, leaves
        self.stream, self.depth = calls[0].stream, calls[0].depth  # (where a replay may begin)
        self.leaf_meta = [(d.shape, d.dtype, d.device) for d in leaves]
        self.leaf_ids = set(map(id, leaves))
        self.first = calls[0].fn
        self.misses = self.tries = 0
        self.template = self.perm = self.leaf_base = self.slot_at = self.users = self.held_mask = None
        self.made = None  # (Recorder.hit, Replayer.found)
        self.in_order = False  # perm is 0, 1, ... len(made) - 1: the made nodes are the graph's order
        self.replayer = Replayer(self)
        self.steps = _steps.Steps(self, self.replayer)
        g = _steps._GLOBALS  # (the C node maker's check of the made nodes' counts, if its steps use it)
        self.same_counts = g.get("CM") if g.get("C") else None

    def name(self, k: int) -> str:
        """The ``k``-th call's op, as a user wrote it (``lf.add``, ``Array.__add__``)."""
        return _name(self.calls[k].fn)


def _name(fn: Callable) -> str:
    """``lf.add``, or ``Array.__add__`` for a method (``_array_methods.py``)."""
    name = getattr(fn, "__name__", str(fn))
    return f"Array.{name}" if getattr(fn, "__qualname__", "").startswith("_Methods.") else f"lf.{name}"


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
        # A call that raises (a program trying a keyword, then another way) made nothing the step
        # uses: the replay goes on, as the recording did (``Recorder.call``).
        why = self._why(fn)
        _STATE[0] = None
        try:
            r = fn(*args, **kw)
        except BaseException:
            if _STATE[0] is None:
                _STATE[0] = self
            raise
        if _STATE[0] is None:  # (else an evaluation under the call ended the replay already)
            _STATE[0] = self
        _g.STATS["tape_divergences"] += 1
        _g.LAST_DIVERGENCE[0] = why
        self.diverged = True
        self.made = self.bound = None
        self.call = _passthrough
        return r

    def _why(self, fn: Callable) -> str:
        """Where and how the program left the tape (``plan_cache_info()["tape_last_divergence"]``)."""
        calls, funcs = self.tape.calls, self.tape.steps.funcs
        n = len(calls)
        try:
            k = funcs.index(self.call)
        except ValueError:  # (past the last step)
            return f"{_name(fn)}: a call after the tape's last ({n} calls)"
        if fn is not calls[k].fn:
            return f"call {k + 1} of {n}: {_name(fn)} where the tape has {_name(calls[k].fn)}"
        return (f"call {k + 1} of {n}, {_name(fn)}: an argument differs from the recording (a static value, an"
                f" array's shape, dtype or device, or which earlier result it is), or the stream or thread")

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
        nodes in the template's order (``tape.perm``) and the leaves bound to its slots, when each node
        has the users it had in the recorded graph at its evaluation and the same nodes are held by
        arrays (the template's key reads whether an array holds a node, not how many do): that graph
        matched the template, and the nodes' primitives, shapes, dtypes, streams and inputs are the
        recorded ones by construction. None when anything differs (an array kept, a node used outside
        the tape, a leaf not evaluated)."""
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
        if t.same_counts is not None:  # (one pass in C: ops/ctape.c)
            if not t.same_counts(made, t.users, t.held_mask):
                return None
        else:
            if list(map(_USERS, made)) != t.users or bytes(map(bool, map(_ARRAYS, made))) != t.held_mask:
                return None
        nodes = made if t.in_order else list(map(made.__getitem__, t.perm))  # (made is not changed after)
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

    def finish(self, looked: bool = True) -> None:
        """At the step's evaluation: a replay that gave the tape's plan its graph; a miss when the tape
        failed its own plan (the plan hit after a divergence, or a whole replay whose graph was
        another); nothing when a step that started alike diverged into another plan, or when the
        evaluation did not look for a plan (``looked`` False: under ``eval_cache.bypass()``)."""
        t = self.tape
        self.stop()
        if not looked:
            return
        if self.ok:
            t.misses = t.tries = 0
            _g.STATS["tape_replays"] += 1
            return
        if not (self.own or (self.done and not self.diverged)):
            return
        _g.miss(t)
