"""CUDA lanes: one non-blocking CUDA stream each, with a fence made of pooled CUDA events.

A lane enqueues a command at once (``cmd.run`` launches onto the stream from the host) and records
an event right after it, so every point ``(lane, seq)`` has an event: another CUDA lane waits on it
with ``cuStreamWaitEvent`` (on the device, never the host), the host waits with
``cuEventSynchronize``, and ``fence.value`` polls events oldest first. Events have timing disabled
and return to a per-device pool once they are known complete. Recording one event per command costs
one driver call (well under a microsecond of host time); it is what lets any later wait, also one a
CPU worker makes long after, target exactly that command and nothing after it.

A wait on a point of a CPU lane never spins a kernel: the stream waits on a pinned host word
(``cuStreamWaitValue64``) that a helper thread sets once the CPU lane has passed the point
(:mod:`.hostsync`).
"""

from __future__ import annotations

import collections
import os
import threading
import time

import numpy as np
from cuda.bindings import driver as cu

from ...errors import LaneflowError
from ...runtime import delays, tracing
from ...runtime.lane import Command, Lane, Point
from .driver import NOT_READY, DeviceContext, check, fail
from .kernels.misc import gpu_sleep

_DISABLE_TIMING = cu.CUevent_flags.CU_EVENT_DISABLE_TIMING.value
_NOT_READY = int(NOT_READY)


class EventPool:
    """Reusable CUDA events of one device (creating one costs a driver call and memory)."""

    def __init__(self, ctx: DeviceContext):
        self.ctx = ctx
        self._free: list = []

    def get(self):
        try:
            return self._free.pop()
        except IndexError:
            self.ctx.ensure_current()
            return check(cu.cuEventCreate(_DISABLE_TIMING), "cuEventCreate")

    def put(self, ev) -> None:
        self._free.append(ev)


#: A lane records an event after every MARK_EVERY-th command by itself (so ``value`` and the lane's
#: load advance); any other point gets one when something needs it (a wait, a host read, a free).
#: The default, 16, saved about 40 % of the host time of an unfused tiny-op chain on the fake driver and
#: about a quarter of an uncached add on an H100 (docs/perf/HISTORY.md, sections 31-32); it passed the
#: whole GPU suite and the GPU fuzz (2026-12-05, H100). ``LANEFLOW_MARK_EVERY=1`` records after every
#: command (the old default): a lane's ``value`` then advances command by command, and a buffer's
#: pending device checks are retired sooner (up to MARK_EVERY of them ride along otherwise).
MARK_EVERY = max(1, int(os.environ.get("LANEFLOW_MARK_EVERY", "16")))

#: The C enqueue (``cenqueue.c``: ``enqueue(lane, cmd) -> bool``) that lanes made from now on keep as
#: ``enqueue_fast``, which the C submit path calls first; the backend installs it where it builds (None:
#: every command through ``_enqueue``; tests compare the two)
ENQUEUE_FAST = None


class EventFence:
    """A lane's timeline: ``value`` is the last sequence number known to have finished on the GPU.

    Events are recorded lazily: ``mark`` notes that a command was enqueued, and records an event only
    every :data:`MARK_EVERY` commands; ``event_for`` and ``wait`` record one when the point they need
    has none yet. An event recorded later than its command covers it (stream order), and is recorded
    before the lane's next command is enqueued whenever the encoder asks (it asks for the latest point
    of a producer), so no wait is later than needed."""

    __slots__ = ("ctx", "pool", "_marks", "_done", "_lock", "_syncing", "_spare", "_record", "_query", "_stream",
                 "_last", "_marked")

    def __init__(self, ctx: DeviceContext, pool: EventPool, stream: int = 0):
        self.ctx = ctx
        self.pool = pool
        self._record, self._query = ctx.calls.record, ctx.calls.query
        self._marks: collections.deque = collections.deque()  # (seq, event), oldest first
        self._done = 0
        self._lock = threading.Lock()
        self._syncing = 0
        self._spare: list = []
        self._stream = stream  # the lane's raw stream handle
        self._last = 0         # the last command enqueued on the lane
        self._marked = 0       # the last command an event was recorded after

    def mark(self, seq: int, stream) -> None:
        """Command ``seq`` is enqueued on the lane (``stream``, its raw handle)."""
        self._last = seq
        if seq - self._marked >= MARK_EVERY:
            self._record_now()

    def _record_now(self, hold: bool = False) -> tuple:
        """Record an event covering every command enqueued so far; returns (seq, event). ``hold``: the
        caller will synchronise on it (counted under the lock, so it is not recycled meanwhile)."""
        with self._lock:
            seq = self._last
            if hold:
                self._syncing += 1
            if self._marks and (self._marks[-1][0] >= seq or self._stream is None):
                return self._marks[-1]  # (a destroyed lane's last mark covers all it ever ran)
            if self._stream is None:  # destroyed with everything known finished: nothing to wait for
                if hold:
                    self._syncing -= 1
                self._done = max(self._done, seq)
                return seq, None
            ev = self.pool.get()
            err = self._record(ev, self._stream)
            if err:
                self.pool.put(ev)
                if hold:
                    self._syncing -= 1
                fail(err, "cuEventRecord")
            self._marks.append((seq, ev))
            self._marked = seq
            n = len(self._marks)
        if n > 64:
            self.value  # retire finished marks so events recycle and the deque stays short
        return seq, ev

    def retire(self) -> None:
        """The lane's stream is about to be destroyed: record a last event covering everything it ran
        (later waits and frees use it), and record no more."""
        if self._last > self._marked:
            self._record_now()
        self._stream = None

    def pin(self, seq: int) -> None:
        """A CPU worker will wait for ``seq`` later: record its event now, while nothing later that
        could wait on that worker is in the stream (``Fence.pin``)."""
        if self._done < seq:
            self.event_for(seq)

    def known(self, seq: int) -> bool:
        """True if seq is already known finished (no driver call)."""
        return self._done >= seq

    @property
    def value(self) -> int:
        with self._lock:
            marks = self._marks
            if marks:
                for _ in range(_finished(marks, self._query)):
                    seq, ev = marks.popleft()
                    self._done = seq
                    self._recycle(ev)
            return self._done

    def signal(self, value: int) -> None:
        raise LaneflowError("a CUDA lane's fence is signalled by the GPU, not by the host")

    def event_for(self, seq: int):
        """An event recorded after command seq (recorded now if there is none yet; None when seq is
        known finished)."""
        with self._lock:
            if self._done >= seq:
                return None
            for s, ev in self._marks:
                if s >= seq:
                    return ev
        self.ctx.ensure_current()  # (asked by another device's lane, or a free: its context may be current)
        return self._record_now()[1]

    def wait(self, value: int, timeout: float | None = None) -> bool:
        if self._done >= value:
            return True
        target = None
        with self._lock:
            if self._done >= value:
                # Learned meanwhile (another thread polled ``value``): the point's event is gone, and a
                # later one (or one recorded now, at the stream's tail) could wait for work queued after
                # a wait on the waiting thread's own lane (a CPU worker): a deadlock.
                return True
            for s, ev in self._marks:
                if s >= value:
                    target = (s, ev)
                    self._syncing += 1
                    break
        self.ctx.ensure_current()
        if target is None:
            if value > self._last:
                # Never enqueued (its submission failed): False, but only once what was enqueued before
                # it has run (a point implies its lane's earlier commands; a waiter relies on that).
                if self._last:
                    self.wait(self._last, timeout)
                return False
            target = self._record_now(hold=True)
            if target[1] is None:  # a destroyed lane with nothing left to wait for
                return True
        try:
            s, ev = target
            if timeout is None:
                check(cu.cuEventSynchronize(ev), "cuEventSynchronize")
            else:
                deadline = time.monotonic() + timeout
                pause = 20e-6
                while True:
                    err = self._query(ev)
                    if err != _NOT_READY:
                        if err:
                            fail(err, "cuEventQuery")
                        break
                    if time.monotonic() >= deadline:
                        return False
                    time.sleep(pause)
                    pause = min(pause * 2, 1e-3)
        finally:
            with self._lock:
                self._syncing -= 1
                if self._syncing == 0 and self._spare:
                    for e in self._spare:
                        self.pool.put(e)
                    self._spare.clear()
        with self._lock:
            marks = self._marks
            while marks and marks[0][0] <= s:
                _, e = marks.popleft()
                self._recycle(e)
            if s > self._done:
                self._done = s
        return True

    def _recycle(self, ev) -> None:
        # An event another thread is synchronising on must not be re-recorded under it.
        if self._syncing:
            self._spare.append(ev)
        else:
            self.pool.put(ev)

    def __repr__(self) -> str:
        return f"EventFence(done={self._done}, marked={len(self._marks)})"


def _finished(marks: collections.deque, query) -> int:
    """How many of ``marks`` (one stream's events, oldest first) have finished. Events of one stream
    finish in the order recorded, so the oldest pending answers a lane that is behind with one query,
    the newest done one that keeps up (two queries for up to 65 events), and a bisection the rest."""
    def done(k: int) -> bool:
        err = query(marks[k][1])
        if err == _NOT_READY:
            return False
        if err:
            fail(err, "cuEventQuery")
        return True

    n = len(marks)
    if not done(0):
        return 0
    if n == 1 or done(n - 1):
        return n
    lo, hi = 1, n - 1  # marks[lo - 1] finished, marks[hi] not
    while lo < hi:
        mid = (lo + hi) // 2
        if done(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


class CudaLane(Lane):
    """A lane on its own non-blocking CUDA stream."""

    def __init__(self, ctx: DeviceContext, device, stream_id: int, index: int):
        super().__init__(device, stream_id, index)
        ctx.ensure_current()
        self.ctx = ctx
        self.stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING.value), "cuStreamCreate")
        self.handle = int(self.stream)  # for library calls that take a raw stream
        self.fence = EventFence(ctx, ctx.events, self.handle)
        self.closed = False
        self.closing = False  # close() was called: the stream is destroyed at the next safe point
        # free memory only this lane used, by size (``memory.Memory.take``/``give``): reused in stream
        # order with no driver call; ``cached`` counts its bytes
        self.blocks: dict[int, list[int]] = {}
        self.cached = 0
        #: a primitive's command's enqueue in C (``cenqueue.c``), which the C submit path calls first
        self.enqueue_fast = ENQUEUE_FAST

    def _enqueue(self, cmd: Command) -> None:
        ctx = self.ctx
        ctx.ensure_current()
        mem = ctx.memory
        if mem.pending or mem.waiting or mem.retired:
            mem.collect()
        if mem.foreign:  # another library's memory whose laneflow users may have finished
            mem.collect_foreign()
        hook = delays._hook  # delays.current(), without the call
        if hook is not None:
            d = hook()
            if d > 0:
                gpu_sleep(self, d)
        try:
            for b in cmd.writes:
                h = b.data
                h.host = None
                if h.ptr == 0 and h.nbytes:
                    mem.allocate(h, self, cmd.op)
            for b in cmd.reads:
                # Host memory a CPU lane is still writing: a copy must not read it before that ends.
                w = b.writer
                if w is not None and type(b.data) is np.ndarray and not isinstance(w.lane, CudaLane):
                    w.lane.host_wait(w.seq)
        except LaneflowError as e:
            for b in cmd.writes:
                b.error = e
        else:
            sink = tracing.active
            if sink is None:
                cmd.run(self)
            else:
                _traced_run(self, cmd, sink)
        self.fence.mark(cmd.seq, self.handle)

    def _enqueue_wait(self, point: Point) -> None:
        other = point.lane
        # Waits are encoded before the command (whose _enqueue makes the context current), maybe right
        # after work on another GPU: this lane's context is made current first.
        if isinstance(other, CudaLane):
            ev = other.fence.event_for(point.seq)  # (another GPU's event is legal; its context records it)
            if ev is not None:
                self.ctx.ensure_current()
                err = self.ctx.calls.wait_event(self.handle, ev)
                if err:
                    fail(err, "cuStreamWaitEvent")
        elif other.fence.value < point.seq:
            self.ctx.ensure_current()
            self.ctx.host_waits.gpu_wait(self.stream, point)

    def close(self) -> None:
        # Called from Stream.close or GC: the stream is destroyed at the next safe point.
        if not self.closed:
            self.closing = True
            self.ctx.memory.retired.append(self)

    def destroy(self) -> None:
        if not self.closed:
            self.closed = True
            self.ctx.ensure_current()
            handles = getattr(self.ctx, "handles", None)  # the device's pools, once any was used
            if handles is not None:  # this lane's library workspaces (and handles of its own) go with it
                handles.forget_lane(self, lambda ws: self.ctx.memory.raw_free(ws[0], self.stream))
            self.ctx.memory.flush(self)  # its free lists, freed on the stream before it goes
            self.fence.retire()
            check(cu.cuStreamDestroy(self.stream), "cuStreamDestroy")  # returns at once; work still runs


# -- tracing: timing events only while a trace records ---------------------------------------------

_elapsed_ms = getattr(cu, "cuEventElapsedTime", None) or getattr(cu, "cuEventElapsedTime_v2")


class _TraceClock:
    """Places a trace's GPU timing events on the host's ``perf_counter`` clock: one anchor event is
    recorded and synchronised at a known host time; later events are offsets from it
    (``cuEventElapsedTime``). One per (trace, device); costs one synchronisation per trace."""

    def __init__(self, lane: "CudaLane"):
        self.event = check(cu.cuEventCreate(0), "cuEventCreate")
        check(cu.cuEventRecord(self.event, lane.stream), "cuEventRecord")
        check(cu.cuEventSynchronize(self.event), "cuEventSynchronize")
        self.host = time.perf_counter()

    def at(self, event) -> float:
        return self.host + check(_elapsed_ms(self.event, event), "cuEventElapsedTime") / 1e3


_clocks: dict = {}


def _traced_run(lane: "CudaLane", cmd: Command, sink) -> None:
    key = (id(sink), lane.ctx)
    clock = _clocks.get(key)
    if clock is None:
        _clocks.clear()  # one trace records at a time: forget earlier traces' anchors
        clock = _clocks[key] = _TraceClock(lane)
    start = check(cu.cuEventCreate(0), "cuEventCreate")
    end = check(cu.cuEventCreate(0), "cuEventCreate")
    check(cu.cuEventRecord(start, lane.stream), "cuEventRecord")
    cmd.run(lane)
    check(cu.cuEventRecord(end, lane.stream), "cuEventRecord")

    def resolve(start=start, end=end, clock=clock) -> tuple[float, float]:
        try:
            lane.ctx.ensure_current()
            check(cu.cuEventSynchronize(end), "cuEventSynchronize")
            return clock.at(start), clock.at(end)
        finally:
            cu.cuEventDestroy(start)
            cu.cuEventDestroy(end)

    sink.ran_on_device(lane, cmd.seq, resolve)
