"""laneflow's backends, registered by device type with the registry (``runtime/backend.py``).

The CPU backend is always there. The CUDA backend is created on first use of a GPU; it needs the
``cuda`` extra (cuda-bindings, nvmath-python, the CUDA libraries) and an NVIDIA driver. When one is
missing, asking for a GPU raises ``lf.DeviceUnavailableError`` saying which and what to do.
"""

from __future__ import annotations

from ..runtime.backend import DeviceUnavailableError, register
from .cpu import CPUBackend

_NO_GPU = "no usable GPU"


def _cuda_backend():
    try:
        from .cuda import CUDABackend  # the optional dependency: cuda-bindings (the `cuda` extra)
    except ImportError as e:
        raise DeviceUnavailableError(
            f"{_NO_GPU}: laneflow's CUDA backend is not installed ({e}); install it with "
            "pip install 'laneflow[cuda]' on a machine with an NVIDIA driver, or use lf.cpu") from None
    try:
        return CUDABackend()
    except DeviceUnavailableError:
        raise
    except Exception as e:  # noqa: BLE001 - the driver library is missing, or cuInit failed
        missing = type(e).__name__ == "DynamicLibNotFoundError" or "libcuda" in str(e)
        what = ("the NVIDIA driver library (libcuda) was not found" if missing
                else f"the CUDA driver could not start ({type(e).__name__}: {e})")
        raise DeviceUnavailableError(
            f"{_NO_GPU}: {what}; install an NVIDIA driver and check `nvidia-smi`, or use lf.cpu "
            "(`python -m laneflow info` shows what laneflow sees)") from None


register("cpu", CPUBackend)
register("gpu", _cuda_backend)
