"""Device arrays of device pointers, for batched library calls (cuBLAS ``*Batched``, cuSOLVER
``potrfBatched``) that take ``T* const A[]`` in device memory.

The arrays are written in the lane's stream order, so they exist before the library call that reads
them and their memory (from the stream-ordered pool, freed on the same lane after the call) stays
valid until that call has finished. Outside a CUDA-graph capture a small kernel writes them from
(base, stride) pairs; while a graph is captured the addresses are fixed for every launch, so the words
are computed on the host and copied once into the graph's own memory (``memory.capture``), outside the
capture (:func:`upload_for_graph`): the graph holds no pointer kernel to run at each launch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from cuda.bindings import driver as cu

from ..driver import check
from .launch import grid_1d

#: Pointer arrays one kernel launch writes (A, B and C of one call at most).
MAX_ARRAYS = 3

_SRC = r"""
extern "C" __global__ void lf_ptr_strided(unsigned long long* __restrict__ dst, long long count, int arrays,
    unsigned long long b0, long long s0, unsigned long long b1, long long s1, unsigned long long b2, long long s2) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count * arrays;
       i += (long long)blockDim.x * gridDim.x) {
    long long j = i / count, k = i % count;
    unsigned long long b = j == 0 ? b0 : (j == 1 ? b1 : b2);
    long long s = j == 0 ? s0 : (j == 1 ? s1 : s2);
    dst[i] = b + (unsigned long long)(k * s);
  }
}
"""


def _build() -> tuple[str, str, str]:
    return _SRC, "lf_ptr_strided", "pqiQqQqQq"


def pointer_words(arrays: Sequence[tuple[int, int]], count: int) -> np.ndarray:
    """The words the kernel writes: array ``j`` of ``count`` pointers ``base_j + i * stride_j`` (bytes),
    the arrays one after another."""
    i = np.arange(count, dtype=np.uint64)
    return np.concatenate([np.uint64(base) + i * np.uint64(stride) for base, stride in arrays])


def upload_for_graph(mem, dst: int, words: np.ndarray, what: str) -> None:
    """Write ``words`` into graph-owned memory at ``dst`` while a graph is captured: on the pool's free
    stream, outside the capture, and finished before the capture goes on."""
    host = np.ascontiguousarray(words, np.uint64)
    check(cu.cuMemcpyHtoDAsync(dst, host.ctypes.data, host.nbytes, mem.free_stream), f"cuMemcpyHtoDAsync ({what})")
    check(cu.cuStreamSynchronize(mem.free_stream), f"cuStreamSynchronize ({what})")


def strided_pointers(lane, dst: int, arrays: Sequence[tuple[int, int]], count: int) -> list[int]:
    """Fill ``dst`` (``len(arrays) * count`` words of device memory) with the pointer arrays of
    ``arrays`` = [(base, stride in bytes), ...] on ``lane``; returns the device address of each array."""
    if not 1 <= len(arrays) <= MAX_ARRAYS:
        raise ValueError(f"strided_pointers: 1 to {MAX_ARRAYS} arrays per launch, got {len(arrays)}")
    mem = lane.ctx.memory
    if mem.capture is not None:
        upload_for_graph(mem, dst, pointer_words(arrays, count), "batched pointer arrays")
    elif count:
        flat: list[int] = []
        for j in range(MAX_ARRAYS):
            flat += list(arrays[j]) if j < len(arrays) else [0, 0]
        k = lane.ctx.modules.get(("ptr_strided",), _build)
        k.launch(lane.handle, grid_1d(lane.ctx, count * len(arrays)), (256, 1, 1),
                 (dst, count, len(arrays), *flat))
    return [dst + 8 * count * j for j in range(len(arrays))]
