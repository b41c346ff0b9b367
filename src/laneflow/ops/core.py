"""Helpers every op uses: turning arguments into graph values and building nodes."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import dtypes as dt
from ..array import Array
from ..graph.node import ArrayData, Primitive
from ..streams import resolve_stream
from .primitives import Constant, Copy

Shape = tuple


def node(prim: Primitive, inputs: Sequence[ArrayData], shape: Shape, dtype: np.dtype, stream) -> Array:
    return Array._wrap(ArrayData(tuple(shape), dtype, stream, prim, tuple(inputs)))


def to_stream(d: ArrayData, st, op: str) -> ArrayData:
    """The value on st's device: the same node, or a copy to that device."""
    if d.device == st.device:
        return d
    return ArrayData(d.shape, d.dtype, st, Copy(f"{op}.to_{st.device.type}"), (d,))


def constant(value: Any, st, dtype: np.dtype | None = None, op: str = "array") -> ArrayData:
    """Host data (list, scalar, numpy array) as a new value on st's device. Always copies."""
    try:
        host = np.array(value, dtype=dtype, copy=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise type(e)(f"{op}: cannot convert {type(value).__name__} to an array: {e}") from None
    if dtype is None:
        host = host.astype(_default_dtype(host), copy=False)
    else:
        host = host.astype(dtype, copy=False)
    return ArrayData(host.shape, host.dtype, st, Constant(host, op))


def _default_dtype(host: np.ndarray) -> np.dtype:
    if host.dtype.kind == "f":
        return host.dtype if host.dtype in dt.FLOAT_DTYPES else dt.float64
    if host.dtype.kind in "iub":
        try:
            return dt.dtype(host.dtype)
        except TypeError:
            return dt.int64 if host.dtype.kind == "i" else dt.dtype(host.dtype.name if host.dtype.itemsize == 1 else "int64")
    try:
        return dt.dtype(host.dtype)
    except TypeError:
        raise TypeError(f"array: unsupported element type {host.dtype} (laneflow supports {', '.join(map(str, dt.DTYPES))})") from None


def operand(x: Any, st, op: str) -> ArrayData:
    """An op's array argument: an Array (moved to st's device if needed) or host data (a constant)."""
    if isinstance(x, Array):
        return to_stream(x._data, st, op)
    if isinstance(x, (list, tuple, np.ndarray, np.generic, bool, int, float)):
        return constant(x, st, op=op)
    raise TypeError(f"{op}: expected an lf.Array, a number or array-like data, got {type(x).__name__}")


def stream_of(stream: Any, op: str):
    return resolve_stream(stream, op)


def normalize_axis(axis: Any, ndim: int, op: str) -> int:
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"{op}: axis must be an int, got {type(axis).__name__}")
    a = int(axis)
    if not -ndim <= a < ndim:
        raise ValueError(f"{op}: axis {a} is out of bounds for an array of {ndim} dimensions")
    return a % ndim if ndim else 0


def normalize_axes(axis: Any, ndim: int, op: str) -> tuple:
    """None means all axes; an int or a tuple of ints, each in range, without repeats."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (list, tuple)):
        axes = tuple(normalize_axis(a, ndim, op) for a in axis)
        if len(set(axes)) != len(axes):
            raise ValueError(f"{op}: repeated axis in {tuple(axis)}")
        return tuple(sorted(axes))
    return (normalize_axis(axis, ndim, op),)


def check_shape(shape: Any, op: str) -> tuple:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (int(shape),)
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise TypeError(f"{op}: shape must be an int or a sequence of ints, got {shape!r}") from None
    if any(s < 0 for s in shape):
        raise ValueError(f"{op}: negative dimension in shape {shape}")
    return shape


def describe(*ds: ArrayData) -> str:
    return ", ".join(f"{d.shape} {d.dtype}" for d in ds)
