"""Checked calls into the CUDA driver (cuda-bindings), and the per-device context.

Every driver call returns ``(CUresult, *values)``; :func:`check` turns a failure into a
:class:`CudaError` that carries the CUDA error name and what laneflow was doing. The
:class:`DeviceContext` owns what is per device: the primary context, the memory pool, the kernel
modules, library handles and the helpers for CPU<->GPU waits.
"""

from __future__ import annotations

import threading
from typing import Any

from cuda.bindings import driver as cu

from ...errors import LaneflowError
from . import fastcall

SUCCESS = cu.CUresult.CUDA_SUCCESS
NOT_READY = cu.CUresult.CUDA_ERROR_NOT_READY
OUT_OF_MEMORY = cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY
PEER_ACCESS_ALREADY_ENABLED = cu.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED


class CudaError(LaneflowError):
    """A CUDA driver call failed. ``name`` is the CUDA error name (e.g. ``CUDA_ERROR_INVALID_VALUE``)."""

    def __init__(self, what: str, err: Any):
        self.name = error_name(err)
        self.code = int(err)
        super().__init__(f"{what}: {self.name}")


def error_name(err: Any) -> str:
    try:
        e, s = cu.cuGetErrorName(cu.CUresult(int(err)))
        if e == SUCCESS and s:
            return s.decode()
    except Exception:  # noqa: BLE001 - the name is only for the message
        pass
    return f"CUDA error {int(err)}"


def check(res: tuple, what: str) -> Any:
    """The value(s) of a driver call's result tuple; raises CudaError on failure."""
    err = res[0]
    if err:
        raise CudaError(what, err)
    n = len(res)
    if n == 1:
        return None
    if n == 2:
        return res[1]
    return res[1:]


def fail(err: Any, what: str) -> None:
    raise CudaError(what, err)


_initialised = False
_init_lock = threading.Lock()


def init() -> int:
    """cuInit once; returns the number of devices."""
    global _initialised
    with _init_lock:
        if not _initialised:
            check(cu.cuInit(0), "cuInit")
            _initialised = True
    return check(cu.cuDeviceGetCount(), "cuDeviceGetCount")


_tls = threading.local()


class DeviceContext:
    """Everything laneflow holds for one GPU. Created once per device index by the backend."""

    def __init__(self, index: int):
        self.index = index
        self.device = check(cu.cuDeviceGet(index), f"cuDeviceGet({index})")
        self.ctx = check(cu.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        self.make_current()
        a = cu.CUdevice_attribute
        self.cc = (self.attribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                   self.attribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
        self.sm_count = self.attribute(a.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        try:
            self.stream_mem_ops = bool(self.attribute(a.CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS))
        except CudaError:
            self.stream_mem_ops = False
        name = check(cu.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        self.name = name.split(b"\0", 1)[0].decode(errors="replace")
        # Filled in by the backend (they import this module, not the other way round).
        self.memory: Any = None
        self.modules: Any = None
        self.host_waits: Any = None
        self.matmul: Any = None
        self.lock = threading.RLock()
        self.calls = fastcall.calls(cu)  # the per-command driver calls
        self.peers: dict[int, bool] = {}  # other GPU's index -> whether this one accesses its memory directly

    @property
    def arch(self) -> str:
        return f"sm_{self.cc[0]}{self.cc[1]}"

    def attribute(self, attr: Any) -> int:
        return check(cu.cuDeviceGetAttribute(attr, self.device), f"cuDeviceGetAttribute({attr})")

    def make_current(self) -> None:
        check(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        _tls.current = self

    def ensure_current(self) -> None:
        """Make this device's context current on the calling thread (cheap when it already is)."""
        if getattr(_tls, "current", None) is not self:
            self.make_current()

    def peer_access(self, other: "DeviceContext") -> bool:
        """Enable this GPU's direct access to ``other``'s memory, once per pair, where
        ``cuDeviceCanAccessPeer`` says the hardware allows it (a peer copy then goes over NVLink or
        PCIe directly instead of through the host). Returns whether it is enabled. Called by the copy
        between GPUs on this GPU's lane, whose context is current."""
        ok = self.peers.get(other.index)
        if ok is None:
            with self.lock:
                ok = self.peers.get(other.index)
                if ok is None:
                    what = f"peer access gpu:{self.index} -> gpu:{other.index}"
                    ok = bool(check(cu.cuDeviceCanAccessPeer(self.device, other.device), f"{what} (cuDeviceCanAccessPeer)"))
                    if ok:
                        self.ensure_current()
                        err = cu.cuCtxEnablePeerAccess(other.ctx, 0)[0]
                        if err and err != PEER_ACCESS_ALREADY_ENABLED:  # (enabled by another library: fine)
                            fail(err, f"{what} (cuCtxEnablePeerAccess)")
                    self.peers[other.index] = ok
        return ok

    def synchronize(self) -> None:
        self.ensure_current()
        check(cu.cuCtxSynchronize(), "cuCtxSynchronize")

    def free_bytes(self) -> int | None:
        try:
            self.ensure_current()
            free, _total = check(cu.cuMemGetInfo(), "cuMemGetInfo")
            return int(free)
        except Exception:  # noqa: BLE001 - only for error messages
            return None
