"""Trace-guided replay, the plan cache's side: which step records a tape, which tapes exist, and what an
evaluation tells them. The op side is ``ops/tape.py`` (the op wrapper, starting a replay or a
recording), ``ops/tape_record.py`` (recording a call) and ``ops/tape_replay.py`` (replaying one).

A repeated eager step (a forward evaluated again and again) hits one plan-cache entry each time, and
Python builds the same graph each time: GPT-2 small calls about 300 ops, each of which checks its
arguments and infers its result (1.5-2 us a call on the H200's host), before the one evaluation. A
*tape* is that step's op calls as recorded once: per call the op, its static arguments, where its
array arguments come from (an earlier call's result, or a leaf: an evaluated array), and the nodes it
made. When the step runs again, each op call that matches the tape's next call is answered with the
recorded nodes, made anew on the new inputs, without the op's own checks and inference. The nodes are
real, so nothing downstream changes; a call that does not match (another op, other arguments, another
stream, an array rebound in place) runs as usual, and the rest of the step is built as usual.

Life of a tape:

1. **want**: a plan-cache hit of an entry that has no tape asks for one (:func:`want`), on its stream;
2. **record**: after the next evaluation, the next op call on that thread on that stream (the current
   one, the one the call names, or an argument's) starts a recorder, which
   runs each call as usual and notes it; it is given up at a call it cannot note (an argument that is
   not an Array or plain data, an array made outside the recorded calls and not evaluated, an op that
   evaluates or rebinds its arguments);
3. **confirm**: the evaluation that ends the step must hit the wanted entry with a graph made only of
   recorded nodes; the tape is then filed under its first op (:data:`TAPES`);
4. **replay**: after an evaluation, an op call that matches a tape's first call on the same stream
   starts a replayer. A call that does not match leaves the tape (a divergence): the rest of the step
   runs as usual. A miss is a replay that failed the tape's own plan (the plan hit after a divergence,
   or a whole replay whose graph was another), or a step whose first call did not match the tape's
   (:data:`PROBED`) and which hit the tape's plan anyway (a Python number passed to the first op that
   changed); :data:`MAX_MISSES` in a row drop the tape. The entry does not record again, except after
   first-call misses (the new constant may stay), up to :data:`MAX_MISSES` tapes: a value that changes
   every step stops it. A step that diverges into another plan is not a miss: two programs that
   start alike on one stream keep the first one's tape, and the other runs untaped.

A recorded call that reads an array's values on the host (a boolean mask, a fill value or repeat
counts given as arrays: :data:`HOST_READS` counts such reads) is not taped, since its nodes depend on
those values; nor are calls with arguments the tape cannot compare (array-likes, objects of a user's;
arrays are compared as arguments and as elements of a list or tuple argument, as ``lf.concatenate``
and index tuples take them),
arrays made outside the recorded calls and not evaluated, or ops that evaluate or rebind arguments.
Static arguments are compared by value and class, with the signs of zero (``-0.0``, ``-0j``), against
a copy taken at the call (a list changed in place later is another argument).

The state is one slot (:data:`STATE`) that every taped op reads: None (ops run as usual), an armed
marker (the next op call may start a replay or a recording), a recorder or a replayer. It belongs to
the thread that evaluated last; op calls of other threads run as usual, so one thread at a time is
served. Another thread's evaluation leaves a replay or recording alone, unless it evaluated that
step's nodes, which ends it (uncounted), letting its values go. Inside ``lf.compile``'s
tracing, with early launch on (``graph/early.py``), or with ``LANEFLOW_TAPE=0`` /
``lf.set_plan_cache(tape=False)``, nothing is taped.
"""

from __future__ import annotations

import os
from threading import get_ident

ENABLED = os.environ.get("LANEFLOW_TAPE", "1") != "0"
#: misses in a row after which a tape is dropped, and failed recordings after which an entry stops trying
MAX_MISSES = 3
#: tapes kept per first op and stream (several models, or one model's variants, on one stream)
PER_FIRST = 4

#: what the next taped op call does: None (run as usual), an armed marker, a recorder or a replayer
STATE: list = [None]
#: (first op function, its stream) -> the tapes that start with it there, latest first
TAPES: dict = {}
#: the first ops of the tapes (what the op call after an evaluation looks up first: most are none)
FIRSTS: set = set()
#: stream -> the plan-cache entry whose next step on it is recorded
WANT: dict = {}
#: makes the armed marker for a thread (``ops/tape.py`` sets it: the marker knows the op layer)
ARM: list = [None]
STATS = {"tapes_recorded": 0, "tape_replays": 0, "tape_divergences": 0, "tape_misses": 0}
#: why the last recording gave no tape (None: none failed), for ``lf.plan_cache_info()``, and how many
#: recordings gave none
LAST_FAILURE: list = [None]
FAILURES = [0]
#: where and how the last replay left its tape (None: none did), for ``lf.plan_cache_info()``
LAST_DIVERGENCE: list = [None]
#: the tapes whose first call the thread's step did not match (thread, tapes): when that step's
#: evaluation hits one's entry anyway, the tape failed it (a value that changes every step in its first
#: call, a leaf made another way): a miss (:func:`hit`). Emptied at every evaluation and when a tape is
#: dropped or the tape turned off. (A thread that probed and ended before evaluating leaves it set until
#: the next evaluation: a new thread given the same ident by then could count one miss it did not make.)
PROBED: list = [None, ()]
#: host reads of array values (``Array._host``): a recorded op that reads values (a boolean mask, a
#: count) made nodes that depend on them, which its replay would not read again: it is not taped
HOST_READS = [0]


def untaped(entry) -> bool:
    """Whether ``entry`` has no tape and may get one. ``entry.tape`` is None (none yet), a count of
    failed recordings, its Tape, or False (never again)."""
    t = entry.tape
    return t is None or t.__class__ is int


def want(entry) -> None:
    """``entry`` was hit and has no tape: record its next step."""
    if ENABLED and untaped(entry) and (entry.tape or 0) < MAX_MISSES:
        WANT[entry.stream] = entry


def unwant(entry) -> None:
    """``entry`` is no longer wanted (taped, failed, or gone)."""
    if WANT.get(entry.stream) is entry:
        del WANT[entry.stream]


def hit(entry, order: list, leaves: list) -> None:
    """The evaluation about to run hits ``entry`` with the graph ``order`` over ``leaves``: a recorder
    confirms its tape here, a replayer its replay."""
    s = STATE[0]
    me = get_ident()
    if s is not None and s.thread == me:
        s.hit(entry, order, leaves)
    if PROBED[1] and PROBED[0] == me:
        for t in PROBED[1]:
            if t.entry is entry:
                LAST_DIVERGENCE[0] = (f"call 1 of {len(t.calls)}, {t.name(0)}: an argument differs from the"
                                      f" recording, in a step that then ran the tape's plan (a value that"
                                      f" changes between steps, say a Python number, is better passed as an"
                                      f" array)")
                miss(t, again=True)


def miss(tape, again: bool = False) -> None:
    """``tape`` failed its own plan: :data:`MAX_MISSES` in a row drop it. Its entry records no other
    (a recording of the same step would fail the same way), unless ``again``: the steps differed from
    the tape in its first call, which a new recording may match (another constant, once for all);
    the entry then counts it as a failed recording, so one whose first call changes every step stops
    recording after :data:`MAX_MISSES` tries. A replay that gives a tape its plan clears both counts."""
    tape.misses += 1
    STATS["tape_misses"] += 1
    if tape.misses >= MAX_MISSES:
        drop(tape, leave=tape.tries + 1 if again else False)


def found(roots) -> tuple | None:
    """For an evaluation of ``roots`` right after a whole replay: the template of the tape's entry and
    the graph in its order (``eval_templates.find``'s answer), known from the tape without searching
    the graph; None when the replay cannot tell (the evaluation then finds its plan as usual)."""
    s = STATE[0]
    if s is not None and s.thread == get_ident():
        return s.found(roots)
    return None


def evaluated(looked: bool = True) -> None:
    """After every evaluation (``eval_cache.schedule``, under its lock): the thread's recorder or
    replayer ends, and the next op call of this thread may start another. ``looked``: whether the
    evaluation looked for a plan (not under ``eval_cache.bypass()``); one that did not says nothing
    of the tape, and ends its recording or replay uncounted."""
    s = STATE[0]
    me = get_ident()
    PROBED[1] = ()  # (whoever evaluated: a probing thread that ended before its step's evaluation lets go)
    if s is not None:
        if s.thread != me:
            if s.busy() and not s.abandoned():
                return  # another thread is mid-step (this evaluation was not its step's): leave it alone
        else:
            s.finish(looked)
    STATE[0] = ARM[0](me) if ENABLED and (TAPES or WANT) and ARM[0] is not None else None


def _firsts() -> None:
    """:data:`FIRSTS` from :data:`TAPES` again."""
    FIRSTS.clear()
    FIRSTS.update(fn for fn, _ in TAPES)


def file(tape) -> None:
    """A confirmed tape: filed under its first op and stream, latest first. One filed beyond
    :data:`PER_FIRST` there pushes the oldest out, whose entry then records no other (recording
    again would push another out: each recording costs a step's building twice over)."""
    tries = tape.entry.tape  # (failed recordings before this one: see miss)
    tape.tries = tries if tries.__class__ is int else 0
    kept = TAPES.setdefault((tape.first, tape.stream), [])
    kept.insert(0, tape)
    for old in kept[PER_FIRST:]:
        old.entry.tape = False
    del kept[PER_FIRST:]
    tape.entry.tape = tape
    STATS["tapes_recorded"] += 1
    _firsts()


def drop(tape, leave=False) -> None:
    """``tape`` is no longer offered; its entry's ``tape`` becomes ``leave``: False (it records no
    other), None (it may record again), or a count of failed recordings (see :func:`untaped`)."""
    if tape in PROBED[1]:
        PROBED[1] = tuple(t for t in PROBED[1] if t is not tape)
    key = (tape.first, tape.stream)
    kept = TAPES.get(key)
    if kept is not None:
        kept[:] = [t for t in kept if t is not tape]
        if not kept:
            del TAPES[key]
            _firsts()
    if tape.entry.tape is tape:
        tape.entry.tape = leave


def forget(entry) -> None:
    """An evicted or cleared entry: its tape goes, and it is no longer wanted."""
    if not untaped(entry) and entry.tape is not False:
        drop(entry.tape, leave=None)
    entry.tape = None
    unwant(entry)


def clear() -> None:
    LAST_FAILURE[0] = LAST_DIVERGENCE[0] = None
    TAPES.clear()
    FIRSTS.clear()
    WANT.clear()
    PROBED[1] = ()
    STATE[0] = None


def enabled() -> bool:
    return ENABLED


def set_enabled(on: bool) -> None:
    """Tape, or not (off: no recording, no replay; the tapes are kept for when it is on again, while
    ``lf.set_plan_cache(tape=False)`` drops them)."""
    global ENABLED
    ENABLED = bool(on)
    if not ENABLED:
        STATE[0] = None
        PROBED[1] = ()
    elif STATE[0] is None and (TAPES or WANT) and ARM[0] is not None:
        STATE[0] = ARM[0](get_ident())  # the next op call may start a replay, as after an evaluation
