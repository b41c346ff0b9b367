"""Which implementation runs ``lf.nn.scaled_dot_product_attention`` on the GPU, call by call.

Two implementations: the NVRTC flash-style kernel (``kernels/attention.py``: every dtype, mask and
stride, one warp per query row) and cuDNN's fused SDPA (``cudnn_attention.py``: float16/bfloat16, no
mask or causal, needs ``nvidia-cudnn-frontend`` and ``nvidia-cudnn-cu13``). ``LANEFLOW_ATTENTION``
picks, read at each call (a CUDA graph keeps what was chosen when it was captured):

- ``auto`` (default): cuDNN where it is available, supports the call, and the call is long enough
  (:func:`auto_prefers_cudnn`); the NVRTC kernel otherwise.
- ``cudnn``: cuDNN wherever it supports the call; the NVRTC kernel for the rest (never an error).
- ``nvrtc``: always the NVRTC kernel.

Every call counts which path ran and, for a fallback from cuDNN, why (``lf.cuda.attention_stats()``),
so a test or a probe can tell that cuDNN really ran.

Inside a CUDA-graph capture (``lf.compile`` and cached eager steps) cuDNN runs only when its graph
for the call was built before the capture (the first, eager call of a compiled function builds it);
``LANEFLOW_CUDNN_CAPTURE=0`` keeps captures on the NVRTC kernel, and a cuDNN call that fails under
capture turns cuDNN off for later captures in the process (the failed capture replays commands).
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from typing import Any

from . import cudnn_attention as _cudnn
from .kernels import attention as _nvrtc

MODES = ("auto", "cudnn", "nvrtc")

#: ``auto``: cuDNN from this many scores per (batch, head), ``Tq * Tk``, on; the NVRTC kernel below.
#: Measured on the H200 (``tools/probe_attention.py``, docs/cuda-notes.md): cuDNN's device time stays
#: near 45 us from GPT-2's 16-token prefill to 2,048 tokens, the NVRTC kernel's grows with Tq * Tk
#: (20 us at 16 x 16 with B=1, 34 us at 128 x 128, 438 us at 512 x 512), so the crossover lies between
#: 128² and 512²; decode steps with 256 keys stay on NVRTC (15-21 us against 43).
AUTO_CUDNN_MIN_SCORES = 256 * 256

_lock = threading.Lock()
_counts: Counter = Counter()    # path -> calls
_reasons: Counter = Counter()   # why a call that could have used cuDNN did not


def attention_mode() -> str:
    """``LANEFLOW_ATTENTION`` as it is now: ``auto`` (default), ``cudnn`` or ``nvrtc``."""
    mode = os.environ.get("LANEFLOW_ATTENTION", "auto") or "auto"
    if mode not in MODES:
        raise ValueError(f"LANEFLOW_ATTENTION must be one of {MODES}, got {mode!r}")
    return mode


def auto_prefers_cudnn(Tq: int, Tk: int) -> bool:
    """The ``auto`` rule on shapes alone (:data:`AUTO_CUDNN_MIN_SCORES`, measured)."""
    return Tq * Tk >= AUTO_CUDNN_MIN_SCORES


def capture_allowed() -> str | None:
    """None when cuDNN may run inside a CUDA-graph capture, else why not."""
    if os.environ.get("LANEFLOW_CUDNN_CAPTURE", "1") == "0":
        return "LANEFLOW_CUDNN_CAPTURE=0"
    return _cudnn.capture_failure()


def choose(mode: str, prim: Any, q: Any, k: Any, v: Any, capturing: bool) -> tuple[str, Any]:
    """``("cudnn", spec)`` or ``("nvrtc", reason)``: the reason is None when cuDNN was not wanted
    (``nvrtc`` mode, or ``auto`` on a short call), else why a wanted cuDNN call cannot run. Needs no
    GPU: shapes, dtypes and strides only."""
    if mode == "nvrtc":
        return "nvrtc", None
    if mode == "auto" and not auto_prefers_cudnn(q.shape[2], k.shape[2]):
        return "nvrtc", None
    spec = _cudnn.spec_of(prim, q, k, v)
    if isinstance(spec, str):
        return "nvrtc", spec
    why = _cudnn.unavailable_reason()
    if why is None and capturing:
        why = capture_allowed()
    if why is not None:
        return "nvrtc", why
    return "cudnn", spec


def _count(path: str, reason: str | None) -> None:
    with _lock:
        _counts[path] += 1
        if reason is not None:
            _reasons[reason] += 1


def attention(lane: Any, prim: Any, ins: list, outs: list) -> None:
    """The ``attention`` kind's CUDA kernel (``dispatch.KERNELS``): cuDNN or the NVRTC kernel."""
    q, k, v = ins[:3]
    out = outs[0]
    if out.size == 0:
        return
    capturing = lane.ctx.memory.capture is not None
    path, info = choose(attention_mode(), prim, q, k, v, capturing)
    if path == "cudnn":
        reason = _cudnn.run(lane, info, q, k, v, out, capturing)
        if reason is None:
            _count("cudnn", None)
            return
        info = reason
    _count("nvrtc", info)
    _nvrtc.attention(lane, prim, ins, outs)


def stats() -> dict[str, Any]:
    """Calls per path since the last reset and the reasons cuDNN was passed over (``lf.cuda.attention_stats``)."""
    with _lock:
        return {"cudnn": _counts["cudnn"], "nvrtc": _counts["nvrtc"], "fallbacks": dict(_reasons),
                "cudnn_unavailable": _cudnn.unavailable_reason(), "mode": attention_mode()}


def reset_stats() -> None:
    with _lock:
        _counts.clear()
        _reasons.clear()
