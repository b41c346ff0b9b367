"""CUDA backend: lanes on CUDA streams, event fences, stream-ordered pooled memory, NVRTC kernels,
cuBLASLt matmul. Importing this package needs ``cuda-bindings``; laneflow imports it only when a
GPU is asked for, so the CPU backend works without it.
"""

from .backend import CUDABackend

__all__ = ["CUDABackend"]
