"""Device memory: stream-ordered allocation from a laneflow-owned CUDA memory pool.

A buffer's memory is allocated when its first writer is enqueued, on that writer's lane
(``cuMemAllocFromPoolAsync``), so it is valid in stream order there and, through the encoder's
waits, everywhere it is read. When the :class:`~laneflow.runtime.buffer.Buffer` dies, its release
is queued (that may happen on any thread, inside the garbage collector) and done at the next safe
point under the device lock: ``cuMemFreeAsync`` on the one lane that still uses it, or on a
private free stream that first waits for every lane that touched the buffer. A free that depends
on a CPU lane waits (without blocking anyone) until that lane has passed its last use. The pool
reuses freed memory only in stream order or once the free has completed, so a buffer is never
reused before every lane that touched it has passed its last use.
"""

from __future__ import annotations

import collections
import gc
import os
from typing import Any

import numpy as np
from cuda.bindings import driver as cu

from ...errors import OutOfMemoryError
from .driver import OUT_OF_MEMORY, CudaError, DeviceContext, check, fail
from .lanes import CudaLane


class DeviceArray:
    """The handle a CUDA buffer's ``data`` holds: a device pointer with shape and dtype.

    ``ptr`` is 0 until the first writer runs (and for empty arrays). ``host`` caches a host copy
    of the contents (constants keep their source data, host reads keep what they fetched); any
    write clears it.
    """

    __slots__ = ("ctx", "ptr", "shape", "dtype", "size", "nbytes", "host")

    def __init__(self, ctx: DeviceContext, shape: tuple, dtype: np.dtype):
        self.ctx = ctx
        self.ptr = 0
        self.shape = tuple(shape)
        self.dtype = dtype
        n = 1
        for s in self.shape:
            n *= s
        self.size = n
        self.nbytes = n * dtype.itemsize
        self.host = None

    def copy_to_host(self, out: np.ndarray) -> None:
        """Copy the contents into a host array (whose writer has finished). Used by CPU lanes."""
        if out.nbytes != self.nbytes:
            raise ValueError(f"copy_to_host: {out.nbytes} bytes into {self.nbytes}")
        if self.host is not None:
            np.copyto(out, self.host.reshape(out.shape), casting="no")
            return
        if self.nbytes == 0:
            return
        self.ctx.ensure_current()
        check(cu.cuMemcpyDtoH(out.ctypes.data, self.ptr, self.nbytes), "copy to host (cuMemcpyDtoH)")

    def __repr__(self) -> str:
        return f"<DeviceArray gpu:{self.ctx.index} {self.shape} {self.dtype} ptr={self.ptr:#x}>"


class ViewArray(DeviceArray):
    """A kernel's view of memory owned by something else (a compiled plan's region, another library's
    tensor). Never caches a host copy: what is behind it may change."""

    __slots__ = ()

    def __init__(self, ctx, shape: tuple, dtype, ptr: int):
        super().__init__(ctx, shape, dtype)
        self.ptr = ptr

    @property  # type: ignore[override]
    def host(self):
        return None

    @host.setter
    def host(self, value) -> None:
        pass


class StridedArray(ViewArray):
    """A kernel's strided view of another array's memory (``graph/views.py``): ``strides`` in
    elements, ``ptr`` already at the view's first element. Only kernels of ``strided_kinds`` get one."""

    __slots__ = ("strides",)

    def __init__(self, ctx, shape: tuple, dtype, ptr: int, strides: tuple):
        super().__init__(ctx, shape, dtype, ptr)
        self.strides = strides


class Slab:
    """One pool allocation shared by the outputs of one command (a grouped matmul's results), so a
    command with many outputs costs one allocation and one free, not one of each per output.

    Each output is a :class:`SlabArray` at an offset. The slab is allocated when the command's lane
    allocates its first output, and freed after every output died and every lane that touched any
    of them passed its last use: each dying output adds its points, and ``tokens.pop()`` (atomic)
    returns 0 to exactly one of them, the last, which queues the free.
    """

    __slots__ = ("ptr", "nbytes", "tokens", "points", "arrays")

    def __init__(self, nbytes: int, count: int):
        self.ptr = 0
        self.nbytes = nbytes
        self.tokens = list(range(count))
        self.points: list = []
        self.arrays: list | None = None  # until allocated: the outputs, to place them all at once


class SlabArray(DeviceArray):
    """An output living in a :class:`Slab`."""

    __slots__ = ("slab", "offset")


#: Offsets of a slab's outputs are aligned like the pool's own allocations.
SLAB_ALIGN = 256


def slab_arrays(ctx: DeviceContext, specs: list) -> list[SlabArray]:
    """Handles for outputs ``specs`` (shape, dtype) sharing one :class:`Slab`."""
    hs = []
    off = 0
    proto = None
    new = SlabArray.__new__
    for shape, dtype in specs:
        if proto is None or shape != proto.shape or dtype != proto.dtype:
            proto = SlabArray(ctx, shape, dtype)
            step = -(-proto.nbytes // SLAB_ALIGN) * SLAB_ALIGN
        h = new(SlabArray)  # a group's outputs are alike: copy the first one's fields
        h.ctx, h.ptr, h.shape, h.dtype, h.size, h.nbytes, h.host = ctx, 0, proto.shape, dtype, proto.size, proto.nbytes, None
        h.offset = off
        off += step
        hs.append(h)
    slab = Slab(off, len(hs))
    for h in hs:
        h.slab = slab
    slab.arrays = hs
    return hs


class Memory:
    """The device's pool, the queue of pending frees, and OOM handling."""

    def __init__(self, ctx: DeviceContext):
        self.ctx = ctx
        self.pool = self._create_pool()
        self.pending: collections.deque = collections.deque()
        self.waiting: list = []  # frees that wait for a CPU lane
        self.retired: collections.deque = collections.deque()  # closed lanes (and graphs) to destroy
        # another library's memory (DLPack, CUDA array interface imports) whose laneflow users had not
        # finished when its buffer died: (points, Foreign), released once they have (collect_foreign)
        self.foreign: collections.deque = collections.deque()
        self.capture = None  # while a CUDA graph is captured: where kernels' scratch comes from (graph.py)
        self.caching: set = set()  # lanes whose free lists hold blocks (``give``, ``flush``)
        self.free_stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING.value),
                                 "cuStreamCreate (free stream)")

    def _create_pool(self) -> Any:
        ctx = self.ctx
        props = cu.CUmemPoolProps()
        props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        props.location.id = ctx.index
        err, pool = cu.cuMemPoolCreate(props)
        if err:
            pool = check(cu.cuDeviceGetDefaultMemPool(ctx.device), "cuDeviceGetDefaultMemPool")
        a = cu.CUmemPool_attribute
        # Keep freed memory in the pool (no release to the OS at every synchronize).
        _try(cu.cuMemPoolSetAttribute, pool, a.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, cu.cuuint64_t(2**64 - 1))
        # Never let the driver add hidden dependencies between lanes to reuse memory.
        _try(cu.cuMemPoolSetAttribute, pool, a.CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, 0)
        return pool

    # -- allocation -------------------------------------------------------------------------------
    def allocate(self, h: DeviceArray, lane: Any, op: str) -> None:
        """Give ``h`` memory, stream-ordered on ``lane``. Raises OutOfMemoryError after one retry."""
        if type(h) is SlabArray:
            slab = h.slab
            if not slab.ptr:
                slab.ptr = base = self.take(slab.nbytes, lane, op)
                for m in slab.arrays or ():  # every output at once: the lane skips the others
                    m.ptr = base + m.offset
                slab.arrays = None  # (and the reference cycle through the slab goes)
            h.ptr = slab.ptr + h.offset
            return
        h.ptr = self.take(h.nbytes, lane, op)

    def take(self, nbytes: int, lane: Any, op: str) -> int:
        """``nbytes`` of memory valid in ``lane``'s stream order: a block of its free list when one of
        that size is there (no driver call), else from the pool."""
        blocks = lane.blocks.get(nbytes)
        if blocks and self.capture is None:
            with self.ctx.lock:  # a flush (stats, OOM) may empty the list meanwhile
                if blocks:
                    lane.cached -= nbytes
                    return blocks.pop()
        return self.raw_alloc(nbytes, lane.stream, op)

    def give(self, ptr: int, nbytes: int, lane: Any) -> None:
        """``ptr`` (``nbytes``, from :meth:`take`) is free once ``lane``'s commands so far have run: onto
        the lane's free list, or back to the pool past :data:`LANE_CACHE_BYTES`. ``lane`` is not closed."""
        if self.capture is not None or not LANE_CACHE_BYTES:
            self.raw_free(ptr, lane.stream)
            return
        with self.ctx.lock:
            if lane.cached + nbytes > LANE_CACHE_BYTES:
                self.flush(lane)
                if nbytes > LANE_CACHE_BYTES:
                    self.raw_free(ptr, lane.stream)
                    return
            blocks = lane.blocks.get(nbytes)
            if blocks is None:
                blocks = lane.blocks[nbytes] = []
            blocks.append(ptr)
            lane.cached += nbytes
            self.caching.add(lane)

    def flush(self, lane: Any = None) -> None:
        """Return the free lists of ``lane`` (None: every lane) to the pool, each block freed in its
        lane's stream order. Before a lane's stream goes, when memory runs out, and for stats."""
        with self.ctx.lock:
            for ln in [lane] if lane is not None else list(self.caching):
                self.caching.discard(ln)
                blocks, ln.blocks, ln.cached = ln.blocks, {}, 0
                for ptrs in blocks.values():
                    for ptr in ptrs:
                        self.raw_free(ptr, ln.stream)

    def raw_alloc(self, nbytes: int, stream: Any, op: str) -> int:
        cap = self.capture
        if cap is not None:  # scratch of a kernel being captured: memory the graph owns
            return cap.alloc(nbytes)
        alloc = self.ctx.calls.alloc
        pool = self.pool
        s = stream if stream.__class__ is int else int(stream)
        err, ptr = alloc(nbytes, pool, s)
        if err:
            if err != _OOM:
                raise CudaError(f"{op}: allocating {nbytes} bytes", err)
            # Frees may still be queued or in flight, or held by cyclic garbage (the cyclic GC pauses
            # while a long graph is scheduled): free them and try once more. Retired lanes are left
            # for later: destroying one takes handle-pool locks this thread may hold.
            gc.collect()
            self.collect(retire=False)
            self.flush()
            self.ctx.synchronize()
            self.collect(retire=False)
            self.ctx.synchronize()
            err, ptr = alloc(nbytes, pool, s)
            if err:
                raise OutOfMemoryError(op, nbytes, self.free_bytes(), f"gpu:{self.ctx.index}")
        return ptr

    def raw_free(self, ptr: int, stream: Any) -> None:
        cap = self.capture
        if cap is not None and ptr in cap.ptrs:
            return  # freed with the graph
        err = self.ctx.calls.free(ptr, stream if stream.__class__ is int else int(stream))
        if err:
            fail(err, "cuMemFreeAsync")

    def free_bytes(self) -> int | None:
        free = self.ctx.free_bytes()
        if free is None:
            return None
        try:
            a = cu.CUmemPool_attribute
            reserved = int(check(cu.cuMemPoolGetAttribute(self.pool, a.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), "pool"))
            used = int(check(cu.cuMemPoolGetAttribute(self.pool, a.CU_MEMPOOL_ATTR_USED_MEM_CURRENT), "pool"))
            return free + max(0, reserved - used)
        except Exception:  # noqa: BLE001 - only for messages
            return free

    def stats(self) -> dict:
        """Pool figures after processing queued frees: used, reserved and their high-water marks."""
        with self.ctx.lock:
            self.ctx.ensure_current()
            self.collect()
            self.flush()  # blocks on lanes' free lists count as free
            self.ctx.synchronize()  # queued frees have run once this returns
        a = cu.CUmemPool_attribute
        out = {}
        for key, attr in (("used", a.CU_MEMPOOL_ATTR_USED_MEM_CURRENT), ("reserved", a.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
                          ("used_high", a.CU_MEMPOOL_ATTR_USED_MEM_HIGH),
                          ("reserved_high", a.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)):
            out[key] = int(check(cu.cuMemPoolGetAttribute(self.pool, attr), "cuMemPoolGetAttribute"))
        out["pending_frees"] = len(self.pending) + len(self.waiting)
        return out

    # -- another library's memory ----------------------------------------------------------------
    def defer_foreign(self, points: list, foreign: Any) -> None:
        """Release ``foreign`` (``interop.Foreign``) once every point is done. Any thread, maybe inside
        GC: only an append."""
        self.foreign.append((points, foreign))

    def collect_foreign(self) -> int:
        """Release the foreign memory whose laneflow users have finished; returns how many are held."""
        q = self.foreign
        keep = []
        for _ in range(len(q)):
            try:
                points, f = q.popleft()
            except IndexError:
                break
            if all(_done(p) for p in points):
                f.close()
            else:
                keep.append((points, f))
        q.extend(keep)
        return len(q)

    # -- release ----------------------------------------------------------------------------------
    def release(self, buf: Any) -> None:
        """Buffer death (any thread, maybe inside GC): queue the free for the next safe point."""
        h = buf.data
        if type(h) is SlabArray:
            slab = h.slab
            pts = slab.points
            w = buf.writer
            if w is not None and not (pts and pts[-1] is w):  # a group's outputs share their writer
                pts.append(w)
            if buf.readers:
                pts.extend(buf.readers.values())
            h.ptr = 0
            if slab.tokens.pop() == 0 and slab.ptr:  # the last output of the slab died
                self.pending.append((slab.ptr, None, tuple(slab.points), slab.nbytes))
                slab.ptr = 0
            return
        if h.ptr:
            self.pending.append((h.ptr, buf.writer, tuple(buf.readers.values()), h.nbytes))
            h.ptr = 0

    def collect(self, retire: bool = True) -> None:
        """Free what died since the last call. Caller holds no lane state; runs under ctx.lock."""
        with self.ctx.lock:
            while retire and self.retired:
                lane = self.retired.popleft()
                lane.destroy()
            if self.waiting:
                still = []
                for item in self.waiting:
                    if not self._free(*item):
                        still.append(item)
                self.waiting = still
            pending = self.pending
            while pending:
                item = pending.popleft()
                if not self._free(*item):
                    self.waiting.append(item)

    def _free(self, ptr: int, writer: Any, readers: tuple, nbytes: int) -> bool:
        """Enqueue the free of ptr after its last uses; False when a CPU lane still uses it.
        ``nbytes``: its size, when a lane's free list may keep it (0: only the pool may, e.g. graph memory)."""
        # Only this device's streams free its memory: a lane of another GPU that read it (the peer copy
        # of a use on that GPU) is waited for through its event, like a CPU lane's.
        ctx = self.ctx
        lane = writer.lane if writer is not None else readers[0].lane if readers else None
        if nbytes and lane.__class__ is CudaLane and not lane.closing and lane.ctx is ctx:
            for p in readers:
                if p.lane is not lane:
                    break
            else:  # every use on one lane: its stream order covers them, no event needed
                self.give(ptr, nbytes, lane)
                return True
        busy = []
        for p in (writer, *readers):
            if p is None:
                continue
            lane = p.lane
            if isinstance(lane, CudaLane):
                if not lane.fence.known(p.seq):
                    busy.append(p)
            elif lane.fence.value < p.seq:
                return False  # a CPU lane still reads or writes it: try again later
        if not busy:
            lane = writer.lane if writer is not None else None
            own = isinstance(lane, CudaLane) and not lane.closed and lane.ctx is ctx
            self.raw_free(ptr, lane.stream if own else self.free_stream)
            return True
        lanes = {p.lane for p in busy}
        if len(lanes) == 1:
            (lane,) = lanes
            if not lane.closed and lane.ctx is ctx:
                self.raw_free(ptr, lane.stream)  # after everything already enqueued there
                return True
        events = [p.lane.fence.event_for(p.seq) for p in busy]  # (another GPU's lane makes its context current)
        ctx.ensure_current()
        for ev in events:
            if ev is not None:
                check(cu.cuStreamWaitEvent(self.free_stream, ev, 0), "cuStreamWaitEvent (free)")
        self.raw_free(ptr, self.free_stream)
        return True


def _done(p) -> bool:
    lane = p.lane
    if isinstance(lane, CudaLane):
        return lane.fence.known(p.seq) or lane.fence.value >= p.seq
    return lane.fence.value >= p.seq


_OOM = int(OUT_OF_MEMORY)

#: Most bytes a lane's free lists hold (``Memory.give``); past it the lane's list goes back to the
#: pool. ``LANEFLOW_LANE_CACHE_BYTES=0`` frees every block to the pool at once (two driver calls per
#: command, as before the free lists).
LANE_CACHE_BYTES = max(0, int(os.environ.get("LANEFLOW_LANE_CACHE_BYTES", str(64 << 20))))


def _try(fn, *args) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - a pool attribute this driver lacks is not fatal
        pass
