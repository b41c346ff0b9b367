"""GPU interop: DLPack and ``__cuda_array_interface__`` (v3) for laneflow arrays on a GPU.

Export (laneflow is the producer). The array is evaluated (scheduled, never host-waited), its
buffer marked exported (laneflow never writes it again: no donation, no in-place reuse) and kept
alive by the capsule (DLPack) or by the exporting Array object (CUDA array interface). Stream
correctness: the consumer's stream waits on the event recorded after the command that wrote the
buffer (``cuStreamWaitEvent``; no host wait). DLPack's ``stream``: None or 1 is the legacy default
stream, 2 the per-thread default stream, another int a stream handle, -1 no synchronisation.
The CUDA array interface instead names the writer lane's stream in its ``stream`` field.

Import (laneflow is the consumer). The foreign memory is wrapped zero-copy in a buffer that laneflow
treats as a read-only input (marked exported, so it is never donated or written in place) and never
frees: it calls the producer's deleter (or drops its reference to the producer's object) once every
laneflow command that used the memory has finished. Stream correctness: the producer is asked to
order its work before a laneflow lane (DLPack: ``stream=`` that lane's handle; CUDA array interface:
laneflow records an event on the producer's ``stream`` and the lane waits on it); a no-op command on
that lane then becomes the buffer's writer, so the encoder orders every later reader after it.
Strided (non-contiguous) inputs are copied on that lane into a new laneflow buffer.

As with the CPU, the imported array shares the producer's memory: later writes by the producer
show through (copy with ``lf.array`` to get a value); the consumer must not write memory it
exported from laneflow, and must finish its own work on that memory before releasing it.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

from . import capsule as _cap

_deferred: list = []  # (points, _Foreign) whose laneflow users had not finished at release
_deferred_lock = threading.Lock()


# -- shared helpers --------------------------------------------------------------------------------

def _backend_and_ctx(device):
    from ..streams import backend_for

    b = backend_for(device)
    return b, b.context(device.index)


def _cu():
    from cuda.bindings import driver as cu

    return cu


def _check(res, what: str):
    from ..backends.cuda.driver import check

    return check(res, what)


def _done(p, poll: bool) -> bool:
    from ..backends.cuda.lanes import CudaLane

    lane = p.lane
    if isinstance(lane, CudaLane):
        return lane.fence.known(p.seq) or (poll and lane.fence.value >= p.seq)
    return lane.fence.value >= p.seq


def collect() -> int:
    """Release foreign memory whose laneflow users have finished; returns how many are still held."""
    with _deferred_lock:
        items = list(_deferred)
        _deferred.clear()
    keep = []
    for points, f in items:
        if all(_done(p, True) for p in points):
            f.close()
        else:
            keep.append((points, f))
    with _deferred_lock:
        _deferred.extend(keep)
        return len(_deferred)


class _Foreign:
    """Another library's memory behind a laneflow buffer: released once laneflow no longer uses it."""

    __slots__ = ("_keep", "_release")

    def __init__(self, release=None, keep: Any = None):
        self._release, self._keep = release, keep

    def on_buffer_death(self, buf) -> None:
        # Buffer.__del__ may run inside the garbage collector on any thread: no locks that a command
        # in flight on this thread could hold, no driver calls. Unfinished users defer the release.
        points = [p for p in (buf.writer, *buf.readers.values()) if p is not None]
        if all(_done(p, False) for p in points):
            self.close()
        else:
            with _deferred_lock:
                _deferred.append((points, self))

    def close(self) -> None:
        rel, self._release, self._keep = self._release, None, None
        if rel is not None:
            rel()


def _stream_handle(stream: Any, what: str) -> int | None:
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
    from ..backends.cuda.lanes import CudaLane

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
    cu = _cu()
    ctx.ensure_current()
    _check(cu.cuStreamWaitEvent(cu.CUstream(handle), ev, 0), "__dlpack__: cuStreamWaitEvent on the consumer's stream")


def _evaluated_buffer(x, op: str, copy: bool):
    """The buffer of x's value (or of a private device copy), scheduled and marked exported."""
    from ..graph import schedule as _sched
    from ..graph.node import ArrayData
    from ..ops.primitives import Copy

    d = x._data
    if copy:
        d = ArrayData(d.shape, d.dtype, d.stream, Copy(f"{op}.copy"), (d,))
    if d.buffer is None:
        _sched.schedule((d,))
    buf = d.buffer
    buf.exported = True  # never reused in place from now on
    if buf.error is None and buf.checks is not None:
        # a failure only the device can report (an index computed out of range): the consumer would
        # get unwritten elements, so wait for the value here and raise as an eval would
        _sched.wait(d)
    if buf.error is not None:
        raise buf.error.with_traceback(None)
    return buf, d.shape, d.dtype


# -- export ------------------------------------------------------------------------------------------

def export_dlpack(x, *, stream: Any, max_version: Any, copy: bool | None):
    """A DLPack capsule for a GPU array (zero-copy unless ``copy=True``)."""
    from ..graph.schedule import LOCK

    handle = _stream_handle(stream, "__dlpack__")
    versioned = max_version is not None and tuple(max_version)[:1] >= (1,)
    _b, ctx = _backend_and_ctx(x.device)
    collect()
    with LOCK:  # no other thread may reuse the buffer in place between reading x and marking it
        buf, shape, dtype = _evaluated_buffer(x, "__dlpack__", bool(copy))
        if handle is not None:
            _wait_for_writer(buf, handle, ctx)
    # A legacy (unversioned) consumer cannot be told the memory is read-only; it shares it anyway:
    # a device copy per export would cost memory and bandwidth, and GPU consumers that may write
    # (PyTorch, CuPy) ask for versioned capsules. laneflow itself never writes exported memory.
    return _cap.make_capsule(buf.data.ptr, shape, dtype, (_cap.KDL_CUDA, x.device.index),
                             _ExportHold(buf, ctx, handle), versioned=versioned, read_only=not copy,
                             copied=bool(copy))


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
                cu = _cu()
                self.ctx.ensure_current()
                cu.cuStreamSynchronize(cu.CUstream(self.handle))
            except Exception:  # noqa: BLE001 - a consumer stream already destroyed: nothing queued on it
                pass


_pins: dict[int, tuple] = {}  # id(Array) -> (weakref, [buffers exported through the interface])


def _pin(array, buf) -> None:
    """Keep ``buf`` alive as long as the Array object that exported it (``x[i] = v`` rebinds x)."""
    k = id(array)
    ent = _pins.get(k)
    if ent is None or ent[0]() is not array:
        def gone(r, k=k):
            e = _pins.get(k)
            if e is not None and e[0] is r:
                del _pins[k]

        ent = _pins[k] = (weakref.ref(array, gone), [])
    if not any(b is buf for b in ent[1]):
        ent[1].append(buf)


def cuda_array_interface(x) -> dict:
    """``__cuda_array_interface__`` (version 3) of a GPU array; raises AttributeError elsewhere.

    The read-only flag says False although the memory is read-only for consumers: PyTorch refuses
    read-only CUDA array interfaces outright. laneflow itself never writes the memory again."""
    if x.device.type != "gpu":
        raise AttributeError(f"__cuda_array_interface__: the array is on {x.device}, not a GPU")
    from ..backends.cuda.lanes import CudaLane
    from ..graph.schedule import LOCK

    if x.dtype.name == "bfloat16":
        raise AttributeError("__cuda_array_interface__: bfloat16 has no typestr; use DLPack (__dlpack__)")
    collect()
    with LOCK:
        buf, shape, dtype = _evaluated_buffer(x, "__cuda_array_interface__", False)
        _pin(x, buf)
        w = buf.writer
        stream = None
        if w is not None and isinstance(w.lane, CudaLane) and w.lane.fence.event_for(w.seq) is not None:
            if w.lane.closed or w.lane.closing:  # its stream goes away: a consumer must not keep the handle
                w.lane.host_wait(w.seq)
            else:
                stream = int(w.lane.handle)  # the consumer synchronises on the writer's lane
    return {"shape": tuple(shape), "typestr": dtype.str, "descr": [("", dtype.str)],
            "data": (int(buf.data.ptr), False), "strides": None, "version": 3, "stream": stream}


# -- import ------------------------------------------------------------------------------------------

def _pick_lane(st):
    lanes = st.lanes
    return lanes[0] if len(lanes) == 1 else st.encoder.policy.choose(lanes, ())


def _gpu_stream(device, stream: Any, op: str):
    from ..ops.core import stream_of

    st = stream_of(stream if stream is not None else device, op)
    if st.device != device:
        raise ValueError(f"{op}: the memory is on {device}, but stream= is on {st.device}; import it on its own "
                         "device, then move it (lf.array(x, device=...))")
    return st


def _lf_dtype(dtype: np.dtype, op: str) -> np.dtype:
    from ..dtypes import dtype as _dtype

    try:
        return _dtype(dtype)
    except TypeError as e:
        raise TypeError(f"{op}: {e}; convert it in the producing library first") from None


def _wrap(st, lane, ptr: int, shape: tuple, strides, dtype: np.dtype, foreign: _Foreign, before=None, op="from_dlpack"):
    """An Array over foreign memory (zero-copy when compact, else a strided copy on ``lane``)."""
    from ..array import Array
    from ..backends.cuda.kernels.plan import contiguous_strides
    from ..backends.cuda.memory import DeviceArray, ViewArray
    from ..graph.node import ArrayData
    from ..runtime.buffer import Buffer

    backend, ctx = _backend_and_ctx(st.device)
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
    else:
        src_h = DeviceArray(ctx, (), np.dtype(np.uint8))
        src_h.ptr = int(ptr)
        src = Buffer(st.device, 0, src_h, foreign.on_buffer_death)
        src.exported = True
        buf = backend.allocate(st.device, shape, dtype, op)
        ist = tuple(int(s) for s in strides)

        def strided(lane, out=buf.data):
            from ..backends.cuda.kernels.copy import strided_copy

            enqueue_before(lane)
            strided_copy(lane, out.ptr, dtype, int(ptr), dtype, shape, ist, contiguous_strides(shape))

        st.encoder.encode(f"{op}.copy", strided, (src,), (buf,), lane=lane)
    d = ArrayData(shape, dtype, st, None)
    d.buffer = buf
    return Array._wrap(d)


def _compact(shape: tuple, strides) -> bool:
    want = 1
    for n, s in zip(reversed(shape), reversed(tuple(strides))):
        if n != 1 and s != want:
            return 0 in shape
        want *= n
    return True


def from_dlpack_gpu(obj: Any, dev: tuple[int, int], stream: Any):
    """Import a CUDA DLPack producer (zero-copy for compact row-major tensors)."""
    from ..device import Device
    from ..graph.schedule import LOCK

    op = "from_dlpack"
    device = Device("gpu", int(dev[1]))
    st = _gpu_stream(device, stream, op)
    _b, ctx = _backend_and_ctx(device)
    collect()
    with LOCK:
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
            dtype = _lf_dtype(t.dtype, op)
        except BaseException:
            t.release()
            raise
        return _wrap(st, lane, t.ptr, t.shape, t.strides, dtype, _Foreign(t.release), op=op)


def _pointer_device(ptr: int | None) -> int:
    """The GPU a device pointer belongs to (0 when the driver cannot tell, e.g. managed memory)."""
    if not ptr:
        return 0
    try:
        cu = _cu()
        from ..streams import gpu_available

        gpu_available()  # initialises the driver
        err, dev = cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)
        return int(dev) if not err and int(dev) >= 0 else 0
    except Exception:  # noqa: BLE001 - only a fallback
        return 0


def from_cuda_array_interface(obj: Any, stream: Any = None):
    """Import an object with ``__cuda_array_interface__`` (v3 or later) zero-copy (compact layouts)."""
    from ..device import Device
    from ..graph.schedule import LOCK

    op = "from_cuda_array_interface"
    cai = obj.__cuda_array_interface__
    if int(cai.get("version", 0)) < 3:
        raise BufferError(f"{op}: CUDA array interface version {cai.get('version')} (laneflow reads 3 and later)")
    if cai.get("mask") is not None:
        raise BufferError(f"{op}: masked arrays are not supported")
    ptr, _read_only = cai["data"]
    dtype = _lf_dtype(np.dtype(cai["typestr"]), op)
    shape = tuple(int(s) for s in cai["shape"])
    strides = cai.get("strides")
    if strides is not None:
        if any(int(s) % dtype.itemsize for s in strides):
            raise BufferError(f"{op}: strides {tuple(strides)} are not multiples of the {dtype} item size")
        strides = tuple(int(s) // dtype.itemsize for s in strides)
    producer = cai.get("stream")
    producer = None if producer is None else _stream_handle(producer, op)
    device = Device("gpu", _pointer_device(ptr))
    st = _gpu_stream(device, stream, op)
    _b, ctx = _backend_and_ctx(device)

    def wait_for_producer(lane, handle=producer):
        if handle is None or handle == int(lane.handle):
            return
        cu = _cu()
        ev = _check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING.value), "cuEventCreate")
        try:
            _check(cu.cuEventRecord(ev, cu.CUstream(handle)), f"{op}: cuEventRecord on the producer's stream")
            _check(cu.cuStreamWaitEvent(lane.stream, ev, 0), f"{op}: cuStreamWaitEvent")
        finally:
            cu.cuEventDestroy(ev)  # destroyed once the recorded work completes

    collect()
    with LOCK:
        lane = _pick_lane(st)
        ctx.ensure_current()
        return _wrap(st, lane, ptr or 0, shape, strides, dtype, _Foreign(None, obj), before=wait_for_producer, op=op)
