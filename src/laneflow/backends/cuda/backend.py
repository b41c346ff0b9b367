"""The CUDA backend: device contexts, lanes on CUDA streams, pooled memory, NVRTC kernels, cuBLASLt."""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

import numpy as np
from cuda.bindings import driver as cu

from ...dtypes import bfloat16
from ...errors import LaneflowError
from ...runtime.backend import Backend, DeviceUnavailableError, Limits
from ...runtime import capsule as _cap
from ...runtime.buffer import Buffer
from .driver import DeviceContext, check, init
from . import interop
from .cudagraph import GraphPlan, allocate_region
from .hostsync import HostSignals
from .dispatch import KERNELS
from . import cenqueue, lanes
from .kernels import celementwise
from .kernels.launch import Modules
from .lanes import CudaLane, EventPool
from .linalg_batched import takes_batched
from .matmul import GROUPED_DTYPES, MAX_GROUP
from ...shapes import is_contiguous
from .memory import DeviceArray, Memory, StridedArray, ViewArray, slab_arrays
from .timing import StreamEventTimer


class CUDABackend(Backend):
    name = "gpu"
    host_view = False  # to_host copies: a host read does not pin the buffer
    #: elementwise chains fuse into one generated kernel (graph/fusion.py) of any size: one kernel reads
    #: each input once instead of once per op (``LANEFLOW_FUSE=0`` turns fusion off). Independent
    #: matmuls group into pointer-array batched GEMMs of up to MAX_GROUP (``matmul.matmul_group``).
    limits = Limits(max_matmul_group=MAX_GROUP, fuse_max_elements=None)
    plans_memory = True
    #: Lanes of a GPU stream when ``lanes=`` is not given. Four lets independent kernels and library
    #: calls overlap. Measured on the H200 (docs/cuda-notes.md, *Lanes*): host-bound eager steps ran
    #: 6-16 % faster on one lane, device-bound kernels 4 % faster on four; pass ``lanes=1`` for
    #: host-bound loops.
    default_lanes = 4

    def __init__(self) -> None:
        self.count = init()
        if self.count < 1:
            raise DeviceUnavailableError("no usable GPU: the NVIDIA driver reports no CUDA device; check "
                                         "`nvidia-smi` (and CUDA_VISIBLE_DEVICES), or use lf.cpu")
        self._contexts: dict[int, DeviceContext] = {}
        self._lock = threading.Lock()
        self.context(0)  # fail here, not at the first op, when the GPU is unusable
        celementwise.install(KERNELS)  # the elementwise kernel's common launch in C, where it builds
        lanes.ENQUEUE_FAST = cenqueue.fast()  # and a lane's enqueue of it

    def context(self, index: int) -> DeviceContext:
        ctx = self._contexts.get(index)
        if ctx is None:
            with self._lock:
                ctx = self._contexts.get(index)
                if ctx is None:
                    ctx = DeviceContext(index)
                    ctx.events = EventPool(ctx)
                    ctx.memory = Memory(ctx)
                    ctx.modules = Modules(ctx)
                    ctx.host_waits = HostSignals(ctx)
                    self._contexts[index] = ctx
        return ctx

    def check_device(self, device: Any) -> None:
        if not 0 <= device.index < self.count:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            raise ValueError(f"no GPU {device.index} ({device}): this process sees {self.count} GPU(s), gpu:0 to "
                             f"gpu:{self.count - 1} (CUDA_VISIBLE_DEVICES is "
                             f"{'unset' if visible is None else repr(visible)}); use an index below {self.count}, "
                             "or make more GPUs visible through CUDA_VISIBLE_DEVICES before starting Python")

    def event_timer(self, stream: Any) -> StreamEventTimer:
        """A device-event timer of ``stream``'s work across its lanes (used by ``laneflow bench``)."""
        return StreamEventTimer(stream)

    def create_lanes(self, device: Any, stream_id: int, count: int) -> list[CudaLane]:
        ctx = self.context(device.index)
        return [CudaLane(ctx, device, stream_id, k) for k in range(count)]

    def allocate(self, device: Any, shape: tuple, dtype: np.dtype, op: str) -> Buffer:
        ctx = self.context(device.index)
        h = DeviceArray(ctx, shape, dtype)
        return Buffer(device, h.nbytes, h, ctx.memory.release)

    def allocate_many(self, device: Any, specs: list, op: str) -> list[Buffer]:
        """Buffers for the outputs of one command, in one allocation (``memory.Slab``)."""
        ctx = self.context(device.index)
        release = ctx.memory.release
        return [Buffer(device, h.nbytes, h, release) for h in slab_arrays(ctx, specs)]

    def allocate_region(self, device: Any, nbytes: int, op: str) -> Buffer:
        """Raw memory for a compiled plan's region, usable on every lane at once."""
        return allocate_region(self.context(device.index), device, nbytes, op)

    #: float matmuls run epilogues through cuBLASLt (graph/epilogue.py); float64 has none there
    matmul_epilogues = frozenset((np.dtype("float16"), np.dtype("float32"), bfloat16))
    #: cuBLASLt reads transposed and strided matrices in place (``matmul._strided_matrix``); the
    #: attention kernel reads q, k, v and the mask through any strides (the heads of a QKV projection)
    strided_kinds = frozenset(("matmul", "attention", "dynamic_update_slice"))

    def strided_view(self, data, view: tuple):
        """``data`` (a DeviceArray) read through a view: a plain view when it is contiguous, else a
        :class:`~laneflow.backends.cuda.memory.StridedArray` (only matmul kernels get those)."""
        shape, strides, offset = view
        ptr = data.ptr + offset * data.dtype.itemsize if data.ptr else 0
        if is_contiguous(shape, strides):
            return ViewArray(data.ctx, shape, data.dtype, ptr)
        return StridedArray(data.ctx, shape, data.dtype, ptr, strides)

    def view(self, region: Buffer, shape: tuple, dtype: np.dtype):
        """A kernel's view of a region as an array of ``shape`` and ``dtype`` (never caches host data)."""
        return ViewArray(region.data.ctx, shape, np.dtype(dtype), region.data.ptr)

    def graph_plan(self, plan: Any, stream: Any):
        """The compiled plan as one multi-lane CUDA graph (raises graph.CaptureUnsupported when it
        cannot be one)."""
        return GraphPlan(self, plan, stream)

    def upload(self, device: Any, host: np.ndarray) -> tuple[Buffer, Callable | None]:
        ctx = self.context(device.index)
        host = np.ascontiguousarray(host)
        h = DeviceArray(ctx, host.shape, host.dtype)
        buf = Buffer(device, h.nbytes, h, ctx.memory.release)
        if h.nbytes == 0:
            return buf, None

        def copy(lane, h=h, host=host):
            check(cu.cuMemcpyHtoDAsync(h.ptr, host.ctypes.data, h.nbytes, lane.stream), "upload (cuMemcpyHtoDAsync)")
            if host.nbytes <= 1 << 16:
                h.host = host  # small constants keep their host copy (host reads, bounds checks)

        return buf, copy

    def to_host(self, buffer: Buffer, shape: tuple, dtype: np.dtype) -> np.ndarray:
        h = buffer.data
        if h.host is not None:
            return h.host.reshape(shape)
        out = np.empty(shape, dtype)
        h.copy_to_host(out)
        h.host = out  # the value is immutable and now exported: later reads reuse this copy
        return out

    # -- interop (backends/cuda/interop.py) ----------------------------------------------------
    def dlpack_device(self, device: Any) -> tuple[int, int]:
        return (_cap.KDL_CUDA, device.index)

    def export_dlpack(self, buf: Buffer, shape: tuple, dtype: np.dtype, device: Any, *, stream: Any,
                      versioned: bool, copied: bool):
        return interop.export_dlpack(self.context(device.index), buf, shape, dtype, device.index, stream=stream,
                                     versioned=versioned, copied=copied)

    def import_dlpack(self, obj: Any, stream: Any):
        return interop.import_dlpack(self, self.context(stream.device.index), obj, stream)

    def array_interface(self, buf: Buffer, shape: tuple, dtype: np.dtype) -> dict:
        self.context(buf.device.index).memory.collect_foreign()
        return interop.array_interface(buf, shape, dtype)

    def read_array_interface(self, obj: Any, op: str):
        fields = interop.read_array_interface(obj, op)
        return interop.pointer_device(fields[0]), fields

    def import_array_interface(self, obj: Any, stream: Any, fields: Any):
        dtype = interop.laneflow_dtype(fields[3], "from_cuda_array_interface")
        buf = interop.import_array_interface(self, self.context(stream.device.index), obj, stream, fields, dtype)
        return buf, dtype, fields[1]

    def groups_matmul(self, dtype: np.dtype) -> bool:
        """Float matmuls group into one pointer-array batched GEMM (``matmul.matmul_group``)."""
        return dtype in GROUPED_DTYPES

    def runs_linalg_batched(self, name: str, in_shapes: list, out_shapes: list) -> bool:
        """Small matrices in a batch: one batched cuBLAS/cuSOLVER call (``linalg_batched.takes_batched``)."""
        return takes_batched(name, in_shapes, out_shapes)

    def kernel(self, kind: str):
        try:
            return KERNELS[kind]
        except KeyError:
            raise LaneflowError(f"the CUDA backend has no kernel for primitive kind {kind!r}") from None

    def memory_stats(self, device: Any = None) -> dict:
        """Pool figures of a GPU (used and reserved bytes, pending frees) after queued frees ran."""
        return self.context(0 if device is None else device.index).memory.stats()
