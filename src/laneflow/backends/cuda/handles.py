"""CUDA library adapters for :class:`laneflow.runtime.handle_pool.HandlePool`: cuBLASLt, cuBLAS, cuSOLVER,
cuDNN.

- cuBLASLt takes the stream and the workspace with every call, so its handle never needs a set-stream.
  A cuBLASLt handle holds no device memory that we could see (DESIGN.md), so it counts 0 bytes.
- cuBLAS (legacy API) keeps a stream in the handle: ``cublasSetStream`` before a use on another lane,
  and ``cublasSetWorkspace`` with that lane's workspace after *every* set-stream, because
  ``cublasSetStream`` silently resets the handle to its default workspace (which all lanes would share).
- cuSOLVER dense keeps a stream too (``cusolverDnSetStream``); its workspaces are passed per call,
  sized by the ``*_bufferSize`` queries, so the pool grows a per-lane scratch on demand
  (``pool.use(lane, need=bytes)``). A cuSOLVER handle also has state no workspace of ours covers
  (its internal cuBLAS handle): PyTorch's developers found one handle shared by concurrent streams
  gives run-to-run different results (pytorch/pytorch#187333). So the library is ``exclusive``: when
  a shared handle moves to another lane, that lane waits on the device (an event recorded on the
  previous lane) for the previous lane's queued work. A handle's calls then run one after another;
  under the ``stream`` policy each lane has its own handle and they overlap.

Device bytes per handle are measured with ``cuMemGetInfo`` around the first create of each library in
the process (what the driver gave the library; other allocations at that moment would blur it) and
fall back to the H200 anchors (cuBLAS 64 MiB, cuSOLVER 96 MiB) when the driver cannot tell.
A workspace is ``(pointer, bytes)`` from the stream-ordered pool, allocated and freed on its lane.

All pools of a device hang off one :class:`DeviceHandles` (``device_handles(ctx)``). A lane that goes
away must free its workspaces in every pool: ``CudaLane.destroy`` calls ``DeviceHandles.forget_lane``
(``ctx.handles``, present once any pool of the device was used).
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from cuda.bindings import driver as cu

from ...errors import LaneflowError
from ...runtime.buffer import Buffer
from ...runtime.handle_pool import HandlePool
from .driver import check

MiB = 1 << 20
#: Workspace per (handle, lane) for cuBLASLt matmuls.
LT_WORKSPACE_BYTES = 32 * MiB
#: Figures from the H200 anchors, used only when cuMemGetInfo cannot measure a create.
ESTIMATED_HANDLE_BYTES = {"cublas": 64 * MiB, "cusolverDn": 96 * MiB, "cublasLt": 0}


def _free_bytes(ctx: Any) -> int | None:
    try:
        ctx.ensure_current()
        err, free, _total = cu.cuMemGetInfo()
        return None if err else int(free)
    except Exception:  # noqa: BLE001 - only a measurement
        return None


class _Library:
    """What the CUDA adapters share: the context, workspaces from the pool, measured handle bytes."""

    name = ""
    binds_stream = True
    handle_bytes_how = "estimate"
    _measured: ClassVar[dict] = {}  # library name -> bytes measured at its first create in this process
    _measure_lock = threading.Lock()

    def __init__(self, ctx: Any, mod: Any):
        self.ctx, self.mod = ctx, mod
        if self.name in self._measured:
            self.handle_bytes_how = "measured"

    def create(self, device: Any) -> Any:
        self.ctx.ensure_current()
        if self.name in self._measured:
            return self.mod.create()
        with self._measure_lock:
            before = _free_bytes(self.ctx)
            h = self.mod.create()
            after = _free_bytes(self.ctx)
            if before is not None and after is not None and self.name not in self._measured:
                self._measured[self.name] = max(0, before - after)
                type(self).handle_bytes_how = "measured"
        return h

    def destroy(self, handle: Any) -> None:
        self.ctx.ensure_current()
        self.mod.destroy(handle)

    def handle_bytes(self, device: Any) -> int:
        return self._measured.get(self.name, ESTIMATED_HANDLE_BYTES.get(self.name, 0))

    def allocate_workspace(self, lane: Any, nbytes: int) -> tuple[int, int]:
        return self.ctx.memory.raw_alloc(nbytes, lane.stream, f"{self.name} workspace"), nbytes

    def free_workspace(self, lane: Any, ws: tuple[int, int]) -> None:
        mem = self.ctx.memory
        mem.raw_free(ws[0], mem.free_stream if getattr(lane, "closed", False) else lane.stream)


class CublasLtLibrary(_Library):
    name = "cublasLt"
    binds_stream = False

    def __init__(self, ctx: Any, lt: Any):
        super().__init__(ctx, lt)
        self.lt = lt

    def create(self, device: Any) -> Any:  # no device memory to measure (DESIGN.md); keep it cheap
        self.ctx.ensure_current()
        return self.lt.create()

    def handle_bytes(self, device: Any) -> int:
        return 0

    def set_stream(self, handle: Any, lane: Any) -> None:  # the stream goes with each call
        pass

    def workspace_bytes(self, device: Any) -> int:
        return LT_WORKSPACE_BYTES

    def set_workspace(self, handle: Any, workspace: Any, nbytes: int) -> None:  # passed with each call
        pass


class CublasLibrary(_Library):
    """cuBLAS legacy API (``cublasSgemm`` and friends)."""

    name = "cublas"

    def set_stream(self, handle: Any, lane: Any) -> None:
        self.mod.set_stream(handle, lane.handle)

    def workspace_bytes(self, device: Any) -> int:
        # cuBLAS's recommendation: 32 MiB on Hopper and newer, 4 MiB before.
        return 32 * MiB if self.ctx.cc[0] >= 9 else 4 * MiB

    def set_workspace(self, handle: Any, workspace: Any, nbytes: int) -> None:
        self.mod.set_workspace(handle, workspace[0], nbytes)


class _CudnnHandles:
    """``create``/``destroy`` as :class:`_Library` calls them (it measures the first create)."""

    def __init__(self, cudnn: Any):
        self.cudnn = cudnn

    def create(self) -> Any:
        return self.cudnn.create_handle()

    def destroy(self, handle: Any) -> None:
        self.cudnn.destroy_handle(handle)


class CudnnLibrary(_Library):
    """cuDNN through nvidia-cudnn-frontend (``cudnn_attention.py``): the stream lives in the handle
    (``cudnn.set_stream``, which the frontend's Handle skips when unchanged), the workspace goes with
    each ``execute`` and is sized per graph (``pool.use(lane, need=bytes)``)."""

    name = "cudnn"

    def __init__(self, ctx: Any, cudnn: Any):
        super().__init__(ctx, _CudnnHandles(cudnn))

    def set_stream(self, handle: Any, lane: Any) -> None:
        self.mod.cudnn.set_stream(handle=handle, stream=lane.handle)

    def workspace_bytes(self, device: Any) -> int:
        return 0  # sized per graph: use(lane, need=...)

    def set_workspace(self, handle: Any, workspace: Any, nbytes: int) -> None:
        pass  # passed to each execute


class _HandOver:
    """One handle's ordering across lanes: an event recorded on the lane it leaves."""

    __slots__ = ("event", "pending")

    def __init__(self) -> None:
        self.event = check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING.value),
                           "cuEventCreate (handle hand-over)")
        self.pending = False


class CusolverDnLibrary(_Library):
    """cuSOLVER dense: the stream lives in the handle, the workspace goes with each call, and calls of
    one handle must not overlap (``exclusive``)."""

    name = "cusolverDn"
    exclusive = True

    def hand_over(self, order: _HandOver | None, prev: Any, lane: Any) -> _HandOver:
        """``lane`` waits, on the device, for the work ``prev`` has queued (either may be None)."""
        if order is None:
            self.ctx.ensure_current()
            order = _HandOver()
        if prev is not None:  # a lane going away still has its stream here (CudaLane.destroy)
            check(cu.cuEventRecord(order.event, prev.stream), "cuEventRecord (cuSOLVER hand-over)")
            order.pending = True
        if lane is not None and order.pending:
            check(cu.cuStreamWaitEvent(lane.stream, order.event, 0), "cuStreamWaitEvent (cuSOLVER hand-over)")
        return order

    def end_order(self, order: _HandOver) -> None:
        self.ctx.ensure_current()
        check(cu.cuEventDestroy(order.event), "cuEventDestroy (handle hand-over)")

    def set_stream(self, handle: Any, lane: Any) -> None:
        self.mod.set_stream(handle, lane.handle)

    def workspace_bytes(self, device: Any) -> int:
        return 0  # sized per call (``use(lane, need=...)``)

    def set_workspace(self, handle: Any, workspace: Any, nbytes: int) -> None:
        pass


class _NoMemory:
    """The device handle of a buffer that is only an ordering token (what a lane reads of one)."""

    __slots__ = ("host", "ptr", "nbytes")

    def __init__(self) -> None:
        self.host, self.ptr, self.nbytes = None, 0, 0


class DeviceHandles:
    """The handle pools of one device, created on first use."""

    def __init__(self, ctx: Any):
        self.ctx = ctx
        self._lock = threading.Lock()
        self.pools: dict[str, HandlePool] = {}
        self.solver: Any = None  # per-device cuSOLVER state of backends/cuda/linalg.py
        # A memoryless buffer every launch of a graph with captured cuSOLVER calls writes, so the
        # encoder runs those launches one after another (they share the ``cusolverDn-graph`` handle).
        self.graph_token = Buffer(None, 0, _NoMemory())

    def pool(self, name: str) -> HandlePool:
        p = self.pools.get(name)
        if p is None:
            with self._lock:
                p = self.pools.get(name)
                if p is None:
                    p = self.pools[name] = self._make(name)
        return p

    def _make(self, name: str) -> HandlePool:
        mod = _bindings(name)
        if name == "cublas":
            return HandlePool(CublasLibrary(self.ctx, mod))
        if name == "cusolverDn":
            return HandlePool(CusolverDnLibrary(self.ctx, mod))
        if name == "cusolverDn-graph":
            # cuSOLVER calls captured into CUDA graphs: handles of their own (one per device, whatever
            # the policy), so a graph's kernels, which keep the handle's internal state, never share it
            # with eager calls; graphs using it are ordered among themselves (``graph_token``).
            return HandlePool(CusolverDnLibrary(self.ctx, mod), policy="device")
        if name == "cublasLt":
            return HandlePool(CublasLtLibrary(self.ctx, mod))
        raise ValueError(f"no handle pool for library {name!r}")

    def forget_lane(self, lane: Any, free_workspace: Any) -> None:
        for p in list(self.pools.values()):
            p.forget_lane(lane, free_workspace)


def _bindings(name: str) -> Any:
    try:
        if name == "cublas":
            from nvmath.bindings import cublas as mod
        elif name == "cublasLt":
            from nvmath.bindings import cublasLt as mod
        else:  # cusolverDn, cusolverDn-graph
            from nvmath.bindings import cusolverDn as mod
    except ImportError as e:
        raise LaneflowError(f"{name}: nvmath-python is needed on the GPU ({e}); install laneflow[cuda]") from None
    return mod


_groups_lock = threading.Lock()


def per_device(ctx: Any, attr: str, make: Any) -> Any:
    """``ctx.<attr>``, made once by ``make()`` (under a lock; later reads take none): state that one
    device's context keeps for a library (its handle pools, cuDNN's graphs)."""
    v = getattr(ctx, attr, None)
    if v is None:
        with _groups_lock:
            v = getattr(ctx, attr, None)
            if v is None:
                v = make()
                setattr(ctx, attr, v)
    return v


def device_handles(ctx: Any) -> DeviceHandles:
    """The device's :class:`DeviceHandles` (kept on the context)."""
    return per_device(ctx, "handles", lambda: DeviceHandles(ctx))


def _library_pool(ctx: Any, name: str, make: Any) -> HandlePool:
    """The device's pool ``name``, made with ``make()`` (its library adapter) on first use."""
    g = device_handles(ctx)
    with g._lock:
        p = g.pools.get(name)
        if p is None:
            p = g.pools[name] = HandlePool(make())
    return p


def cublaslt_pool(ctx: Any, lt: Any) -> HandlePool:
    """cuBLASLt's pool of the device (the matmul's)."""
    return _library_pool(ctx, "cublasLt", lambda: CublasLtLibrary(ctx, lt))


def cudnn_pool(ctx: Any, cudnn: Any) -> HandlePool:
    """cuDNN's pool of the device (the attention's), with the frontend module ``cudnn``."""
    return _library_pool(ctx, "cudnn", lambda: CudnnLibrary(ctx, cudnn))
