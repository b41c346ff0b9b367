"""The CPU backend: numpy buffers, worker-thread lanes, numpy kernels."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ...dtypes import bfloat16
from ...errors import LaneflowError, OutOfMemoryError
from ...runtime.backend import Backend, Limits
from ...runtime.buffer import Buffer
from .executor import CPUPlan
from .kernels import KERNELS, as_view
from .lanes import ThreadLane


class CPUBackend(Backend):
    name = "cpu"
    #: Lanes of a CPU stream when ``lanes=`` is not given. numpy releases the GIL in its kernels, so
    #: a few threads overlap well even on two cores; more only adds queueing.
    default_lanes = max(2, min(4, os.cpu_count() or 2))
    #: chains of elementwise ops run as one command (graph/fusion.py): less host cost per op; only
    #: for small arrays, where that cost dominates (larger ones keep lane parallelism across branches).
    #: Matmuls do not group: lanes already run them in parallel, and one command would serialise them.
    limits = Limits(max_matmul_group=0, fuse_max_elements=1 << 16)
    plans_memory = True

    def create_lanes(self, device: Any, stream_id: int, count: int) -> list[ThreadLane]:
        if count > 1:
            _limit_blas_threads()
        return [ThreadLane(device, stream_id, k) for k in range(count)]

    def allocate(self, device: Any, shape: tuple, dtype: np.dtype, op: str) -> Buffer:
        try:
            data = np.empty(shape, dtype)
        except MemoryError:
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            raise OutOfMemoryError(op, nbytes, _free_host_bytes(), str(device)) from None
        return Buffer(device, data.nbytes, data)

    def allocate_region(self, device: Any, nbytes: int, op: str) -> Buffer:
        """Raw memory for a compiled plan's region (see graph/memory_plan.py)."""
        return self.allocate(device, (nbytes,), np.dtype(np.uint8), op)

    def view(self, region: Buffer, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """A typed view of the start of a region, for a kernel's input or output."""
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return region.data[:n].view(dtype).reshape(shape)

    def graph_plan(self, plan: Any, stream: Any) -> CPUPlan:
        """A compiled plan as one command running every step's kernel in turn (``executor.py``)."""
        return CPUPlan(self, plan, stream)

    def upload(self, device: Any, host: np.ndarray):
        return Buffer(device, host.nbytes, host), None

    def to_host(self, buffer: Buffer, shape: tuple, dtype: np.dtype) -> np.ndarray:
        return buffer.data

    #: numpy kernels read any strided view. Not matmul: OpenBLAS rounds a product with a transposed
    #: operand differently by the operand's address alignment (1 ulp in float64, found by the
    #: differential fuzzer), so a matmul reads a contiguous copy and its bits do not depend on where a
    #: plan's arena put its input.
    #: (The attention kernel copies its operands before its products, so it takes views too.)
    #: float matmuls run epilogues (graph/epilogue.py)
    matmul_epilogues = frozenset(np.dtype(d) for d in ("float16", "float32", "float64")) | {bfloat16}
    strided_kinds = frozenset(("elementwise", "astype", "fused", "rowfused", "reduce", "argreduce", "softmax", "logsumexp",
                               "norm", "attention", "dynamic_update_slice"))

    def strided_view(self, data: np.ndarray, view: tuple) -> np.ndarray:
        return as_view(data, *view)

    def kernel(self, kind: str):
        try:
            return KERNELS[kind]
        except KeyError:
            raise LaneflowError(f"the CPU backend has no kernel for primitive kind {kind!r}") from None


_blas_limited = False


def _limit_blas_threads() -> None:
    """Lanes are the CPU backend's parallelism. BLAS threads on top of them oversubscribe the cores,
    and OpenBLAS then stalls concurrent callers (measured on 2 cores with 2-4 lanes: 4-400 ms stalls
    for GEMMs that take 0.1 ms alone). So once a multi-lane CPU stream exists, BLAS runs one thread
    per call: process-wide, set ``LANEFLOW_CPU_BLAS_THREADS`` to choose another count (0: leave BLAS alone).
    """
    global _blas_limited
    if _blas_limited:
        return
    _blas_limited = True
    n = int(os.environ.get("LANEFLOW_CPU_BLAS_THREADS", "1"))
    if n > 0:
        from threadpoolctl import threadpool_limits

        threadpool_limits(n, user_api="blas")


def _free_host_bytes() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None

