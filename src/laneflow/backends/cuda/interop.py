"""DLPack and ``__cuda_array_interface__`` (v3) for buffers on a GPU: the CUDA half of interop.

The generic half (``interop/dlpack.py``) evaluates the array, marks its buffer exported (laneflow never
writes it again: no donation, no in-place reuse) and wraps imported buffers as arrays; this module
does what is CUDA's: stream handles, device-side ordering, capsules over device pointers, and the
release of another library's memory.

Export (laneflow is the producer). Stream correctness: the consumer's stream waits on the event
recorded after the command that wrote the buffer (``cuStreamWaitEvent``; no host wait). DLPack's
``stream``: None or 1 is the legacy default stream, 2 the per-thread default stream, another int a
stream handle, -1 no synchronisation. The CUDA array interface instead names the writer lane's stream
in its ``stream`` field.

Import (laneflow is the consumer). The foreign memory is wrapped zero-copy in a buffer that laneflow
treats as a read-only input (marked exported) and never frees: it calls the producer's deleter (or
drops its reference to the producer's object) once every laneflow command that used the memory has
finished (``Memory.defer_foreign``). Stream correctness: the producer is asked to order its work
before a laneflow lane (DLPack: ``stream=`` that lane's handle; CUDA array interface: laneflow records
an event on the producer's ``stream`` and the lane waits on it); a no-op command on that lane then
becomes the buffer's writer, so the encoder orders every later reader after it. Strided or unaligned
inputs are copied on that lane into a new laneflow buffer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from cuda.bindings import driver as cu

from ... import dtypes as dt
from ...runtime import capsule as _cap
from ...runtime.buffer import Buffer
from .driver import check
from .kernels.copy import strided_copy
from .kernels.plan import contiguous_strides
from .lanes import CudaLane
from .memory import DeviceArray, ViewArray


class Foreign:
    """Another library's memory behind a laneflow buffer: released once laneflow no longer uses it."""

    __slots__ = ("_keep", "_release", "memory")

    def __init__(self, memory, release=None, keep: Any = None):
        self.memory, self._release, self._keep = memory, release, keep

    def on_buffer_death(self, buf) -> None:
        # Buffer.__del__ may run inside the garbage collector on any thread: no locks that a command
        # in flight on this thread could hold, no driver calls. Unfinished users defer the release.
        points = [p for p in (buf.writer, *buf.readers.values()) if p is not None]
        if all(done(p, False) for p in points):
            self.close()
        else:
            self.memory.defer_foreign(points, self)

    def close(self) -> None:
        rel, self._release, self._keep = self._release, None, None
        if rel is not None:
            rel()


def done(p, poll: bool) -> bool:
    """Whether point ``p`` is known finished (``poll``: ask the driver when it is not known yet)."""
    lane = p.lane
    if isinstance(lane, CudaLane):
        return lane.fence.known(p.seq) or (poll and lane.fence.value >= p.seq)
    return lane.fence.value >= p.seq


def stream_handle(stream: Any, what: str) -> int | None:
    """A DLPack / CUDA-array-interface stream number as a handle; None means no synchronisation."""
    if stream is None:
        return 1  # the legacy default stream
    if isinstance(stream, bool) or not isinstance(stream, (int, np.integer)):
        raise TypeError(f"{what}: stream must be an int (a CUDA stream handle, 1, 2 or -1) or None, "
                        f"got {type(stream).__name__}")
    s = int(stream)
    if s == -1:
        return None
    if s == 0 or s < -1:
        raise ValueError(f"{what}: stream={s} is not allowed (0 is ambiguous: use 1 for the legacy default "
                         "stream, 2 for the per-thread default stream, or a stream handle)")
    return s


def _wait_for_writer(buf, handle: int, ctx) -> None:
    """Make CUDA stream ``handle`` wait for the command that wrote ``buf`` (device-side)."""
    w = buf.writer
    if w is None:
        return
    lane = w.lane
    if not isinstance(lane, CudaLane):
        lane.host_wait(w.seq)  # a CPU lane wrote it (not done by laneflow's ops today)
        return
    ev = lane.fence.event_for(w.seq)
    if ev is None:
        return  # already finished
    ctx.ensure_current()
    check(cu.cuStreamWaitEvent(cu.CUstream(handle), ev, 0), "__dlpack__: cuStreamWaitEvent on the consumer's stream")


class _ExportHold:
    """What a capsule keeps alive: the buffer, until the consumer's deleter runs. Consumers call the
    deleter when *they* drop the memory, possibly with their kernels still queued on the stream they
    passed to ``__dlpack__``; that stream is synchronised first, so laneflow never frees or reuses the
    memory under them."""

    __slots__ = ("buf", "ctx", "handle")

    def __init__(self, buf, ctx, handle):
        self.buf, self.ctx, self.handle = buf, ctx, handle

    def __del__(self) -> None:
        if self.handle is not None:
            try:
                self.ctx.ensure_current()
                cu.cuStreamSynchronize(cu.CUstream(self.handle))
            except Exception:  # noqa: BLE001 - a consumer stream already destroyed: nothing queued on it
                pass


def export_dlpack(ctx, buf, shape: tuple, dtype: np.dtype, index: int, *, stream: Any, versioned: bool,
                  copied: bool):
    """A DLPack capsule over ``buf`` (evaluated, marked exported): the consumer's ``stream`` is ordered
    after its writer. Called under the scheduling lock (no other thread may reuse the buffer)."""
    handle = stream_handle(stream, "__dlpack__")
    ctx.memory.collect_foreign()
    if handle is not None:
        _wait_for_writer(buf, handle, ctx)
    # A legacy (unversioned) consumer cannot be told the memory is read-only; it shares it anyway:
    # a device copy per export would cost memory and bandwidth, and GPU consumers that may write
    # (PyTorch, CuPy) ask for versioned capsules. laneflow itself never writes exported memory.
    return _cap.make_capsule(buf.data.ptr, shape, dtype, (_cap.KDL_CUDA, index), _ExportHold(buf, ctx, handle),
                             versioned=versioned, read_only=not copied, copied=copied)


def array_interface(buf, shape: tuple, dtype: np.dtype) -> dict:
    """``__cuda_array_interface__`` (version 3) of ``buf`` (evaluated, marked exported).

    The read-only flag says False although the memory is read-only for consumers: PyTorch refuses
    read-only CUDA array interfaces outright. laneflow itself never writes the memory again."""
    if dtype.name == "bfloat16":
        raise AttributeError("__cuda_array_interface__: bfloat16 has no typestr; use DLPack (__dlpack__)")
    w = buf.writer
    stream = None
    if w is not None and isinstance(w.lane, CudaLane) and w.lane.fence.event_for(w.seq) is not None:
        if w.lane.closed or w.lane.closing:  # its stream goes away: a consumer must not keep the handle
            w.lane.host_wait(w.seq)
        else:
            stream = int(w.lane.handle)  # the consumer synchronises on the writer's lane
    return {"shape": tuple(shape), "typestr": dtype.str, "descr": [("", dtype.str)],
            "data": (int(buf.data.ptr), False), "strides": None, "version": 3, "stream": stream}


def laneflow_dtype(dtype: np.dtype, op: str) -> np.dtype:
    """The laneflow dtype of a producer's dtype (TypeError naming the op for one laneflow lacks)."""
    try:
        return dt.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"{op}: {e}; convert it in the producing library first") from None


def _pick_lane(st):
    lanes = st.lanes
    return lanes[0] if len(lanes) == 1 else st.encoder.policy.choose(lanes, ())


def _compact(shape: tuple, strides) -> bool:
    want = 1
    for n, s in zip(reversed(shape), reversed(tuple(strides))):
        if n != 1 and s != want:
            return 0 in shape
        want *= n
    return True


def _wrap(backend, ctx, st, lane, ptr: int, shape: tuple, strides, dtype: np.dtype, foreign: Foreign,
          before=None, op="from_dlpack") -> Buffer:
    """A buffer over foreign memory (zero-copy when compact and aligned, else a strided copy on ``lane``),
    whose writer is a command on ``lane`` that orders the producer's work first."""
    shape = tuple(int(s) for s in shape)
    compact = strides is None or _compact(shape, strides)

    def enqueue_before(lane):
        if before is not None:
            before(lane)

    # cuBLASLt and our kernels assume 256-byte aligned operands: a tensor at an odd offset is copied
    if compact and int(ptr) % 256 == 0:
        h = ViewArray(ctx, shape, dtype, int(ptr))  # never caches a host copy: the producer may write
        buf = Buffer(st.device, h.nbytes, h, foreign.on_buffer_death)
        buf.exported = True  # imported memory is a read-only input: never donated, never written
        st.encoder.encode(op, enqueue_before, (), (buf,), lane=lane)
        return buf
    src_h = DeviceArray(ctx, (), np.dtype(np.uint8))
    src_h.ptr = int(ptr)
    src = Buffer(st.device, 0, src_h, foreign.on_buffer_death)
    src.exported = True
    buf = backend.allocate(st.device, shape, dtype, op)
    ist = tuple(int(s) for s in strides)

    def strided(lane, out=buf.data):
        enqueue_before(lane)
        strided_copy(lane, out.ptr, dtype, int(ptr), dtype, shape, ist, contiguous_strides(shape))

    st.encoder.encode(f"{op}.copy", strided, (src,), (buf,), lane=lane)
    return buf


def import_dlpack(backend, ctx, obj: Any, st, op: str = "from_dlpack") -> tuple[Buffer, np.dtype, tuple]:
    """A buffer over a CUDA DLPack producer's tensor on stream ``st`` (zero-copy for compact row-major
    tensors), with its numpy dtype (a laneflow dtype check is the caller's) and shape. Under the
    scheduling lock."""
    ctx.memory.collect_foreign()
    lane = _pick_lane(st)
    ctx.ensure_current()
    try:
        capsule = obj.__dlpack__(stream=int(lane.handle), max_version=_cap.VERSION)
    except TypeError:  # a producer older than DLPack 1.0's keywords
        capsule = obj.__dlpack__(stream=int(lane.handle))
    t = _cap.open_capsule(capsule)
    try:
        if t.device[0] not in (_cap.KDL_CUDA, _cap.KDL_CUDA_MANAGED):
            raise BufferError(f"{op}: the capsule is on DLPack device type {t.device[0]}, not CUDA")
        dtype = laneflow_dtype(t.dtype, op)
    except BaseException:
        t.release()
        raise
    buf = _wrap(backend, ctx, st, lane, t.ptr, t.shape, t.strides, dtype, Foreign(ctx.memory, t.release), op=op)
    return buf, dtype, tuple(int(s) for s in t.shape)


def pointer_device(ptr: int | None) -> int:
    """The GPU a device pointer belongs to (0 when the driver cannot tell, e.g. managed memory)."""
    if not ptr:
        return 0
    try:
        err, dev = cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)
        return int(dev) if not err and int(dev) >= 0 else 0
    except Exception:  # noqa: BLE001 - only a fallback
        return 0


def read_array_interface(obj: Any, op: str) -> tuple[int, tuple, Any, np.dtype, int | None]:
    """(pointer, shape, element strides or None, numpy dtype, producer stream handle) of an object's
    ``__cuda_array_interface__`` (v3 or later)."""
    cai = obj.__cuda_array_interface__
    if int(cai.get("version", 0)) < 3:
        raise BufferError(f"{op}: CUDA array interface version {cai.get('version')} (laneflow reads 3 and later)")
    if cai.get("mask") is not None:
        raise BufferError(f"{op}: masked arrays are not supported")
    ptr, _read_only = cai["data"]
    dtype = np.dtype(cai["typestr"])
    shape = tuple(int(s) for s in cai["shape"])
    strides = cai.get("strides")
    if strides is not None:
        if any(int(s) % dtype.itemsize for s in strides):
            raise BufferError(f"{op}: strides {tuple(strides)} are not multiples of the {dtype} item size")
        strides = tuple(int(s) // dtype.itemsize for s in strides)
    producer = cai.get("stream")
    return ptr or 0, shape, strides, dtype, (None if producer is None else stream_handle(producer, op))


def import_array_interface(backend, ctx, obj: Any, st, fields: tuple, dtype: np.dtype,
                           op: str = "from_cuda_array_interface") -> Buffer:
    """A buffer over an object's CUDA array interface memory on stream ``st`` (zero-copy when compact);
    ``fields`` from :func:`read_array_interface`. Under the scheduling lock."""
    ptr, shape, strides, _, producer = fields

    def wait_for_producer(lane, handle=producer):
        if handle is None or handle == int(lane.handle):
            return
        ev = check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING.value), "cuEventCreate")
        try:
            check(cu.cuEventRecord(ev, cu.CUstream(handle)), f"{op}: cuEventRecord on the producer's stream")
            check(cu.cuStreamWaitEvent(lane.stream, ev, 0), f"{op}: cuStreamWaitEvent")
        finally:
            cu.cuEventDestroy(ev)  # destroyed once the recorded work completes

    ctx.memory.collect_foreign()
    lane = _pick_lane(st)
    ctx.ensure_current()
    return _wrap(backend, ctx, st, lane, ptr, shape, strides, dtype, Foreign(ctx.memory, None, obj),
                 before=wait_for_producer, op=op)
