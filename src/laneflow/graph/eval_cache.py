"""The plan cache of ``lf.eval``: a step evaluated again and again runs like a compiled function.

Eager code repeats itself: a model's forward builds the same graph on every call, with other input
values. The cache keys the pending graph of one evaluation by its *structure*: per node, the
primitive's static parameters (``Primitive.cache_key``), shape, dtype, stream, which nodes or leaves
feed it, and whether anything outside the graph sees it; evaluated leaves are numbered by first
appearance, with their shape, dtype and device. Python scalar operands are keyed by type, not value:
a changed scalar value hits and runs with the new value. (tinygrad's schedule cache and MLX's CUDA
graph cache, keyed by graph topology, are the models.)

- A repeated graph is recognised without its key when it can be: a plan's first hit leaves a
  template filed under its roots' signature, and a later evaluation with such roots checks its graph
  against it node by node (``graph/eval_templates.py``) before walking and keying it (``_walk``).
- The first sighting of a structure only notes its key and evaluates as usual (one-off graphs pay
  the key, not a plan). The second builds a plan (``graph/plan.py``: the same passes and kernels as
  eager evaluation) and replays it; later ones are hits that bind the leaves and replay.
- After :data:`EXECUTOR_AFTER` hits the step runs as the backend's whole-plan executor, as
  ``lf.compile``'s plans do: one multi-lane CUDA graph on the GPU, one command that runs every numpy
  call in turn on the CPU. A hit whose scalar values differ from those the executor was made with
  replays commands instead (the graph holds its scalars).
- A step that repeats may start before its evaluation: its first op launches the executor, and the
  hit takes that launch's outputs when it would launch the same (``graph/speculate.py``).
- The cache is bounded: at most :data:`MAX_ENTRIES` plans, and at most :data:`MAX_BYTES` of device
  memory pinned by them (arenas, output sets, staging), least recently used first out.
- Graphs of one node, of more than :data:`MAX_NODES`, or holding a primitive that is not cacheable
  (a user CUDA kernel) or a multi-output one (linalg) are evaluated as usual.

``LANEFLOW_PLAN_CACHE=0`` turns the cache off at start-up; :func:`configure` sets everything at run
time (``lf.set_plan_cache``), :func:`info` reports it (``lf.plan_cache_info``).
"""

from __future__ import annotations

import collections
import os
import weakref
from operator import is_
from typing import Any

from ..runtime.lane import not_waiting
from . import eval_templates as _templates
from . import schedule as _sched
from . import speculate as _spec
from . import tape as _tape
from .node import ArrayData, LazyData, same_number
from .plan import Plan, build_plan, executor, replay_commands

#: Hits before a plan runs as the backend's whole-plan executor (a CUDA graph on the GPU).
EXECUTOR_AFTER = 2
#: Most plans kept, and most bytes of device memory they may pin together.
MAX_ENTRIES = 256
MAX_BYTES = 4 << 30
#: Graphs with fewer nodes than MIN_NODES, or more than MAX_NODES, are not cached.
MIN_NODES = 2
MAX_NODES = 20000

ENABLED = os.environ.get("LANEFLOW_PLAN_CACHE", "1") != "0"


class _Entry:
    __slots__ = ("plan", "scalars", "graph_scalars", "hits", "bytes", "stream", "need_positions", "scalar_steps",
                 "key", "template", "alive", "uses", "units", "missed", "trigger", "guess", "spec_unit",
                 "spec_datas", "spec_misses", "tape")

    def __init__(self, plan: Plan, scalars: list, stream: Any, need_positions: list):
        self.plan, self.scalars, self.stream, self.need_positions = plan, scalars, stream, need_positions
        # steps holding scalars: a replay runs copies of them made with this call's values, since a
        # command may run after the next hit has set other values (CPU lanes run behind the host)
        self.scalar_steps = [j for j, st in enumerate(plan.steps) if st.prim.scalars()]
        self.graph_scalars: list | None = None  # the scalar values the executor was made with
        self.hits = 0
        self.bytes = 0  # counted in _pinned (by _account, which also counts the arena)
        self.key: tuple = ()
        self.template = None  # its eval_templates.Template, made at its first hit
        self.alive = True  # False once evicted: a template must not lead to it any more
        self.uses: tuple | None = None  # (users per node after the graph, reads per leaf, nodes kept): _finish
        self.units: list = []  # executors of the plan besides plan.unit, each bound to other leaves (_unit_for)
        self.missed: list = []  # leaf sets (weak references to their buffers) no executor reads in place
        # speculative launch (graph/speculate.py): the trigger (primitive, stream, leaf slots it reads;
        # None: not learned, False: never), the launch made ahead (a Guess), the executor and leaves of
        # the last hit (what the next guess launches), wrong guesses in a row
        self.trigger: tuple | bool | None = None
        self.guess = None
        self.spec_unit = self.spec_datas = None
        self.spec_misses = 0
        # trace-guided replay (graph/tape.py): None (none yet), a count of failed recordings, the
        # entry's Tape, or False (never again)
        self.tape = None


_entries: "collections.OrderedDict[tuple, _Entry]" = collections.OrderedDict()
_seen: "collections.OrderedDict[tuple, None]" = collections.OrderedDict()  # keys sighted once
_pinned = [0]
STATS = {"hits": 0, "misses": 0, "sighted": 0, "bypassed": 0, "evicted": 0, "executor_runs": 0,
         "early_launches": 0}  # (graph/early.py's)
_building = [False]
#: matrix products made on launching streams since the last scheduling (``graph/early.py`` counts them)
PRODUCTS = [0]
#: True while ``graph/early.py`` launches a piece: its hits teach speculative launch nothing (the next
#: node made is the rest of the forward, and a piece's plan runs over other weights each time)
EARLY = [False]


def configure(enabled: bool | None = None, executor_after: int | None = None, max_entries: int | None = None,
              max_bytes: int | None = None, speculate: bool | None = None, tape: bool | None = None) -> None:
    """Change the plan cache's settings (None: keep). Turning it off empties it."""
    global ENABLED, EXECUTOR_AFTER, MAX_ENTRIES, MAX_BYTES
    for name, v in (("executor_after", executor_after), ("max_entries", max_entries), ("max_bytes", max_bytes)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise ValueError(f"set_plan_cache: {name} must be a non-negative int, got {v!r}")
    if enabled is not None:
        ENABLED = bool(enabled)
        if not ENABLED:
            clear()
    if executor_after is not None:
        EXECUTOR_AFTER = executor_after
    if max_entries is not None:
        MAX_ENTRIES = max_entries
    if max_bytes is not None:
        MAX_BYTES = max_bytes
    if speculate is not None:
        _spec.set_enabled(speculate)
        if not speculate:
            for e in _entries.values():
                _spec.forget(e)
            _spec.clear()
    if tape is not None:
        _tape.set_enabled(tape)
        if not tape:
            for e in _entries.values():
                _tape.forget(e)
    _evict(None)


class bypass:
    """``with eval_cache.bypass():`` evaluations inside do not use the cache (it keeps its plans):
    the uncached path, for benchmarks and tests."""

    def __enter__(self) -> None:
        _bypass[0] += 1

    def __exit__(self, *exc: object) -> None:
        _bypass[0] -= 1


_bypass = [0]


def clear() -> None:
    """Drop every cached plan (their memory is freed once their last launch is done)."""
    for e in _entries.values():
        e.alive = False
        _spec.forget(e)
        _tape.forget(e)
    _entries.clear()
    _seen.clear()
    _templates.TEMPLATES.clear()
    _spec.clear()
    _tape.clear()
    _pinned[0] = 0


def info() -> dict:
    """The settings, the entries and bytes held, and the counters since the start."""
    return {"enabled": ENABLED, "executor_after": EXECUTOR_AFTER, "max_entries": MAX_ENTRIES, "max_bytes": MAX_BYTES,
            "speculate": _spec.ENABLED, "tape": _tape.ENABLED, "entries": len(_entries), "pinned_bytes": _pinned[0],
            **STATS, **_spec.STATS, **_tape.STATS, "tapes": sum(map(len, _tape.TAPES.values())),
            "tape_last_failure": _tape.LAST_FAILURE[0], "tape_last_divergence": _tape.LAST_DIVERGENCE[0],
            "executors": sum(1 + len(e.units) for e in _entries.values() if e.plan.unit)}


_CONSTANT = object()  # _walk's answer for a graph holding host data (uploaded first: run)
_BYPASS = object()  # _walk's answer for a graph holding a node the cache cannot key


def _walk(roots) -> tuple | object | None:
    """The pending nodes needed by ``roots`` in dependency order, together with their structure, in
    one pass: ``(order, (key, leaves, scalars, dep))``. The key: per node, the primitive's cache key
    (``Primitive.cache_info``), shape, dtype, stream, references to its inputs, ``users`` and whether
    an array holds it; per leaf, shape, dtype and device. ``dep[k]``: node k depends on a leaf. None
    when the graph is too small or too large for the cache, ``_BYPASS`` when it holds a node the
    cache cannot key (a primitive that is not cacheable, a multi-output node), ``_CONSTANT`` when it
    holds host data still to upload.

    On a hit this pass is all the work the cache does before replaying, so it does the toposort's
    search and the key's reading of each node at once: a node's entry is made from the references
    collected while its inputs were visited (an emitted node's position, or a leaf's number by first
    appearance, negative), and nothing is walked twice."""
    if len(roots) == 1:  # the common eager case: one new node over evaluated inputs
        root = roots[0]
        if root.__class__ is LazyData or root.buffer is not None:
            return None
        for i in root.inputs:
            if i.buffer is None:
                break
        else:
            return None
    pos: dict = {}  # an emitted node -> its position; a leaf -> -1 - its number
    order: list = []
    leaves: list = []
    parts: list = []  # per node: (cache key, shape, dtype, stream, references, users, seen by an array)
    fixed: list = []  # (position, scalar values) of nodes that depend on no leaf
    scalars: list = []
    dep: list = []  # does node k depend on a leaf (else it is computed once and kept by the plan)
    get, emit, add = pos.get, order.append, parts.append
    for root in roots:
        if root.__class__ is LazyData or root.buffer is not None or root in pos:
            continue
        # frames: [node, inputs, index of the next input, references so far, depends on a leaf]
        stack = [[root, root.inputs, 0, [], False]]
        while stack:
            top = stack[-1]
            d, ins, k, refs, depends = top
            n = len(ins)
            while k < n:
                i = ins[k]
                j = get(i)
                if j is None:
                    if i.buffer is not None or i.__class__ is LazyData:
                        j = pos[i] = -1 - len(leaves)
                        leaves.append(i)
                    else:  # visit it first; this input is read again once it is emitted
                        top[2] = k
                        top[4] = depends
                        stack.append([i, i.inputs, 0, [], False])
                        break
                k += 1
                refs.append(j)
                if not depends and (j < 0 or dep[j]):
                    depends = True
            else:
                p = d.prim
                try:
                    pk, sc = p._ck
                except AttributeError:
                    if p.kind == "constant":
                        return _CONSTANT
                    if not p.cacheable:
                        return _BYPASS
                    pk, sc = p.cache_info()
                if d.siblings is not None:
                    return _BYPASS
                pos[d] = len(order)
                emit(d)
                dep.append(depends)
                if sc:
                    vals = [x.value for x in sc]
                    if depends:
                        scalars.extend(vals)
                    else:  # a node computed once at the plan's build: its scalar values are part of the key
                        fixed.append((len(order) - 1, tuple(vals)))
                add((pk, d.shape, d.dtype, d.stream, tuple(refs), d.users, d.arrays > 0))
                stack.pop()
        if len(order) > MAX_NODES:
            return None
    if len(order) < MIN_NODES:
        return None
    key = (tuple(parts), tuple(fixed), tuple([(x.shape, x.dtype, x.device) for x in leaves]))
    return order, (key, leaves, scalars, dep)


def schedule(roots) -> None:
    """Submit every pending node needed by ``roots``: through a cached plan when this structure was
    seen before, else one command each. Returns without waiting for the work. The next node made may
    start a step that repeats (``graph/speculate.py``)."""
    with _sched.LOCK:
        looked = ENABLED and not _bypass[0] and not _building[0]  # (whether a plan may be hit)
        try:
            _schedule(roots)
        finally:
            if not EARLY[0]:  # (an early-launched piece is mid-forward: its next node starts nothing)
                _spec.evaluated()
                _tape.evaluated(looked)


def _schedule(roots) -> None:
    """``schedule``'s work, under its lock."""
    PRODUCTS[0] = 0
    if ENABLED and not _bypass[0] and not _building[0]:
        found = _tape.found(roots) if _tape.STATE[0] is not None else None  # (a step replayed whole)
        if found is None:
            found = _templates.find(roots)
        if found is not None:
            t, m = found
            _entries.move_to_end(t.entry.key)
            _hit(t.entry, *m)
            return
        w = _walk(roots)
        if w is _CONSTANT:
            # host data in the graph is a value: upload it first, so that it is a leaf of the plan
            for d in _sched.toposort(roots):
                if d.prim.kind == "constant":
                    _sched.schedule_one(d)
            w = _walk(roots)
        if w.__class__ is tuple:
            order, s = w
            if not _run_structure(roots, order, s):
                _sched.execute(order)
            return
        if w is _BYPASS:
            STATS["bypassed"] += 1
    _sched.execute(_sched.toposort(roots))


def start(roots) -> None:
    """``schedule(roots)`` for a caller that will not wait (``lf.async_eval``, an early launch): no
    command is left for this thread to run (``CALLER.collect``)."""
    with not_waiting(), _sched.LOCK:  # (bindings read where no other thread reuses their buffers in place)
        schedule(roots)


def building() -> bool:
    """Whether a plan is being built (its first run evaluates nodes one at a time)."""
    return _building[0]


def _run_structure(roots, order: list, s: tuple) -> bool:
    """Evaluate the pending nodes ``order`` (inputs first; ``s``: their structure, from ``_walk``)
    through the cache; False when the caller must schedule them as usual (the first sighting of this
    structure, or a key that does not hash)."""
    key, leaves, scalars, dep = s
    try:
        entry = _entries.get(key)
    except TypeError:  # a parameter that does not hash (a primitive of a user's): not cacheable
        STATS["bypassed"] += 1
        return False
    if entry is None:
        if key not in _seen:
            _seen[key] = None
            if len(_seen) > 4 * MAX_ENTRIES:
                _seen.popitem(last=False)
            STATS["sighted"] += 1
            return False
        del _seen[key]
        entry = _build(roots, order, leaves, dep, key)
        STATS["misses"] += 1
        _run_commands(entry, order, leaves)
        return True
    _entries.move_to_end(key)
    _templates.remember(entry, roots, order, dep, MAX_ENTRIES)
    _hit(entry, order, leaves, scalars)
    return True


def _hit(entry: _Entry, order: list, leaves: list, scalars: list) -> None:
    """Replay ``entry``'s plan for the graph ``order`` with these leaves and scalar values."""
    STATS["hits"] += 1
    entry.hits += 1
    if not EARLY[0]:  # a step taped (graph/tape.py): its recording or replay ends at this hit
        if _tape.STATE[0] is not None or _tape.PROBED[1]:
            _tape.hit(entry, order, leaves)
        if _tape.untaped(entry):
            _tape.want(entry)
    for obj, v in zip(entry.scalars, scalars):
        obj.value = v
    plan = entry.plan
    lease = None
    guess = entry.guess  # a launch made ahead of this evaluation (graph/speculate.py)
    if guess is not None:
        entry.guess = None
    if entry.hits > EXECUTOR_AFTER and plan.unit is not False:
        if plan.unit is None:
            plan.calls = max(plan.calls, 2)
            if executor(plan, entry.stream):
                entry.graph_scalars = scalars
                _account(entry)
        unit = plan.unit
        if unit and _same_scalars(scalars, entry.graph_scalars):
            try:
                if getattr(unit, "misses", None) is not None:
                    unit = _unit_for(entry, unit, leaves)
                if guess is not None:
                    lease = _spec.take(entry, guess, unit, leaves)
                    guess = None  # (its outputs, if not taken, are dropped before this launch picks a set)
                if lease is None:
                    lease = unit.run(leaves, entry.stream)
            except Exception as e:  # noqa: BLE001 - capture failed: replay commands from now on
                if unit is plan.unit:
                    plan.unit, plan.unit_note = False, f"{type(e).__name__}: {e}"
                    entry.units = []
                else:  # one of the extra executors (_unit_for): only it goes
                    entry.units = [u for u in entry.units if u is not unit]
                _account(entry)
                lease = None
            else:
                if getattr(unit, "launches", 0) <= OUTPUT_SETS_MADE:  # its output sets come at its first launches
                    _account(entry)
    if guess is not None:
        _spec.missed(entry)
    if lease is None:
        _run_commands(entry, order, leaves)
        return
    if not EARLY[0]:
        _spec.learn(entry, unit, order, leaves)
    STATS["executor_runs"] += 1
    specs = lease.specs
    outs = []
    for ref, *_ in plan.outputs:
        outs.append(lease.buffer_of(specs[ref[1]]) if ref[0] == "slot" else _const_buffer(ref[1]))
    _finish(order, leaves, entry, outs)


def _same_scalars(now: list, then: list | None) -> bool:
    """Whether the scalar values ``now`` are those an executor holds: equal, with the signs of zeros
    too (``x * -0.0`` is not ``x * 0.0``; lists compare ``-0.0 == 0.0``, ``-0j == 0j``)."""
    if now != then:
        return False
    for a, b in zip(now, then):  # (the same object is the same bits: most are a program's constants)
        if a is not b and not same_number(a, b):
            return False
    return True


#: executors one plan may have, each reading its own set of leaves in place (below). Each keeps the
#: buffers it reads in place alive (as the plan's first one always has) until the plan is evicted.
MAX_UNITS = 8
#: an executor's memory is counted again after each of its first launches, which make its output
#: sets (a CUDA graph keeps up to two; ``cudagraph/outputs.py``) and staging buffers
OUTPUT_SETS_MADE = 3


def _unit_for(entry: _Entry, unit, leaves: list):
    """The executor of ``entry``'s plan to run these leaves on. An executor reads the buffers it was
    first run with in place and copies any other in (``misses``): right for a step given new inputs
    and the same weights, wrong for one structure run over several weight sets, as an eager forward
    launched in pieces is (``graph/early.py``: GPT-2's pieces of two blocks each are one plan, run four
    times a forward with other weights; on one executor each launch copied its blocks' weights in).
    So when most leaves differ from every executor's and mostly the same leaves were seen before (a
    weight set that recurs, not a call's fresh inputs), the plan gets another executor (up to MAX_UNITS),
    bound to these leaves; otherwise the one that copies least runs."""
    miss = unit.misses(leaves)
    if not miss:
        return unit
    best, least = unit, miss
    units = entry.units
    for u in units:
        m = u.misses(leaves)
        if m < least:
            best, least = u, m
            if not m:
                break
    if least * 2 > len(leaves) and len(units) + 1 < MAX_UNITS:
        seen, missed = [d.buffer for d in leaves], entry.missed
        for k, was in enumerate(missed):  # mostly the same live buffers as a set seen before: it recurs
            if sum(map(is_, seen, [r() for r in was])) * 2 > len(seen):
                del missed[k]
                break
        else:
            missed.append([weakref.ref(b) for b in seen])  # (fresh inputs die: never seen again)
            del missed[:-MAX_UNITS]
            return best
        made = entry.stream.backend.graph_plan(entry.plan, entry.stream)
        if made is not None:
            units.append(made)
            best = made
            _account(entry)
    return best


def _build(roots, order: list, leaves: list, dep: list, key: tuple) -> _Entry:
    """The plan of this structure, built from this graph (on its second sighting)."""
    at = {d: k for k, d in enumerate(order)}
    internal = [0] * len(order)  # uses inside the graph: a node used more is needed outside it
    for d in order:
        for i in d.inputs:
            k = at.get(i)
            if k is not None:
                internal[k] += 1
    wanted = set(map(id, roots))
    need_positions = [k for k, d in enumerate(order) if id(d) in wanted or d.arrays or d.users > internal[k]]
    for d in order:  # the plan's primitives hold Scalar objects of their own, which hits set
        if d.prim.scalars():
            d.prim = d.prim.with_own_scalars()
    # the Scalar objects of the steps that depend on a leaf, in the order _walk reads values
    scalars = [s for d, dk in zip(order, dep) if dk for s in d.prim.scalars()]
    _building[0] = True
    try:
        plan = build_plan([order[k] for k in need_positions], leaves, None)
    finally:
        _building[0] = False
    plan.calls = 1
    entry = _Entry(plan, scalars, order[need_positions[0]].stream, need_positions)
    entry.key = key
    _entries[key] = entry
    _account(entry)
    return entry


def _run_commands(entry: _Entry, order: list, leaves: list) -> None:
    plan = entry.plan
    slots: list = [None] * plan.n_slots
    steps = plan.steps
    prims = {j: steps[j].prim.with_own_scalars() for j in entry.scalar_steps} if entry.scalar_steps else None
    replay_commands(plan, leaves, slots, prims)
    outs = [slots[ref[1]] if ref[0] == "slot" else _const_buffer(ref[1]) for ref, *_ in plan.outputs]
    _finish(order, leaves, entry, outs)


def _const_buffer(d: ArrayData):
    """A value the plan computed once (it depends on no leaf): shared with this evaluation's node,
    so it must never be written in place."""
    b = d.buffer
    b.exported = True
    return b


def _finish(order: list, leaves: list, entry: _Entry, outs: list) -> None:
    """Give the needed nodes their buffers and let the graph go, as eager scheduling leaves it: each
    node without primitive and inputs, and each node and leaf used by one user less per read by a node
    of the graph (on a hit, counts that the key fixes: ``entry.uses``)."""
    for k, b in zip(entry.need_positions, outs):
        order[k].buffer = b
    if not entry.hits:  # the plan's build evaluated some nodes (and let their inputs go) already
        for d in order:
            for i in d.inputs:
                i.users -= 1
            d.prim = None
            d.inputs = ()
        return
    uses = entry.uses
    if uses is None:
        uses = entry.uses = _uses(entry.key, order, entry.need_positions)
    users, reads, kept = uses
    # Only the nodes that outlive the evaluation are let go field by field: the others are held by
    # nothing but the graph itself (no array, no user outside it) and die with it.
    for k in kept:
        d = order[k]
        d.users = users[k]
        d.prim = None
        d.inputs = ()
    for x, n in zip(leaves, reads):
        x.users -= n


def _uses(key: tuple, order: list, need_positions: list) -> tuple:
    """From a key: per node, its users once the graph's own reads are gone; per leaf, its reads; the
    positions of the nodes that outlive the graph: those needed outside it, and every output of a
    multi-output primitive (a needed one holds its siblings)."""
    ents, _, meta = key
    users = [e[5] for e in ents]
    reads = [0] * len(meta)
    for e in ents:
        for j in e[4]:
            if j >= 0:
                users[j] -= 1
            else:
                reads[-1 - j] += 1
    kept = sorted(set(need_positions) | {k for k, d in enumerate(order) if d.siblings is not None})
    return users, reads, kept


def _account(entry: _Entry) -> None:
    plan = entry.plan
    n = plan.memory.arena_bytes if plan.memory is not None else 0
    for unit in (plan.unit, *entry.units):
        if unit:
            st = unit.stats()
            n += st.get("output_bytes", 0) * st.get("output_sets", 1) + st.get("kept_bytes", 0)
    _pinned[0] += n - entry.bytes
    entry.bytes = n
    _evict(entry)


def _evict(keep: _Entry | None) -> None:
    while _entries and (len(_entries) > MAX_ENTRIES or _pinned[0] > MAX_BYTES):
        k, e = next(iter(_entries.items()))
        if e is keep:
            if len(_entries) == 1:
                break
            _entries.move_to_end(k)
            continue
        del _entries[k]
        _templates.forget(e)
        _spec.stop(e)
        _tape.forget(e)
        _pinned[0] -= e.bytes
        STATS["evicted"] += 1
