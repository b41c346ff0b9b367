"""The command encoder: the one place that knows about hazards, lanes and waits.

Ops only say which buffers a command reads and writes. For each command the encoder

1. collects the hazards: read-after-write and write-after-write wait on the buffer's last writer;
   write-after-read waits on every reader since that write; read-after-read needs nothing;
2. picks a lane through a :class:`LanePolicy`;
3. enqueues a wait for each dependency on another lane that the lane's vector clock does not already
   cover (a wait implied by an earlier one is elided), keeping only the latest point per lane;
4. submits the command and records it as the new writer / a new reader of its buffers.

The encoder is not thread-safe by itself; :mod:`laneflow.graph.schedule` calls it under :data:`LOCK`,
which :meth:`Stream.close <laneflow.runtime.stream.Stream.close>` takes too.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

from . import tracing
from .buffer import Buffer
from .lane import Command, Lane, Point
from .stats import STATS

#: The process-wide lock under which commands are encoded (and streams closed, so no command is ever
#: queued behind a closed lane's stop). Re-entrant: scheduling nests.
LOCK = threading.RLock()


class LanePolicy:
    """Chooses the lane for a command. Replace it to try a better scheduler."""

    def choose(self, lanes: Sequence[Lane], producers: Sequence[Lane]) -> Lane:
        raise NotImplementedError


class GreedyPolicy(LanePolicy):
    """The single producer's lane when there is exactly one (no wait needed), else the least-loaded lane.
    A producer counts only while it is the last command of its lane, so the consumers of one value
    (fan-out) continue its lane once and otherwise spread over the least-loaded lanes.

    Ties between equally loaded lanes rotate, so bursts of independent commands spread out.
    """

    #: after a choice, start the next search at the following lane (False: at the chosen one)
    rotate = True

    def __init__(self) -> None:
        self._next = 0

    def choose(self, lanes: Sequence[Lane], producers: Sequence[Lane]) -> Lane:
        n = len(lanes)
        if n == 1:
            return lanes[0]
        if len(producers) == 1:
            return producers[0]
        start = self._next
        best, best_load = None, None
        for k in range(n):
            lane = lanes[(start + k) % n]
            load = lane.pending()
            if best_load is None or load < best_load:
                best, best_load = lane, load
                if load == 0:
                    break
        self._next = (best.index + 1) % n if self.rotate else best.index
        return best


class StickyPolicy(GreedyPolicy):
    """:class:`GreedyPolicy` that keeps using an idle lane instead of rotating to the next idle one.

    When the host is the bottleneck every lane is idle by the time the next command comes, and
    rotating only adds cross-lane waits (on the H200 the 4-lane eager MoE demo ran at 0.84x of one
    lane); this policy then stays on one lane. Work that keeps lanes busy still spreads, because a busy
    lane is never the least loaded. Opt-in (``lf.new_stream(..., policy="sticky")`` or
    ``LANEFLOW_LANE_POLICY=sticky``): measured on the H200 it did no better than greedy (the demo at
    0.86x of one lane against greedy's 0.87x; docs/perf/HISTORY.md).
    """

    rotate = False


POLICIES = {"greedy": GreedyPolicy, "sticky": StickyPolicy}


class CommandEncoder:
    """Per stream: takes commands with their read and write buffers, picks lanes, emits waits."""

    def __init__(self, lanes: Sequence[Lane], policy: LanePolicy | None = None):
        self.lanes = list(lanes)
        self.stream_id = self.lanes[0].stream_id
        self.policy = policy or GreedyPolicy()

    def encode(self, op: str, fn: Callable[[Lane], object], reads: Sequence[Buffer],
               writes: Sequence[Buffer], lane: Lane | None = None, settled: Sequence[Buffer] = ()) -> Point:
        """Submit one command, ``fn(lane)``; returns its point. ``lane`` forces a lane (tests, compile).

        ``settled`` (with ``lane``): more buffers the command reads that need no checks, only their
        reader entries: the caller knows ``lane`` already follows their writers and that they carry no
        error or pending check (a compiled call whose arguments are the last call's, with the same
        writers: ``backends/cuda/cudagraph/``)."""
        return self.submit(Command(op, fn, reads, writes), lane, settled)

    def submit(self, cmd: Command, lane: Lane | None = None, settled: Sequence[Buffer] = ()) -> Point:
        """Submit ``cmd`` (its reads and writes set; a kernel's command carries its arguments in
        slots, so no closure is made per command): hazards, lane, waits, then the lane."""
        reads, writes = cmd.reads, cmd.writes
        if lane is None and len(self.lanes) == 1:
            lane = self.lanes[0]
        counts = _hazards_on(lane, reads, writes) if lane is not None else None
        if counts is not None:
            # Fast path (one-lane streams, compile's launches): every hazard is on this lane, where
            # program order covers it, or already covered by its clock, so there is nothing to wait
            # for and the clock stays.
            stats = STATS
            raw, waw, war, covered = counts
            if raw:
                stats.raw += raw
            if waw or war:
                stats.waw += waw
                stats.war += war
            stats.same_lane_deps += raw + waw + war - covered
            if covered:
                stats.waits_elided += covered
        else:
            lane = self._place(reads, writes, lane)
        seq = cmd.seq = lane.submitted = lane.submitted + 1  # (also the per-lane command count: stats)
        point = Point(lane, seq, lane.clock)
        for b in reads:
            b.readers[lane] = point
        for b in writes:
            b.writer = point
            if b.readers:
                b.readers = {}  # a new dict: a reader's point never refers to it
        sink = tracing.active
        if sink is not None:
            sink.enqueued(lane, cmd)
        if not settled:
            lane._enqueue(cmd)  # Lane.submit, without the extra call
            return point
        # Settled reads (a compiled launch's tens of weights) need no checks, only their reader entries,
        # which nothing reads before the next submission (the caller holds the scheduler's lock and keeps
        # them alive): recorded after the launch, so the GPU starts sooner (a speculated eager step's
        # launch is on its critical path: graph/speculate.py).
        try:
            lane._enqueue(cmd)
        finally:
            for b in settled:
                b.readers[lane] = point
            for b in writes:  # (one also read: written last, as above; writes are a few regions)
                if b.readers:
                    b.readers = {}
        return point

    def _place(self, reads: Sequence[Buffer], writes: Sequence[Buffer], lane: Lane | None) -> Lane:
        """The general case: collect the hazards, pick the lane, emit the waits it needs."""
        deps: dict[Lane, Point] = {}
        producers: list[Lane] = []
        stats = STATS
        sid = self.stream_id
        elided = 0
        dups = None  # lane -> points on it that a later point on it implies
        raw = waw = war = 0
        for b in reads:
            w = b.writer
            if w is not None:
                raw += 1
                wl = w.lane
                old = deps.get(wl)
                if old is None:
                    deps[wl] = w
                else:  # keep only the latest point per lane: the earlier one is implied
                    if dups is None:
                        dups = {}
                    dups[wl] = dups.get(wl, 0) + 1
                    if w.seq > old.seq:
                        deps[wl] = w
        # Producers: lanes whose latest read dependency is still their last command. One whose lane
        # has moved on (fan-out: an earlier consumer continued there) does not pull this command onto
        # its lane, so independent consumers spread out.
        for wl, w in deps.items():
            if wl.stream_id == sid and w.seq == wl.submitted:
                producers.append(wl)
        for b in writes:
            w = b.writer
            if w is None and not b.readers:
                continue  # a fresh output: nothing to order after
            pts = list(b.readers.values())
            war += len(pts)
            if w is not None:
                waw += 1
                pts.append(w)
            for p in pts:
                pl = p.lane
                old = deps.get(pl)
                if old is None:
                    deps[pl] = p
                else:
                    dups = _dup(dups, pl)
                    if p.seq > old.seq:
                        deps[pl] = p
        if raw:
            stats.raw += raw
        if waw or war:
            stats.waw += waw
            stats.war += war

        if lane is None:
            lanes = self.lanes
            lane = lanes[0] if len(lanes) == 1 else self.policy.choose(lanes, producers)
        if dups is not None:  # implied points on other lanes are elided waits; on this lane, program order
            for dl, n in dups.items():
                if dl is lane:
                    stats.same_lane_deps += n
                else:
                    elided += n
        clock = lane.clock
        changed = None
        for dl, p in deps.items():
            if dl is lane:
                stats.same_lane_deps += 1
            elif (changed or clock).get(dl, 0) >= p.seq:
                elided += 1
            else:
                lane.wait(p)
                stats.waits_emitted += 1
                if changed is None:
                    changed = dict(clock)
                for k, v in p.clock.items():
                    if changed.get(k, 0) < v:
                        changed[k] = v
                if changed.get(dl, 0) < p.seq:
                    changed[dl] = p.seq
        if changed is not None:
            lane.clock = changed
        if elided:
            stats.waits_elided += elided

        return lane


def _hazards_on(lane: Lane, reads, writes) -> tuple[int, int, int, int] | None:
    """(RAW, WAW, WAR, covered) counts when every point the command must follow is on ``lane`` or
    already covered by its clock (``covered``: those on other lanes, waits elided), else None."""
    raw = waw = war = covered = 0
    clock = lane.clock
    for b in reads:
        w = b.writer
        if w is not None:
            if w.lane is not lane:
                if clock.get(w.lane, 0) < w.seq:
                    return None
                covered += 1
            raw += 1
    for b in writes:
        w = b.writer
        if w is not None:
            if w.lane is not lane:
                if clock.get(w.lane, 0) < w.seq:
                    return None
                covered += 1
            waw += 1
        rd = b.readers
        if rd:
            for rl, p in rd.items():
                if rl is not lane:
                    if clock.get(rl, 0) < p.seq:
                        return None
                    covered += 1
                war += 1
    return raw, waw, war, covered


def _dup(dups: dict | None, lane: Lane) -> dict:
    if dups is None:
        dups = {}
    dups[lane] = dups.get(lane, 0) + 1
    return dups
