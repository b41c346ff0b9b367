"""Matrix multiplication (``lf.matmul`` and ``@``) with numpy's rules for 1-D and batched operands."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes as dt
from ..array import Array
from ..defaults import current_stream
from ..graph import early
from .core import broadcast_shapes, cast, describe, node, operand, shared, stream_of
from .primitives import Matmul


_FAST = frozenset(dt.FLOAT_DTYPES)  # the matmul fast path: one float dtype for both operands


def matmul(a: Any, b: Any, /, *, stream: Any = None) -> Array:
    """Matrix product; leading dimensions broadcast as batches. float16/bfloat16 accumulate in float32."""
    st = current_stream() if stream is None else stream_of(stream, "matmul")
    if a.__class__ is Array and b.__class__ is Array:
        x, y = a._data, b._data
        device = st.device
        if (x.device is not device and x.device != device) or (y.device is not device and y.device != device):
            x, y = operand(a, st, "matmul"), operand(b, st, "matmul")
    else:
        x, y = operand(a, st, "matmul"), operand(b, st, "matmul")
    if not x.shape or not y.shape:
        raise ValueError(f"matmul: operands must be at least 1-D, got {describe(x, y)}")
    if early.EVERY:
        early.matmul_made(st, (x, y))
    xs, ys = x.shape, y.shape
    if (x.dtype is y.dtype and len(xs) == len(ys) and len(xs) >= 2 and xs[:-2] == ys[:-2]
            and xs[-1] == ys[-2] and x.dtype in _FAST):
        # the common case (equal batches, one float dtype) without broadcasting or promotion rules;
        # groupable with products like it unless it is empty
        gkey = (xs, ys, x.dtype) if xs[-1] and xs[-2] and ys[-1] and 0 not in xs[:-2] else None
        return node(shared(Matmul, gkey), (x, y), xs[:-1] + ys[-1:], x.dtype, st)
    if (x.dtype is y.dtype and len(ys) == 2 and len(xs) > 2 and xs[-1] == ys[0] and x.dtype in _FAST):
        # a batch of rows times one matrix (a projection of (batch, tokens, d)): no broadcasting rules
        return node(shared(Matmul, None), (x, y), xs[:-1] + ys[-1:], x.dtype, st)
    xm = xs if len(xs) > 1 else (1,) + xs
    ym = ys if len(ys) > 1 else ys + (1,)
    if xm[-1] != ym[-2]:
        raise ValueError(f"matmul: inner dimensions differ: {describe(x, y)} ({xm[-1]} != {ym[-2]})")
    try:
        batch = broadcast_shapes([xm[:-2], ym[:-2]])
    except ValueError:
        raise ValueError(f"matmul: batch dimensions of {describe(x, y)} cannot be broadcast") from None
    shape = batch + (xm[-2], ym[-1])
    if len(xs) == 1:
        shape = shape[:-2] + shape[-1:]
    if len(ys) == 1:
        shape = shape[:-1]
    try:
        dtype = dt.result_type(x.dtype, y.dtype)
    except (TypeError, np.exceptions.DTypePromotionError) as e:
        raise TypeError(f"matmul: no common dtype for {describe(x, y)} ({e})") from None
    common = dt.operand_dtype([x.dtype, y.dtype])
    if common is not None:  # int8 with uint8: multiply and accumulate in int32 (numpy: int16)
        x, y = cast(x, common, st), cast(y, common, st)
    return node(shared(Matmul, None), (x, y), shape, dtype, st)
