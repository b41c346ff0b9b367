"""The CPU backend: numpy buffers, worker-thread lanes, numpy kernels."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ...errors import OutOfMemoryError
from ...runtime.backend import Backend
from ...runtime.buffer import Buffer
from .kernels import KERNELS
from .linalg import linalg
from .lanes import ThreadLane


class CPUBackend(Backend):
    name = "cpu"
    #: Lanes of a CPU stream when ``lanes=`` is not given. numpy releases the GIL in its kernels, so
    #: a few threads overlap well even on two cores; more only adds queueing.
    default_lanes = max(2, min(4, os.cpu_count() or 2))

    def create_lanes(self, device: Any, stream_id: int, count: int) -> list[ThreadLane]:
        return [ThreadLane(device, stream_id, k) for k in range(count)]

    def allocate(self, device: Any, shape: tuple, dtype: np.dtype, op: str) -> Buffer:
        try:
            data = np.empty(shape, dtype)
        except MemoryError:
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            raise OutOfMemoryError(op, nbytes, _free_host_bytes(), str(device)) from None
        return Buffer(device, data.nbytes, data)

    def upload(self, device: Any, host: np.ndarray):
        return Buffer(device, host.nbytes, host), None

    def to_host(self, buffer: Buffer, shape: tuple, dtype: np.dtype) -> np.ndarray:
        return buffer.data

    def kernel(self, kind: str):
        return _KERNELS[kind]


def _free_host_bytes() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


_KERNELS = dict(KERNELS, linalg=linalg)
