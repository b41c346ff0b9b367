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

This module is the entry: :func:`taped` and the state after an evaluation (:class:`Armed`), which starts
a replay (``ops/tape_replay.py``) or a recording (``ops/tape_record.py``).
"""

from __future__ import annotations

from functools import update_wrapper
from threading import get_ident
from typing import Any, Callable

from ..defaults import current_stream
from ..graph import early as _early
from ..graph import tape as _g
from ..graph import tracer as _tracer
from .tape_record import Recorder, _wanted
from .tape_replay import _MISS

_STATE = _g.STATE
_tracing = _tracer.ACTIVE


def taped(fn: Callable) -> Callable:
    """``fn``, recorded and replayed by the tape (``graph/tape.py``) when one is active; otherwise one
    slot read more than calling ``fn``. The wrapper is C (``ctape.taped``: no Python frame a call) where
    the tape's C module loads, unless ``LANEFLOW_CSTEPS=0``; else this Python function, which does the same."""
    wrap = _c_taped()
    if wrap is not None:
        return update_wrapper(wrap(fn, _STATE), fn)

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

    return update_wrapper(op, fn)  # (name, doc, annotations; inspect.signature follows __wrapped__)


def _c_taped() -> Callable | None:
    """``ctape.taped``, or None (no C module here, or ``LANEFLOW_CSTEPS=0``)."""
    from . import ctape  # (loaded at import: about a millisecond from the disk cache)

    if not ctape.steps_on():
        return None

    mod = ctape.load()
    return None if mod is None else mod.taped


# -- after an evaluation ---------------------------------------------------------------------------

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

    def finish(self, looked: bool = True) -> None:
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
        failed = []
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
                failed.append(t)
        if failed:  # (a miss if the step's evaluation hits such a tape's entry: graph/tape.hit)
            _g.PROBED[0], _g.PROBED[1] = me, failed
        w = _wanted(st, args, kw)
        if w is not None and w.alive:
            rec = Recorder(me, w)
            _STATE[0] = rec
            return rec.call(fn, args, kw)
        return fn(*args, **kw)


_g.ARM[0] = Armed
