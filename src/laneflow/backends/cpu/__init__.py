"""CPU backend: lanes are worker threads, kernels are numpy."""

from .backend import CPUBackend

__all__ = ["CPUBackend"]
