"""Output sets: where a compiled CUDA graph's returned values live, and how they stay valid.

Returned values live in one *output region* (one per output set, up to :data:`OUTPUT_SETS`, each with
its own executable graph). A call's values are :class:`~laneflow.graph.node.LazyData` sharing one
:class:`Lease`; a value's buffer and device handle are made when something first uses it. When a set
is needed again while the values of its last call are still alive, the whole region is first copied
to a block of its own (one copy; the values' ``ptr`` change, their contents do not), so outputs stay
valid after the next call and a loop that drops them (the usual case) copies nothing. An output
exported zero-copy (DLPack) cannot move: the plan then gives that region to the exported arrays and
takes a new one (one re-capture).
"""

from __future__ import annotations

import collections
import weakref

import numpy as np
from cuda.bindings import driver as cu

from ....errors import OutOfMemoryError
from ....runtime.buffer import Buffer
from ....runtime.encoder import LOCK
from ..driver import check
from ..lanes import CudaLane
from ..memory import DeviceArray

#: Output regions per plan (each with its own executable graph): two let ``y = f(x)`` in a loop keep
#: the previous result alive while the next is computed without copying it.
OUTPUT_SETS = 2
_ALIGN = 256
_U8 = np.dtype(np.uint8)


class OutArray(DeviceArray):
    """A returned value's device handle, in a plan's output region or in the memory its outputs moved
    to; ``owner`` keeps that memory alive."""

    __slots__ = ("owner",)


class OutBuffer(Buffer):
    """A returned value's buffer (made on first use, ``Lease.materialize``). Its memory belongs to the
    output region (its death frees nothing, ``out_released``); ``lease`` keeps the call's lease alive
    while the buffer is (a graph reading it as a direct argument, a command in flight, a value written
    into it in place)."""

    __slots__ = ("lease",)


def allocate_region(ctx, device, nbytes: int, op: str) -> Buffer:
    """Memory for a plan region, usable on every stream at once (allocated on the pool's free stream,
    which is then synchronised: a one-time cost per plan)."""
    return allocate_static(ctx, device, (max(nbytes, 1),), _U8, op)


def allocate_static(ctx, device, shape: tuple, dtype, op: str) -> Buffer:
    """A buffer of ``shape`` and ``dtype`` whose address is fixed now (a graph bakes it in), usable on
    every stream at once: a region (bytes), or a donated argument's state buffer, which a call returns
    as a value and later ops read with its own shape and dtype."""
    mem = ctx.memory
    h = DeviceArray(ctx, shape, dtype)
    with ctx.lock:
        ctx.ensure_current()
        h.ptr = mem.raw_alloc(max(h.nbytes, 1), mem.free_stream, op)
        check(cu.cuStreamSynchronize(mem.free_stream), "cuStreamSynchronize (region)")
    return Buffer(device, h.nbytes, h, mem.release)


def _u8():
    import numpy as np

    return np.dtype(np.uint8)


class OutputSets:
    """The output sets of one graph and the layout of its returned values in a region."""

    def __init__(self, backend, ctx, device, returned: list, spec_of: dict):
        self.backend, self.ctx, self.device = backend, ctx, device
        self.sets: list[OutSet] = []
        self.evacuated = 0
        self.out_offsets: dict[int, int] = {}
        total = 0
        for slot in returned:
            self.out_offsets[slot] = total
            total += -(-max(spec_of[slot].nbytes, 1) // _ALIGN) * _ALIGN
        self.out_bytes = total
        self.out_specs = []  # (slot, shape, dtype, nbytes, size, offset) of each returned value
        for slot in returned:
            spec = spec_of[slot]
            n = spec.nbytes
            self.out_specs.append((slot, spec.shape, spec.dtype, n, n // spec.dtype.itemsize if spec.dtype.itemsize else 0,
                                   self.out_offsets[slot]))
        self.spec_index = {t[0]: t for t in self.out_specs}  # slot -> its out_specs entry (a value's spec)

    def stale(self) -> None:
        """Every set's graph must be captured again (an argument or a captured value moved)."""
        for o in self.sets:
            o.stale = True

    def choose(self, stream) -> "OutSet | None":
        """A set whose outputs were all dropped; else a new one (up to OUTPUT_SETS: a loop that keeps
        the previous result while computing the next alternates between two); else the least recently
        launched set, after moving its outputs that are still alive."""
        sets = self.sets
        for o in sets:
            if not o.busy:
                return o
        if len(sets) < OUTPUT_SETS:
            try:
                o = OutSet(self)
            except OutOfMemoryError:
                return None  # no memory for a second set now: this call runs as commands
            sets.append(o)
            return o
        o = min(sets, key=lambda o: o.launched)
        return o if self._evacuate(o, stream) else None

    def _evacuate(self, o: "OutSet", stream) -> bool:
        """Move the outputs of set ``o``'s last call, still alive, to memory of their own: the whole
        region in one copy (one allocation, one driver call; the values are a call's outputs, usually
        all kept or all dropped). An exported output cannot move: the region is left to the outputs,
        as it is when the move cannot run. False when neither is possible (no memory): the set is
        left as it was, and this call runs as commands."""
        lease = o.lease() if o.lease is not None else None
        if lease is None:
            # The values died, but their lease has not handed on their readers yet (the cyclic GC
            # clears weak references before it runs finalisers, maybe on another thread): their
            # readers are unknown, so wait for the device to be idle (rare).
            self.ctx.synchronize()
            o.lease, o.busy = None, 0
            return True
        mats = [b for b in (r() for r in lease.mats) if b is not None]
        if len(mats) + len(lease.deaths) < len(lease.mats):
            # a made buffer is dying in a cycle on another thread (its weak reference cleared, its
            # finaliser not run yet): its points are unknown, so wait for the device first (rare)
            self.ctx.synchronize()
        if any(b.exported for b in mats):
            return give_region(o, lease)  # exported memory cannot move: leave the region to it
        region = o.region
        n = self.out_bytes
        h = DeviceArray(self.ctx, (max(n, 1),), _U8)
        block = Buffer(self.device, h.nbytes, h, self.ctx.memory.release)  # the lease frees it once moved
        cpu_readers = [p for b in mats for p in b.readers.values() if not isinstance(p.lane, CudaLane)]
        old_base = lease.base

        def move(lane, h=h, region=region, lease=lease, mats=mats, n=n):
            # h.ptr: the block's memory, allocated on this lane as the command's write
            for p in cpu_readers:  # a CPU worker reads h.ptr when it runs: let it finish first
                p.lane.host_wait(p.seq)
            if n:
                check(cu.cuMemcpyDtoDAsync(h.ptr, region.data.ptr, n, lane.stream), "cuMemcpyDtoDAsync (outputs)")

        # reads the made buffers too (those without an error: one would stop the move): one written
        # in place since is copied after that write
        point = stream.encoder.encode("compiled output move", move, [region, *[b for b in mats if b.error is None]],
                                      [block], lane=stream.lanes[0])
        if block.error is not None or not h.ptr:
            # The move did not run (out of memory, a failed read): the values stay where they are
            # and keep the region; the set takes a new one.
            return give_region(o, lease)
        block.release = None  # moved: freed by the lease, after the values' last points (``finish``)
        # readers of the old place (and the writer of a value written there in place since): the
        # region's next write waits for them
        o.dead.append(lease.points() + lease.points_apart(mats))
        o.lease, o.busy = None, 0
        self.evacuated += len(self.out_specs)
        base = lease.base = h.ptr
        # later readers of the moved values are readers of the block: its free waits for them
        lease.block, lease.point, lease.readers, lease.apart = block, point, block.readers, []
        for b in mats:
            b.data.ptr = base + b.data.ptr - old_base
            b.data.owner = block
            b.writer, b.readers = point, block.readers
        return True

class OutSet:
    """One output region and the executable graph that writes it. ``lease`` refers (weakly) to the
    lease of the last call launched on it: the set is free once that lease died, i.e. every value
    and buffer of the call did. ``dead`` holds the reader points of calls whose values died, which
    the region's next writer waits for."""

    def __init__(self, sets: "OutputSets"):
        self.ref = weakref.ref(self)
        self.backend, self.device, self.nbytes = sets.backend, sets.device, sets.out_bytes
        self.exec = None
        self.temps = None  # the graph's capture scratch (capture.Temps)
        self.stale = False
        self.launched = 0
        self.lane = None  # the lane its launches go to
        self.lease = None  # weakref to the last call's _Lease
        self.busy = 0      # the launch number of the call whose values may be alive (0: free)
        self.dead: collections.deque = collections.deque()
        self.region: Buffer = None  # type: ignore[assignment]
        self.new_region()

    def new_region(self) -> None:
        """Fresh memory for this set's outputs (the old region stays with the outputs that hold it).
        Allocates first: when there is no memory for it, nothing has changed."""
        region = self.backend.allocate_region(self.device, self.nbytes, "compiled outputs")
        if self.region is not None:
            self.drain()  # the old region's free waits for readers of outputs dropped so far
        self.region = region
        self.lease = None
        self.busy = 0
        self.dead = collections.deque()
        self.stale = True

    def drain(self) -> None:
        """Readers of dropped outputs become readers of the region: its next write (or its free)
        waits for them."""
        dead, readers = self.dead, self.region.readers
        while dead:
            add_readers(readers, dead.popleft())

    def __del__(self) -> None:
        try:
            self.drain()  # before the region is released (Memory.release reads its readers)
            lease = self.lease() if self.lease is not None else None
            if lease is not None and lease.region is self.region and lease.block is None and not lease.owned:
                lease.own(self.region)  # values still live in it (a dropped plan): the lease frees it
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class Lease:
    """The values of one compiled call (shared by them, ``LazyData.lease``): where they live
    (``base``: the output region, or the block they moved to), their writer and error, and ``readers``
    (lane -> latest point), one dict for all their buffers, as if they were one buffer; ``apart``
    collects the points of made buffers that left that shared state (written in place), appended by
    any thread. When the lease dies (every value and buffer of the call did), its points are handed
    to the memory's next writer: the set's next launch, or the region's free when the plan gave the
    region away. Two Python objects per value (Array, LazyData) instead of four, and no finaliser
    per value."""

    __slots__ = ("set", "region", "base", "point", "error", "checks", "readers", "mats", "block", "specs",
                 "ctx", "device", "apart", "seq", "deaths", "done", "owned", "__weakref__")

    def materialize(self, d) -> OutBuffer:
        """The buffer of value ``d`` (first use: an op reads it, a host read, an export). Under the
        scheduler lock, which a move of the values (``GraphPlan._evacuate``) holds too: a buffer is
        made either before a move (and moved with it) or after (at the new place), and once."""
        with LOCK:
            b = d.made()
            if b is not None:
                return b
            b = d.buffer = self.buffer_of(d.spec)
            return b

    def buffer_of(self, spec: tuple) -> OutBuffer:
        """A buffer of one of the call's values (its ``specs`` entry), made now: what ``materialize``
        gives a compiled call's value, and the plan cache of ``lf.eval`` an evaluated node (under the
        scheduler lock)."""
        _, shape, dtype, n, size, offset = spec
        h = OutArray.__new__(OutArray)
        h.ctx, h.shape, h.dtype, h.host, h.size, h.nbytes = self.ctx, shape, dtype, None, size, n
        h.ptr, h.owner = self.base + offset, self.block if self.block is not None else self.region
        b = OutBuffer.__new__(OutBuffer)
        b.device, b.nbytes, b.data, b.writer, b.readers = self.device, n, h, self.point, self.readers
        b.error, b.exported, b.release, b.checks, b.lease = self.error, False, out_released, self.checks, self
        self.mats.append(weakref.ref(b))
        return b

    def own(self, region: Buffer) -> None:
        """Take ``region`` (this call's values live in it and its set has let go of it): freed by
        ``finish`` with every point, not by the region's own finaliser."""
        region.release = None
        self.owned = True

    def points(self) -> list:
        """The points the memory's next writer must wait for (the shared readers, and those apart)."""
        return [*self.readers.values(), *self.apart]

    def points_apart(self, mats: list) -> list:
        """Writer and reader points of made buffers, alive, that left the shared state."""
        pts = []
        for b in mats:
            if b.readers is not self.readers or b.writer is not self.point:
                pts.extend(p for p in (b.writer, *b.readers.values()) if p is not None)
        return pts

    def __del__(self) -> None:
        # Any thread, maybe inside GC. Normally the made buffers (which hold the lease) died first;
        # in a reference cycle the collector may finalise them after the lease: the last one out
        # hands the points on (``finish``).
        try:
            self.done = True
            if len(self.deaths) >= len(self.mats):
                self.finish()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def finish(self) -> None:
        """Every value and made buffer of the call died: hand their points on, only queueing (any
        thread, maybe inside GC). The set's next launch waits for them, or the free of the region it
        gave away, or the free of the block the values moved to."""
        if self.mats is None:
            return
        pts = self.points()
        self.mats = None  # once
        block = self.block
        if block is not None:  # moved values: free their block after its writer and every reader
            h = block.data
            if h.ptr:
                self.ctx.memory.pending.append((h.ptr, block.writer, tuple(pts), h.nbytes))
                h.ptr = 0
            return
        region = self.region
        if self.owned:  # a region left to the values (exported, no move, a dropped plan's set)
            h = region.data
            if h.ptr:
                self.ctx.memory.pending.append((h.ptr, region.writer, (*region.readers.values(), *pts), 0))
                h.ptr = 0
            return
        o = self.set()
        if o is not None and o.region is region:
            if pts:
                o.dead.append(pts)
            if o.busy == self.seq:
                o.busy = 0  # after queueing: a set seen free has its readers queued
        elif pts:
            add_readers(region.readers, pts)


def give_region(o: OutSet, lease: Lease) -> bool:
    """Leave set ``o``'s region to the values of ``lease`` that live in it and give the set a new one
    (one capture more); False when there is no memory for it (nothing changed). The lease frees the
    region after its values' last points (``finish``), not the region's own finaliser: in a reference
    cycle that could run first."""
    region = o.region
    try:
        o.new_region()
    except OutOfMemoryError:
        return False
    lease.own(region)
    return True


def out_released(b: OutBuffer) -> None:
    """A made buffer died (any thread, maybe inside GC): if it left the call's shared state (written
    in place), its points are set apart on the lease (an append: the shared readers dict may be
    written by the encoder on another thread meanwhile), for the memory's next writer."""
    lease = b.lease
    if b.readers is not lease.readers or b.writer is not lease.point:
        lease.apart.extend(lease.points_apart([b]))
    lease.deaths.append(None)  # a count (an append: finalisers may run on several threads)
    if lease.done and lease.mats is not None and len(lease.deaths) >= len(lease.mats):
        lease.finish()  # the lease was finalised first (a reference cycle): this is the last one out


def add_readers(readers: dict, points) -> None:
    """Merge points into a buffer's readers (lane -> latest point), as if they had read it."""
    for p in points:
        cur = readers.get(p.lane)
        if cur is None or cur.seq < p.seq:
            readers[p.lane] = p


