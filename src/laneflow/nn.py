"""``lf.nn``: the layers of a transformer, each one kernel on the GPU.

>>> y = lf.nn.layer_norm(x, w, b)                                   # over the last axis
>>> o = lf.nn.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)

Every op has a numpy reference on the CPU (``backends/cpu/kernels.py``) and one kernel on the GPU:
layer and RMS norms one warp (or block) per row, the activations single elementwise steps that fuse
with their neighbours (and, after a matmul and a bias add, become cuBLASLt's ``GELU_BIAS`` epilogue:
``graph/epilogue.py``), attention one flash-style kernel (``backends/cuda/kernels/attention.py``) that
reads q, k and v through any strides, so the heads of a fused QKV projection need no copies, or cuDNN's
fused SDPA where installed and chosen (``backends/cuda/attention_choice.py``, ``LANEFLOW_ATTENTION``).
Half-precision inputs compute their statistics, scores and accumulators in float32.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import dtypes as dt
from .array import Array
from .ops.core import describe, node, operand, shared, stream_of
from .ops.elementwise import apply, unary
from .ops.table import ELEMENTWISE
from .ops.primitives import Attention, Norm
from .ops.reduce import softmax as _softmax
from .ops.shape import reshape as _reshape

__all__ = ["layer_norm", "rms_norm", "gelu", "silu", "softmax", "scaled_dot_product_attention"]


def _float_input(x: Any, st, op: str):
    d = operand(x, st, op)
    if d.dtype.kind != "f" and d.dtype != dt.bfloat16:
        raise TypeError(f"{op}: expects a floating-point array, got {describe(d)}; convert it with "
                        ".astype(lf.float32) first")
    if not d.shape:
        raise ValueError(f"{op}: expects an array of at least 1 dimension, got a 0-d array")
    return d


def _eps(eps: Any, op: str) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.integer, np.floating)):
        raise TypeError(f"{op}: eps must be a real number, got {eps!r}")
    e = float(eps)
    if not (e >= 0 and math.isfinite(e)):
        raise ValueError(f"{op}: eps must be finite and >= 0, got {eps!r}")
    return e


def _row_param(p: Any, n: int, st, op: str, what: str):
    d = operand(p, st, op)
    if d.shape != (n,):
        raise ValueError(f"{op}: {what} must have shape ({n},), the last axis of x, got {describe(d)}")
    if d.dtype.kind != "f" and d.dtype != dt.bfloat16:
        raise TypeError(f"{op}: {what} must be floating point, got {describe(d)}")
    return d


def _norm(op: str, x: Any, weight: Any, bias: Any, eps: Any, stream: Any) -> Array:
    st = stream_of(stream, op)
    d = _float_input(x, st, op)
    e = _eps(eps, op)
    n = d.shape[-1]
    ins = [d]
    if weight is not None:
        ins.append(_row_param(weight, n, st, op, "weight"))
    if bias is not None:
        ins.append(_row_param(bias, n, st, op, "bias"))
    return node(shared(Norm, op, e, weight is not None, bias is not None), ins, d.shape, d.dtype, st)


def layer_norm(x: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5, *, stream: Any = None) -> Array:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis (biased variance, eps inside
    the root, as ``torch.nn.functional.layer_norm`` over one axis). ``weight`` and ``bias`` are None
    or of shape ``(x.shape[-1],)``; the result has x's dtype. Statistics are computed in float32
    (float64 for float64 inputs)."""
    return _norm("layer_norm", x, weight, bias, eps, stream)


def rms_norm(x: Any, weight: Any = None, eps: float = 1e-6, *, stream: Any = None) -> Array:
    """``x / sqrt(mean(x**2) + eps) * weight`` over the last axis (LLaMA's RMSNorm); the result has x's
    dtype, statistics in float32 (float64 for float64)."""
    return _norm("rms_norm", x, weight, None, eps, stream)


def gelu(x: Any, approximate: str = "none", *, stream: Any = None) -> Array:
    """GELU, elementwise: ``approximate="none"`` is ``0.5 x (1 + erf(x / sqrt 2))``, ``"tanh"`` is
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (GPT-2's ``gelu_new``). Half inputs compute
    in float32."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _GELU[approximate](x, stream=stream)


#: the two GELUs as elementwise ops of the op table (dtypes of ``exp``), with the table ops' fast path
_GELU = {"none": unary(ELEMENTWISE["gelu"]), "tanh": unary(ELEMENTWISE["gelu_tanh"])}


def silu(x: Any, *, stream: Any = None) -> Array:
    """SiLU (swish), elementwise: ``x / (1 + exp(-x))``."""
    return apply("silu", (x,), stream, fn="silu", infer_with=np.exp)


def softmax(x: Any, axis: Any = -1, *, stream: Any = None) -> Array:
    """``exp(x) / sum(exp(x))`` along ``axis`` (default: the last), max subtracted; ``lf.softmax``."""
    return _softmax(x, axis, stream=stream)


def scaled_dot_product_attention(q: Any, k: Any, v: Any, *, mask: Any = None, is_causal: bool = False,
                                 scale: float | None = None, stream: Any = None) -> Array:
    """``softmax(q @ k^T * scale + mask) @ v`` per batch and head, in one kernel on the GPU.

    Shapes: ``q`` is (B, Hq, Tq, D); ``k`` is (B, Hkv, Tk, D) and ``v`` (B, Hkv, Tk, Dv), with Hq a
    multiple of Hkv (grouped-query attention: query head h reads key/value head ``h // (Hq // Hkv)``).
    The result is (B, Hq, Tq, Dv) in q's dtype; q, k and v share one floating dtype, and half types
    accumulate in float32.

    ``mask``: None; a bool array (True: attend); or a floating array added to the scores. Either
    broadcasts to (B, Hq, Tq, Tk).

    ``is_causal``: query i sees keys j <= i + Tk - Tq, aligned at the *bottom right* as in
    FlashAttention and cuDNN, so a decode step (Tq = 1) sees every key. PyTorch aligns top-left
    (j <= i); the two agree when Tq == Tk. It combines with ``mask``.

    ``scale``: the factor on the scores, 1 / sqrt(D) when None.

    A query that sees no key at all (every score masked) gets zeros, as in FlashAttention (a plain
    softmax would give NaN).
    """
    op = "scaled_dot_product_attention"
    st = stream_of(stream, op)
    dq, dk, dv = (operand(a, st, op) for a in (q, k, v))
    for name, d in (("q", dq), ("k", dk), ("v", dv)):
        if len(d.shape) != 4:
            raise ValueError(f"{op}: {name} must be 4-D (batch, heads, tokens, head_dim), got {describe(d)}")
    if not (dq.dtype == dk.dtype == dv.dtype):
        raise TypeError(f"{op}: q, k and v must share one dtype, got {describe(dq, dk, dv)}")
    if dq.dtype.kind != "f" and dq.dtype != dt.bfloat16:
        raise TypeError(f"{op}: expects floating-point q, k and v, got {describe(dq, dk, dv)}")
    B, Hq, Tq, D = dq.shape
    Bk, Hkv, Tk, Dk = dk.shape
    if dv.shape[:3] != dk.shape[:3]:
        raise ValueError(f"{op}: k and v must agree in batch, heads and tokens, got {describe(dk, dv)}")
    if Bk != B:
        raise ValueError(f"{op}: q and k have different batch sizes, got {describe(dq, dk)}")
    if Dk != D:
        raise ValueError(f"{op}: q and k must have the same head_dim, got {describe(dq, dk)}")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"{op}: q's {Hq} heads must be a multiple of k and v's {Hkv} (grouped-query "
                         f"attention), got {describe(dq, dk, dv)}")
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"{op}: is_causal must be a bool, got {is_causal!r}")
    if scale is None:
        s = 1.0 / math.sqrt(D) if D else 1.0
    else:
        if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)):
            raise TypeError(f"{op}: scale must be a real number or None, got {scale!r}")
        s = float(scale)
    ins = [dq, dk, dv]
    kind = None
    if mask is not None:
        dm = operand(mask, st, op)
        full = (B, Hq, Tq, Tk)
        if len(dm.shape) > 4 or any(m not in (1, f) for m, f in zip(dm.shape[::-1], full[::-1])):
            raise ValueError(f"{op}: mask {describe(dm)} does not broadcast to (B, Hq, Tq, Tk) = {full}")
        if dm.dtype == dt.bool_:
            kind = "bool"
        elif dm.dtype.kind == "f" or dm.dtype == dt.bfloat16:
            kind = "additive"
        else:
            raise TypeError(f"{op}: mask must be bool (True: attend) or floating (added to the scores), "
                            f"got {describe(dm)}")
        if len(dm.shape) < 4:
            dm = _reshape(Array._wrap(dm), (1,) * (4 - len(dm.shape)) + dm.shape, stream=st)._data
        ins.append(dm)
    prim = shared(Attention, s, bool(is_causal), kind)
    return node(prim, ins, (B, Hq, Tq, dv.shape[3]), dq.dtype, st)


# trace-guided replay (graph/tape.py): the layers are recorded and replayed as one call each
from .ops.tape import taped as _taped  # noqa: E402

layer_norm, rms_norm, gelu, silu, softmax, scaled_dot_product_attention = map(
    _taped, (layer_norm, rms_norm, gelu, silu, softmax, scaled_dot_product_attention))
