"""``lf.cuda``: CUDA-specific controls. Importable without a GPU; the functions that need the CUDA
backend say so when it is missing."""

from __future__ import annotations

from .runtime.handle_pool import (  # noqa: F401
    POLICIES, handle_policy, handle_stats, reset_handle_stats, set_handle_policy,
)


def set_allow_tf32(allow: bool) -> None:
    """Let float32 matmuls use TF32 tensor cores (about 1e-3 relative error). Off by default;
    ``LANEFLOW_ALLOW_TF32=1`` turns it on for the process."""
    from .backends.cuda.matmul import set_allow_tf32 as _set

    _set(allow)


__all__ = ["POLICIES", "handle_policy", "handle_stats", "reset_handle_stats", "set_handle_policy", "set_allow_tf32"]
