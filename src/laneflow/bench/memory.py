"""Memory in use, for the handles suite: device-wide on the GPU (what nvidia-smi shows), the
process's resident set on the CPU."""

from __future__ import annotations

import os
from typing import Any


def device_used_bytes(device: Any) -> int | None:
    """Bytes in use on ``device`` now, or None when this machine cannot tell."""
    if device.type == "cpu":
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return None
    try:
        from cuda.bindings import runtime as rt

        rt.cudaFree(0)  # make sure a context exists
        err, free, total = rt.cudaMemGetInfo()
        if int(err) == 0:
            return int(total) - int(free)
    except Exception:  # noqa: BLE001 - fall back to a framework that is here
        pass
    try:
        import torch

        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info(device.index)
            return total - free
    except Exception:  # noqa: BLE001
        pass
    return None
