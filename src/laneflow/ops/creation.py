"""Array creation: from host data, constants, ranges and identity matrices."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import dtypes as dt
from ..array import Array
from ..device import Device, as_device
from ..interop import dlpack as _dlpack
from .core import check_shape, constant, node, shared, stream_of, to_stream
from .primitives import Arange, Eye, Full, Linspace
from .shape import astype


def _stream(device: Any, stream: Any, op: str):
    if device is not None and stream is not None:
        raise ValueError(f"{op}: give device= or stream=, not both")
    if device is not None:
        return stream_of(as_device(device, f"{op}: bad device={device!r}"), op)
    return stream_of(stream, op)


def _dtype(dtype: Any, op: str) -> np.dtype | None:
    if dtype is None:
        return None
    try:
        return dt.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"{op}: {e}") from None


def array(obj: Any, dtype: Any = None, device: Device | str | None = None, *, stream: Any = None) -> Array:
    """A new array from host data (lists, scalars, numpy arrays) or another lf.Array.

    Host data is copied at once, so later changes to ``obj`` do not show. Python floats give
    float64 and Python ints int64, as in numpy.
    """
    st = _stream(device, stream, "array")
    to = _dtype(dtype, "array")
    if isinstance(obj, Array):
        d = to_stream(obj._data, st, "array")
        out = Array._wrap(d)
        return astype(out, to, stream=st) if to is not None and to != d.dtype else out
    if hasattr(obj, "__dlpack__") and not isinstance(obj, np.ndarray):
        # from_dlpack shares the producer's memory; copy it now, so later producer writes do not show.
        shared = _dlpack.from_dlpack(obj)
        return Array._wrap(constant(np.asarray(shared), st, to if to is not None else shared.dtype, op="array"))
    return Array._wrap(constant(obj, st, to, op="array"))


def asarray(obj: Any, dtype: Any = None, device: Device | str | None = None, *, copy: bool | None = None,
            stream: Any = None) -> Array:
    """Like :func:`array`, but returns ``obj`` itself when it already is an Array of that dtype and device.

    ``copy=True`` always gives a new array object (arrays are values, so no buffer is copied: an in-place
    operator on the new object leaves ``obj`` as it was); ``copy=False`` raises ValueError where a copy
    is needed (host data, a dtype or device change), as the array API standard says.
    """
    if isinstance(obj, Array) and (dtype is None or dt.dtype(dtype) == obj.dtype) and \
            (device is None or obj.device == stream_of(device, "asarray").device) and stream is None:
        return Array._wrap(obj._data) if copy else obj
    if copy is False:
        what = "host data" if not isinstance(obj, Array) else f"a {obj.dtype} array on {obj.device}"
        raise ValueError(f"asarray: copy=False, but {what} must be copied to give the array asked for "
                         f"(dtype={dtype}, device={device}); pass copy=None to allow the copy")
    if not isinstance(obj, Array) and isinstance(obj, (list, tuple)) and _holds_arrays(obj):
        from .shape import stack

        return asarray(stack([asarray(o, dtype, device, stream=stream) for o in obj]), dtype, stream=stream)
    return array(obj, dtype, device, stream=stream)


def _holds_arrays(obj: Any) -> bool:
    return any(isinstance(o, Array) or (isinstance(o, (list, tuple)) and _holds_arrays(o)) for o in obj)


def _full(op: str, shape: Any, fill_value: Any, dtype: Any, device: Any, stream: Any) -> Array:
    st = _stream(device, stream, op)
    shape = check_shape(shape, op)
    to = _dtype(dtype, op)
    if to is None:
        to = _dtype(type(fill_value) if isinstance(fill_value, (bool, int, float, complex)) else np.asarray(fill_value).dtype, op)
    try:
        with np.errstate(all="ignore"):
            value = np.array(fill_value, dtype=to)
    except (TypeError, ValueError, OverflowError) as e:
        raise type(e)(f"{op}: cannot fill a {to} array with {fill_value!r}: {e}") from None
    if value.ndim:
        raise ValueError(f"{op}: fill_value must be a scalar, got shape {value.shape}")
    return node(Full(value[()], op), (), shape, to, st)


def full(shape: Any, fill_value: Any, dtype: Any = None, device: Any = None, *, stream: Any = None) -> Array:
    """An array of ``shape`` filled with ``fill_value`` (dtype inferred from it when not given)."""
    return _full("full", shape, fill_value, dtype, device, stream)


def zeros(shape: Any, dtype: Any = dt.float64, device: Any = None, *, stream: Any = None) -> Array:
    """An array of zeros (float64 by default, as numpy)."""
    return _full("zeros", shape, 0, dtype if dtype is not None else dt.float64, device, stream)


def ones(shape: Any, dtype: Any = dt.float64, device: Any = None, *, stream: Any = None) -> Array:
    """An array of ones (float64 by default, as numpy)."""
    return _full("ones", shape, 1, dtype if dtype is not None else dt.float64, device, stream)


def _like(x: Any, dtype: Any, op: str) -> tuple:
    """Shape and dtype of x (an Array or array-like host data), the dtype overridden by ``dtype``."""
    if isinstance(x, Array):
        return x.shape, x.dtype if dtype is None else _dtype(dtype, op)
    host = np.asarray(x)
    return host.shape, _dtype(dt.wider(host.dtype) or host.dtype if dtype is None else dtype, op)


def zeros_like(x: Any, dtype: Any = None, *, device: Any = None, stream: Any = None) -> Array:
    """Zeros with the shape and dtype of ``x``."""
    shape, to = _like(x, dtype, "zeros_like")
    return _full("zeros_like", shape, 0, to, device, stream)


def ones_like(x: Any, dtype: Any = None, *, device: Any = None, stream: Any = None) -> Array:
    """Ones with the shape and dtype of ``x``."""
    shape, to = _like(x, dtype, "ones_like")
    return _full("ones_like", shape, 1, to, device, stream)


def full_like(x: Any, fill_value: Any, dtype: Any = None, *, device: Any = None, stream: Any = None) -> Array:
    """``fill_value`` with the shape and dtype of ``x``."""
    shape, to = _like(x, dtype, "full_like")
    return _full("full_like", shape, fill_value, to, device, stream)


def arange(start: Any, stop: Any = None, step: Any = None, dtype: Any = None, device: Any = None, *,
           stream: Any = None) -> Array:
    """Evenly spaced values in [start, stop), as ``np.arange``.

    Element i is ``start + i * step`` computed exactly (integers) or in float64, then converted to
    ``dtype`` once (floats round to nearest, integers truncate towards zero). numpy instead converts
    the first two values to ``dtype`` and repeats their difference, so with a fractional step it can
    drift (``np.arange(0, 3, 0.1, dtype=np.float16)``) or give surprising integers
    (``np.arange(-1, 1, 0.5, dtype=np.int32)`` is ``[-1, 0, 1, 2]``; laneflow gives ``[-1, 0, 0, 0]``).
    With an integer step, or without ``dtype``, the results are numpy's.
    """
    st = _stream(device, stream, "arange")
    if stop is None:
        start, stop = 0, start
    if step is None:
        step = 1
    for name, v in (("start", start), ("stop", stop), ("step", step)):
        if not isinstance(v, (int, float, np.integer, np.floating)) or isinstance(v, bool):
            raise TypeError(f"arange: {name} must be a real number, got {v!r}")
    if step == 0:
        raise ValueError("arange: step must not be zero")
    n = max(0, math.ceil((stop - start) / step))
    # numpy's rule: each bound as an array (Python ints int64, floats float64), then promoted.
    to = _dtype(dtype, "arange") or dt.dtype(np.result_type(*(np.asarray(v) for v in (start, stop, step))))
    prim = shared(Arange, start, step) if start.__class__ is int and step.__class__ is int else Arange(start, step)
    return node(prim, (), (n,), to, st)


def linspace(start: float, stop: float, num: int = 50, endpoint: bool = True, dtype: Any = None,
             device: Any = None, *, stream: Any = None) -> Array:
    """``num`` evenly spaced values from start to stop (float64 by default, as numpy; complex128 when a
    bound is complex, as the array API says).

    With an integer ``dtype`` the values round towards -inf, as in numpy >= 2.
    """
    st = _stream(device, stream, "linspace")
    if not isinstance(num, (int, np.integer)) or isinstance(num, bool) or num < 0:
        raise ValueError(f"linspace: num must be a non-negative int, got {num!r}")
    cx = any(isinstance(v, (complex, np.complexfloating)) for v in (start, stop))
    to = _dtype(dtype, "linspace") or (dt.complex128 if cx else dt.float64)
    if cx and not dt.is_complex(to):
        raise TypeError(f"linspace: complex bounds {start!r}, {stop!r} need a complex dtype, got {to}")
    bound = complex if cx else float
    return node(Linspace(bound(start), bound(stop), bool(endpoint)), (), (int(num),), to, st)


def eye(n: int, m: int | None = None, k: int = 0, dtype: Any = dt.float64, device: Any = None, *,
        stream: Any = None) -> Array:
    """Identity-like matrix with ones on diagonal ``k``."""
    st = _stream(device, stream, "eye")
    m = n if m is None else m
    for name, v in (("n", n), ("m", m)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
            raise ValueError(f"eye: {name} must be a non-negative int, got {v!r}")
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool):
        raise TypeError(f"eye: k must be an int, got {k!r}")
    return node(Eye(int(k)), (), (int(n), int(m)), _dtype(dtype, "eye") or dt.float64, st)


def empty(shape: Any, dtype: Any = dt.float64, device: Any = None, *, stream: Any = None) -> Array:
    """An array of ``shape`` (laneflow fills it with zeros: values are never left uninitialised)."""
    return _full("empty", shape, 0, dtype if dtype is not None else dt.float64, device, stream)


def empty_like(x: Any, /, *, dtype: Any = None, device: Any = None, stream: Any = None) -> Array:
    """An array with the shape and dtype of ``x`` (zeros, as :func:`empty`)."""
    shape, to = _like(x, dtype, "empty_like")
    return _full("empty_like", shape, 0, to, device, stream)


def from_dlpack(x: Any, /, *, device: Any = None, copy: bool | None = None, stream: Any = None) -> Array:
    """An lf.Array over another library's memory (zero-copy where it can: ``interop/dlpack.py``).

    ``copy=True`` copies the values now (later writes by the producer do not show); ``device=`` moves
    them to that device (a copy, refused with ``copy=False``)."""
    if copy:
        return array(x, device=device, stream=stream)
    out = _dlpack.from_dlpack(x, stream=stream)
    if device is not None and out.device != as_device(device, f"from_dlpack: bad device={device!r}"):
        if copy is False:
            raise ValueError(f"from_dlpack: the data is on {out.device}, device={device} needs a copy, "
                             "but copy=False was given")
        return asarray(out, device=device)
    return out
