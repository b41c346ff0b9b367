"""Speculative launch: a repeated eager step starts on the GPU when its first op is called.

A forward evaluated again and again is a plan-cache hit that runs as one CUDA graph
(``graph/eval_cache.py``), but only once ``lf.eval`` has its graph: Python builds every node first
(about 1 ms for GPT-2 small on the H200's host), then the GPU works (0.46 ms), one after the other.
The graph is almost always the last one again, with the same weights. So:

- **learn**: at a hit, the first node made since the previous evaluation, if it is a node of this
  graph whose inputs are all leaves (GPT-2's embedding lookup of the token ids), becomes the plan's
  *trigger*: its primitive, stream, and which leaves it reads (an early-launched piece,
  ``graph/early.py``, learns none: its plan runs over other weights each time);
- **launch**: after an evaluation, the next node made is looked up by its primitive
  (``ops.core.node``: one check per node, one dictionary lookup per evaluation). When it is a
  trigger, the plan's executor is
  launched at once, on that node's leaves and the last hit's other leaves (the weights), with the
  scalar values the executor holds. Python goes on building the graph while the GPU computes it;
- **use, or drop**: the step's ``lf.eval`` finds its plan as usual (the template match checks the
  whole graph) and takes the launch's outputs only if it would have launched the same thing now:
  the same executor with no launch since, the same leaf buffers with the same last writers (a buffer
  written after the launch read it has another writer), and the executor's scalar values. Otherwise
  the launch's outputs are dropped, unread, and the step launches as usual. A wrong guess costs GPU
  time, never a wrong value; after :data:`MAX_MISSES` wrong guesses in a row a plan stops guessing.

Nothing changes for a program but timing: values, errors (a launch's device-side errors reach only
the values that use its outputs) and memory (the executor's output sets, which a launch uses as a
hit's would). Plans that write a donated argument in place or hold collectives (every rank must
issue those in the same order), and buffers shared outside laneflow (``exported``: another library may
write them), are never guessed. A guess that no evaluation takes keeps one of the executor's output
sets busy until the plan's next hit drops it. Only GPU streams guess
(:data:`DEVICES`; a CPU plan's one command competes with the building thread for the host); the tests
let CPU streams guess too, so the checks run on every machine. ``LANEFLOW_SPECULATE=0`` at start-up,
or ``lf.set_plan_cache(speculate=False)``, turns it off; ``lf.plan_cache_info()`` counts launches
(``speculated``), outputs taken (``speculation_used``) and dropped (``speculation_wasted``).
"""

from __future__ import annotations

import os
import weakref

from ..runtime.lane import not_waiting
from . import schedule as _sched

ENABLED = os.environ.get("LANEFLOW_SPECULATE", "1") != "0"
#: device types whose streams guess (the tests add "cpu")
DEVICES = frozenset({"gpu"})
#: wrong guesses in a row after which a plan stops guessing
MAX_MISSES = 3
#: plans one trigger primitive may start (one per stream: one model on several streams)
PER_TRIGGER = 4

#: ``ops.core.node`` reports the next node it makes (``first_node``): set by a hit
WATCH = [False]
#: trigger primitive -> the plan-cache entries it starts
ARMED: dict = {}
_after: list = [None]  # a weak reference to the first node made since the last hit
STATS = {"speculated": 0, "speculation_used": 0, "speculation_wasted": 0}


class Guess:
    """A launch made ahead of its evaluation: the executor, its outputs (``lease``), the leaves it ran
    on (their ArrayData, which a CPU plan's kept layout copies are keyed by) and their buffers with
    their writers then, and the executor's launch count just after it."""

    __slots__ = ("unit", "lease", "datas", "bufs", "writers", "seq")

    def __init__(self, unit, lease, datas: list, bufs: list, seq: int):
        self.unit, self.lease, self.datas, self.bufs, self.seq = unit, lease, datas, bufs, seq
        self.writers = [b.writer for b in bufs]


def first_node(d) -> None:
    """``ops.core.node`` made ``d``, the first node since an evaluation: remember it (the next hit may
    learn it as its trigger) and launch the plan it triggers, if any."""
    WATCH[0] = False
    _after[0] = weakref.ref(d)
    if not ENABLED:
        return
    try:
        entries = ARMED.get(d.prim)
    except TypeError:  # a primitive of a user's that does not hash
        return
    if entries is not None:
        stream = d.stream
        for entry in entries:
            trig = entry.trigger  # (read once: another thread may stop the entry meanwhile)
            if trig and trig[1] is stream:
                _launch(entry, d)
                return


def _launch(entry, d) -> None:
    try:
        with not_waiting(), _sched.LOCK:  # (everything read under the lock: evictions and stops take it too)
            trig, unit, datas = entry.trigger, entry.spec_unit, entry.spec_datas
            gs = entry.graph_scalars
            if (not trig or not entry.alive or entry.guess is not None or unit is None or datas is None
                    or gs is None or entry.plan.unit is False):
                return
            _, stream, slots = trig
            datas = list(datas)
            for s, x in zip(slots, d.inputs):
                was = datas[s]
                if x.prim is not None or x.shape != was.shape or x.dtype != was.dtype or x.device != was.device:
                    return  # a pending input, or another kind of leaf: not this plan's first node
                datas[s] = x
            for x in datas:
                if x.buffer.exported:
                    return
            # The executor's scalar values: a hit with other values (run as commands) left its own in
            # the plan's Scalars, and a launch that captures a graph (a new output set) reads them.
            for obj, v in zip(entry.scalars, gs):
                obj.value = v
            lease = unit.run(datas, stream)
            if lease is not None:  # (the buffers after the launch: an evaluated value's never changes)
                entry.guess = Guess(unit, lease, datas, [x.buffer for x in datas], unit.launches)
                STATS["speculated"] += 1
    except Exception:  # noqa: BLE001 - optional work: the step launches at its eval as usual
        stop(entry)


def take(entry, guess: Guess, unit, leaves: list):
    """At a hit of ``entry`` that would launch ``unit`` on ``leaves`` (with the executor's scalar
    values): the outputs of ``guess`` when it launched exactly that, else None (dropped). The leaves
    must be the very values it ran on (a value is immutable while anything can see it; the guess may
    have run on the last hit's values, which could have died and had their buffers written in place
    since, and a CPU plan keys its kept layout copies by value), their buffers the same, with the
    same last writers (a write after the launch read them changes a writer)."""
    if guess.unit is unit and unit.launches == guess.seq and leaves == guess.datas:  # (values: by identity)
        bufs = [d.buffer for d in leaves]
        if bufs == guess.bufs and [b.writer for b in bufs] == guess.writers:  # (both compare by identity)
            entry.spec_misses = 0
            STATS["speculation_used"] += 1
            return guess.lease
    missed(entry)
    return None


def missed(entry) -> None:
    """A guess of ``entry`` went unused."""
    STATS["speculation_wasted"] += 1
    entry.spec_misses += 1
    if entry.spec_misses >= MAX_MISSES:
        stop(entry)


def learn(entry, unit, order: list, leaves: list) -> None:
    """After a hit of ``entry`` launched ``unit`` on ``leaves`` (the graph ``order``, still whole):
    keep what the next guess launches with, learn the trigger if there is none, and watch the next
    node made."""
    after = _after[0]
    if entry.trigger is False or not ENABLED or entry.plan.inplace or order[0].stream.device.type not in DEVICES:
        return
    entry.spec_unit, entry.spec_datas = unit, leaves
    if entry.trigger is not None:
        return
    first = after() if after is not None else None
    if first is None or first.prim is None:
        return
    if not first.inputs or first not in order:  # (nodes compare by identity)
        return
    slots = []
    for x in first.inputs:
        if x.prim is not None:
            return  # reads a node of the graph: not its first one
        for s, leaf in enumerate(leaves):
            if leaf is x:
                slots.append(s)
                break
        else:
            return
    if any(st.prim.lane_for is not None for st in entry.plan.steps):
        stop(entry)  # collectives: every rank must issue them in the same order, guessed or not
        return
    prim = first.prim
    try:
        kept = ARMED.setdefault(prim, [])
    except TypeError:  # a primitive of a user's that does not hash
        return
    entry.trigger = (prim, first.stream, slots)
    keep = [e for e in kept if e.trigger and e.trigger[1] is not first.stream][:PER_TRIGGER - 1]
    for e in kept:
        if e is not entry and not any(e is k for k in keep):
            _clear(e, None)  # (replaced on its stream, or one too many: it may learn again)
    kept[:] = [*keep, entry]


def enabled() -> bool:
    return ENABLED


def set_enabled(on: bool) -> None:
    """Guess or not from now on (triggers learnt so far are kept: ``eval_cache.configure`` forgets
    them when turning it off for good)."""
    global ENABLED
    ENABLED = bool(on)


def evaluated() -> None:
    """An evaluation was scheduled (``eval_cache.schedule``): watch the next node made."""
    _after[0] = None
    WATCH[0] = True  # (also while off: a program that turns it on again learns from its next step)


def stop(entry) -> None:
    """``entry`` guesses no more (evicted, wrong too often, or its launch failed)."""
    _unarm(entry, False)


def forget(entry) -> None:
    """``entry`` drops its trigger and what it kept for guessing, and may learn again (speculation
    turned off, or another plan took its place)."""
    _unarm(entry, None)


def _clear(entry, trigger) -> None:
    entry.trigger = trigger
    entry.guess = entry.spec_unit = entry.spec_datas = None


def _unarm(entry, trigger) -> None:
    trig = entry.trigger
    _clear(entry, trigger)
    if trig:
        kept = ARMED.get(trig[0])
        if kept is not None:
            kept[:] = [e for e in kept if e is not entry]
            if not kept:
                del ARMED[trig[0]]


def clear() -> None:
    """Forget every trigger (the plan cache was emptied)."""
    ARMED.clear()
    WATCH[0] = False
    _after[0] = None
