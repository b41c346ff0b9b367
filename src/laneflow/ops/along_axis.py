"""The array API's functions along an axis that version 2024.12 added (``take_along_axis``, ``diff``,
``count_nonzero``), built from existing primitives (integer-array indexing, slices, concatenation,
elementwise ops, sums): every backend runs them, and fusion sees ordinary ops.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes as dt
from ..array import Array
from .core import as_int, describe, normalize_axes, normalize_axis, operand, stream_of
from .elementwise import GENERATED
from .index import getitem
from .reduce import sum as _sum
from .shape import broadcast_to, concatenate


def take_along_axis(x: Any, indices: Any, /, *, axis: int = -1, stream: Any = None) -> Array:
    """Elements of ``x`` at ``indices`` along ``axis`` (numpy's ``np.take_along_axis``).

    ``indices`` has an integer dtype and ``x``'s rank; its other axes broadcast against ``x``'s. Negative
    indices count from the end; out-of-range ones raise lf.ExecutionError when the op runs.

    >>> lf.take_along_axis(x, lf.argsort(x, axis=1), axis=1)   # == lf.sort(x, axis=1)
    """
    st = stream_of(stream, "take_along_axis")
    d = operand(x, st, "take_along_axis")
    i = operand(indices, st, "take_along_axis")
    if not dt.is_integer(i.dtype):
        raise IndexError(f"take_along_axis: indices must have an integer dtype, got {describe(i)}")
    if len(i.shape) != len(d.shape) or not d.shape:
        raise ValueError(f"take_along_axis: indices must have the rank of x (at least 1), got x {describe(d)} "
                         f"and indices {describe(i)}")
    ax = normalize_axis(axis, len(d.shape), "take_along_axis")
    other = [k for k in range(len(d.shape)) if k != ax]
    try:
        np.broadcast_shapes(tuple(d.shape[k] for k in other), tuple(i.shape[k] for k in other))
    except ValueError:
        raise ValueError(f"take_along_axis: x {describe(d)} and indices {describe(i)} do not broadcast except "
                         f"along axis {ax}") from None
    if d.shape[ax] == 0 and i.shape[ax] and 0 not in i.shape:
        raise IndexError(f"take_along_axis: cannot take from empty axis {ax} of x {describe(d)}")
    # x[r0, ..., indices, ..., rN] with r_k = arange(x.shape[k]) along axis k: numpy's advanced indexing
    # broadcasts them, so axes of size 1 in x or in indices broadcast as the standard asks.
    nd = len(d.shape)
    index = tuple(Array._wrap(i) if k == ax else
                  np.arange(d.shape[k], dtype=np.int64).reshape(tuple(-1 if j == k else 1 for j in range(nd)))
                  for k in range(nd))
    return getitem(Array._wrap(d), index, stream=st)


def diff(x: Any, /, *, axis: int = -1, n: int = 1, prepend: Any = None, append: Any = None,
         stream: Any = None) -> Array:
    """The ``n``-th forward differences ``out[i] = x[i+1] - x[i]`` along ``axis``, after joining ``prepend``
    and ``append`` to ``x`` there (numpy's ``np.diff``; booleans give ``x[i+1] != x[i]`` as numpy does)."""
    st = stream_of(stream, "diff")
    d = operand(x, st, "diff")
    if not d.shape:
        raise ValueError(f"diff: needs an array of at least one dimension, got {describe(d)}")
    n = as_int(n, "n", "diff")
    if n < 0:
        raise ValueError(f"diff: n must be non-negative, got {n}")
    ax = normalize_axis(axis, len(d.shape), "diff")
    parts = [Array._wrap(d)]
    for name, extra in (("prepend", prepend), ("append", append)):
        if extra is None:
            continue
        e = operand(extra, st, "diff")
        if not e.shape:  # a scalar joins as one slice along the axis (numpy's rule)
            e = broadcast_to(Array._wrap(e), d.shape[:ax] + (1,) + d.shape[ax + 1:], stream=st)._data
        if len(e.shape) != len(d.shape) or any(a != b for k, (a, b) in enumerate(zip(e.shape, d.shape)) if k != ax):
            raise ValueError(f"diff: {name} must have the shape of x except along axis {ax}, got {name} "
                             f"{describe(e)} and x {describe(d)}")
        parts.insert(0 if name == "prepend" else len(parts), Array._wrap(e))
    a = parts[0] if len(parts) == 1 else concatenate(parts, ax, stream=st)
    step = GENERATED["not_equal" if a.dtype == dt.bool_ else "subtract"]
    pre = (slice(None),) * ax
    for _ in range(min(n, a.shape[ax])):
        a = step(getitem(a, pre + (slice(1, None),), stream=st), getitem(a, pre + (slice(None, -1),), stream=st),
                 stream=st)
    return a  # n past the axis length: empty along it, as numpy gives


def count_nonzero(x: Any, /, *, axis: Any = None, keepdims: bool = False, stream: Any = None) -> Array:
    """How many elements are non-zero (True, for booleans) over ``axis`` (None: all), as int64."""
    st = stream_of(stream, "count_nonzero")
    d = operand(x, st, "count_nonzero")
    axes = normalize_axes(axis, len(d.shape), "count_nonzero")
    nz = GENERATED["not_equal"](Array._wrap(d), False if d.dtype == dt.bool_ else 0, stream=st)
    return _sum(nz, axis=axes, keepdims=bool(keepdims), dtype=dt.int64, stream=st)
