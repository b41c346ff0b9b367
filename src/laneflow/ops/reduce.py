"""Reductions (numpy names and dtypes) and the two nn reductions, softmax and logsumexp."""

from __future__ import annotations

import builtins
from typing import Any

import numpy as np

from .. import dtypes as dt
from ..array import Array
from .core import cast, describe, node, normalize_axes, normalize_axis, operand, ordered, remembered, shared, stream_of
from .primitives import ArgReduce, LogSumExp, Reduce, Softmax
from .table import REDUCTIONS

_DTYPE_CACHE: dict = {}


def _result_dtype(name: str, d: np.dtype) -> np.dtype:
    key = (name, d)
    r = _DTYPE_CACHE.get(key)
    if r is None:
        view, had_bf = dt._numpy_view([d])
        try:
            r = np.asarray(getattr(np, REDUCTIONS[name].numpy)(np.ones(1, view[0]))).dtype
        except TypeError as e:
            raise TypeError(f"{name}: not defined for dtype {d} ({e})") from None
        r = dt._map_back(r, had_bf)
        _DTYPE_CACHE[key] = r
    return r


def _out_shape(shape: tuple, axes: tuple, keepdims: bool) -> tuple:
    if keepdims:
        return tuple([1 if i in axes else s for i, s in enumerate(shape)])
    return tuple([s for i, s in enumerate(shape) if i not in axes])


def _reduce(name: str, x: Any, axis: Any, keepdims: bool, stream: Any, ddof: int = 0) -> Array:
    st = stream_of(stream, name)
    d = operand(x, st, name)
    # the common call (axis None, a Python int or a tuple of them; keepdims a bool; ddof an int): its
    # checks and result made once per shape and dtype
    key = ((name, d.shape, d.dtype, axis, keepdims, ddof) if (axis is None or axis.__class__ is int or (
        axis.__class__ is tuple and builtins.all(a.__class__ is int for a in axis))) and keepdims.__class__ is bool
        and ddof.__class__ is int else None)
    prim, shape, dtype = (_REDUCED.get(key)
                          or remembered(_REDUCED, key, lambda: _reduction(name, d, axis, keepdims, ddof)))
    return node(prim, (d,), shape, dtype, st)


#: (name, shape, dtype, axis, keepdims, ddof) -> (primitive, result shape, result dtype)
_REDUCED: dict = {}


def _reduction(name: str, d, axis: Any, keepdims: bool, ddof: Any) -> tuple:
    axes = normalize_axes(axis, len(d.shape), name)
    row = REDUCTIONS[name]
    if row.combine in ("maximum", "minimum"):
        ordered(name, d)
    if row.moments and dt.is_complex(d.dtype):
        raise TypeError(f"{name}: not defined for complex dtypes (the array API: real floating); got {describe(d)}; "
                        f"take {name} of lf.real(x) and lf.imag(x), or of lf.abs(x)")
    if not row.empty_ok and 0 in d.shape and builtins.any(d.shape[a] == 0 for a in axes):  # (this module shadows any)
        raise ValueError(f"{name}: zero-size reduction over axes {axes} of an array {describe(d)} has no identity")
    if not isinstance(ddof, (int, np.integer)) or isinstance(ddof, bool) or ddof < 0:
        raise ValueError(f"{name}: ddof must be a non-negative int, got {ddof!r}")
    return (shared(Reduce, name, axes, bool(keepdims), int(ddof)), _out_shape(d.shape, axes, keepdims),
            _result_dtype(name, d.dtype))


def _with_dtype(name: str, x: Any, axis: Any, keepdims: bool, dtype: Any, stream: Any) -> Array:
    """sum or prod computed in ``dtype`` when given (the array API's ``dtype=``): the input cast first."""
    if dtype is None:
        return _reduce(name, x, axis, keepdims, stream)
    st = stream_of(stream, name)
    d = operand(x, st, name)
    try:
        to = dt.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"{name}: {e}") from None
    r = _reduce(name, Array._wrap(cast(d, to, st)), axis, keepdims, st)
    return r if r.dtype == to else Array._wrap(cast(r._data, to, st))


def sum(x: Any, axis: Any = None, keepdims: bool = False, *, dtype: Any = None,  # noqa: A001
        stream: Any = None) -> Array:
    """Sum over ``axis`` (None: all), in ``dtype`` when given.

    Bool and integer inputs sum in int64, as numpy does for signed ones (numpy sums unsigned ones in
    uint64, which laneflow lacks). float16 and bfloat16 accumulate in float32 and round once at the end.
    """
    return _with_dtype("sum", x, axis, keepdims, dtype, stream)


def prod(x: Any, axis: Any = None, keepdims: bool = False, *, dtype: Any = None, stream: Any = None) -> Array:
    """Product over ``axis`` (None: all), in ``dtype`` when given; integer and bool inputs give int64,
    half types accumulate in float32."""
    return _with_dtype("prod", x, axis, keepdims, dtype, stream)


def max(x: Any, axis: Any = None, keepdims: bool = False, *, stream: Any = None) -> Array:  # noqa: A001
    """Maximum over ``axis``; NaN propagates, as in numpy."""
    return _reduce("max", x, axis, keepdims, stream)


def min(x: Any, axis: Any = None, keepdims: bool = False, *, stream: Any = None) -> Array:  # noqa: A001
    """Minimum over ``axis``; NaN propagates, as in numpy."""
    return _reduce("min", x, axis, keepdims, stream)


def mean(x: Any, axis: Any = None, keepdims: bool = False, *, stream: Any = None) -> Array:
    """Arithmetic mean over ``axis``; integers give float64, half types accumulate in float32.
    The mean of an empty slice is NaN (numpy also warns)."""
    return _reduce("mean", x, axis, keepdims, stream)


def _ddof(name: str, ddof: Any, correction: Any) -> Any:
    if correction is not None and ddof not in (0, None):
        raise ValueError(f"{name}: give ddof= (numpy's name) or correction= (the array API's), not both")
    return correction if correction is not None else ddof


def _moment(name: str, x: Any, axis: Any, keepdims: bool, ddof: Any, stream: Any) -> Array:
    if isinstance(ddof, (float, np.floating)) and not float(ddof).is_integer():
        # a fractional correction: the ddof=0 variance rescaled by n / (n - correction)
        st = stream_of(stream, name)
        d = operand(x, st, name)
        n = 1
        for a in normalize_axes(axis, len(d.shape), name):
            n *= d.shape[a]
        v = _reduce("var", Array._wrap(d), axis, keepdims, st) * (n / builtins.max(n - float(ddof), 0.0) if
                                                                  n > ddof else float("inf"))
        return v if name == "var" else v ** 0.5
    if isinstance(ddof, (float, np.floating)):
        ddof = int(ddof)
    return _reduce(name, x, axis, keepdims, stream, ddof)


def var(x: Any, axis: Any = None, keepdims: bool = False, ddof: int = 0, *, correction: Any = None,
        stream: Any = None) -> Array:
    """Variance over ``axis`` with ``ddof`` (numpy's name; the array API's ``correction``) degrees of
    freedom subtracted from the count."""
    return _moment("var", x, axis, keepdims, _ddof("var", ddof, correction), stream)


def std(x: Any, axis: Any = None, keepdims: bool = False, ddof: int = 0, *, correction: Any = None,
        stream: Any = None) -> Array:
    """Standard deviation over ``axis`` with ``ddof`` (or ``correction``) degrees of freedom."""
    return _moment("std", x, axis, keepdims, _ddof("std", ddof, correction), stream)


def any(x: Any, axis: Any = None, keepdims: bool = False, *, stream: Any = None) -> Array:  # noqa: A001
    """True where any element along ``axis`` is nonzero."""
    return _reduce("any", x, axis, keepdims, stream)


def all(x: Any, axis: Any = None, keepdims: bool = False, *, stream: Any = None) -> Array:  # noqa: A001
    """True where every element along ``axis`` is nonzero."""
    return _reduce("all", x, axis, keepdims, stream)


def _arg(name: str, x: Any, axis: Any, keepdims: bool, stream: Any) -> Array:
    st = stream_of(stream, name)
    d = operand(x, st, name)
    ordered(name, d)
    if axis is None:
        if d.size == 0:
            raise ValueError(f"{name}: attempt to get {name} of an empty array {describe(d)}")
        shape = (1,) * len(d.shape) if keepdims else ()
        ax = None
    else:
        ax = normalize_axis(axis, len(d.shape), name)
        if d.shape[ax] == 0:
            raise ValueError(f"{name}: axis {ax} of {describe(d)} is empty")
        shape = _out_shape(d.shape, (ax,), keepdims)
    return node(shared(ArgReduce, name, ax, bool(keepdims)), (d,), shape, dt.int64, st)


def argmax(x: Any, axis: int | None = None, keepdims: bool = False, *, stream: Any = None) -> Array:
    """Index of the (first) maximum along ``axis`` (None: of the flattened array), as int64."""
    return _arg("argmax", x, axis, keepdims, stream)


def argmin(x: Any, axis: int | None = None, keepdims: bool = False, *, stream: Any = None) -> Array:
    """Index of the (first) minimum along ``axis`` (None: of the flattened array), as int64."""
    return _arg("argmin", x, axis, keepdims, stream)


def _float_result(name: str, d) -> np.dtype:
    return dt.ufunc_result(np.exp, (d.dtype,))


def softmax(x: Any, axis: Any = -1, *, stream: Any = None) -> Array:
    """``exp(x) / sum(exp(x))`` along ``axis`` (default: last), computed stably (max subtracted)."""
    st = stream_of(stream, "softmax")
    d = operand(x, st, "softmax")
    ordered("softmax", d)  # (it subtracts the maximum)
    axes = normalize_axes(axis, len(d.shape), "softmax")
    return node(shared(Softmax, axes), (d,), d.shape, _float_result("softmax", d), st)


def logsumexp(x: Any, axis: Any = None, keepdims: bool = False, *, stream: Any = None) -> Array:
    """``log(sum(exp(x)))`` along ``axis`` (None: all), computed stably."""
    st = stream_of(stream, "logsumexp")
    d = operand(x, st, "logsumexp")
    ordered("logsumexp", d)
    axes = normalize_axes(axis, len(d.shape), "logsumexp")
    return node(shared(LogSumExp, axes, bool(keepdims)), (d,), _out_shape(d.shape, axes, keepdims),
                _float_result("logsumexp", d), st)
