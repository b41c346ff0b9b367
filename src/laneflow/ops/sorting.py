"""Sorting, searching and cumulative sums along an axis (the array API's ``sort``, ``argsort``,
``searchsorted``, ``cumulative_sum``, ``cumulative_prod``): one primitive each, a kernel on every
backend (``backends/cpu/kernels.py``, ``backends/cuda/kernels/sort.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes as dt
from ..array import Array
from .core import cast, describe, node, normalize_axis, operand, ordered, stream_of
from .primitives import Scan, SearchSorted, Sort
from .reduce import _result_dtype


def _sort(name: str, x: Any, axis: int, descending: bool, stable: bool, stream: Any, arg: bool) -> Array:
    st = stream_of(stream, name)
    d = operand(x, st, name)
    ordered(name, d)
    if not d.shape:
        raise ValueError(f"{name}: a 0-d array has no axis to sort; reshape it to (1,) first")
    ax = normalize_axis(axis, len(d.shape), name)
    return node(Sort(name, ax, bool(descending), arg), (d,), d.shape, dt.int64 if arg else d.dtype, st)


def sort(x: Any, /, *, axis: int = -1, descending: bool = False, stable: bool = True, stream: Any = None) -> Array:
    """The values sorted along ``axis`` (NaN last; ``descending``: largest first, NaN first). Always
    stable: equal elements keep their order. On a GPU each element is placed by counting (O(n^2) a row)."""
    return _sort("sort", x, axis, descending, stable, stream, False)


def argsort(x: Any, /, *, axis: int = -1, descending: bool = False, stable: bool = True,
            stream: Any = None) -> Array:
    """The int64 indices that sort ``x`` along ``axis`` (see :func:`sort`; always stable)."""
    return _sort("argsort", x, axis, descending, stable, stream, True)


def searchsorted(x1: Any, x2: Any, /, *, side: str = "left", sorter: Any = None, stream: Any = None) -> Array:
    """Where each element of ``x2`` would be inserted into the sorted 1-d ``x1`` to keep it sorted
    (``side`` "left": before equal elements, "right": after them); int64 of ``x2``'s shape.
    ``sorter``: indices that sort ``x1`` (then ``x1[sorter]`` is searched)."""
    st = stream_of(stream, "searchsorted")
    if side not in ("left", "right"):
        raise ValueError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
    a, v = operand(x1, st, "searchsorted"), operand(x2, st, "searchsorted")
    if len(a.shape) != 1:
        raise ValueError(f"searchsorted: x1 must be 1-d, got {describe(a)}")
    if sorter is not None:
        from .index import take

        a = take(Array._wrap(a), sorter, stream=st)._data
    ordered("searchsorted", a, v)
    try:
        common = dt.result_type(a.dtype, v.dtype)
    except (TypeError, np.exceptions.DTypePromotionError) as e:
        raise TypeError(f"searchsorted: no common dtype for {describe(a, v)} ({e})") from None
    return node(SearchSorted(side == "right"), (cast(a, common, st), cast(v, common, st)), v.shape, dt.int64, st)


def _scan(name: str, op: str, x: Any, axis: int | None, dtype: Any, include_initial: bool, stream: Any) -> Array:
    st = stream_of(stream, name)
    d = operand(x, st, name)
    if axis is None:
        if len(d.shape) > 1:
            raise ValueError(f"{name}: axis=None needs a 0-d or 1-d array, got {describe(d)}; give axis=")
        axis = 0
    if not d.shape:
        raise ValueError(f"{name}: needs an array of at least one dimension, got a 0-d array")
    ax = normalize_axis(axis, len(d.shape), name)
    to = _result_dtype(op, d.dtype) if dtype is None else dt.dtype(dtype)
    shape = list(d.shape)
    shape[ax] += 1 if include_initial else 0
    src = d if dtype is None else cast(d, to, st)
    return node(Scan(name, op, ax, bool(include_initial)), (src,), tuple(shape), to, st)


def cumulative_sum(x: Any, /, *, axis: int | None = None, dtype: Any = None, include_initial: bool = False,
                   stream: Any = None) -> Array:
    """Running sums along ``axis`` (integers in int64, as :func:`sum`; ``include_initial``: a leading 0)."""
    return _scan("cumulative_sum", "sum", x, axis, dtype, include_initial, stream)


def cumulative_prod(x: Any, /, *, axis: int | None = None, dtype: Any = None, include_initial: bool = False,
                    stream: Any = None) -> Array:
    """Running products along ``axis`` (see :func:`cumulative_sum`; ``include_initial``: a leading 1)."""
    return _scan("cumulative_prod", "prod", x, axis, dtype, include_initial, stream)
