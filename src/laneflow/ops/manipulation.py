"""The array API standard's manipulation and creation helpers, built from existing primitives
(slices, concatenation, broadcasts, reshapes, ``where``): every backend runs them, and fusion and
views see ordinary ops.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import dtypes as dt
from ..array import Array
from .core import as_int, constant, describe, normalize_axes, normalize_axis, operand, stream_of
from .creation import full
from .elementwise import where
from .index import getitem, take
from .shape import broadcast_to, concatenate, expand_dims, reshape, swapaxes, transpose


def _arr(x: Any, st, op: str) -> Array:
    return Array._wrap(operand(x, st, op))


def concat(arrays: Sequence[Any], /, *, axis: int | None = 0, stream: Any = None) -> Array:
    """Join arrays along an existing axis (the array API's name for :func:`concatenate`)."""
    return concatenate(arrays if isinstance(arrays, list) else list(arrays), axis, stream=stream)


def permute_dims(x: Any, /, axes: Sequence[int], *, stream: Any = None) -> Array:
    """Permute the axes (the array API's name for :func:`transpose` with ``axes``)."""
    return transpose(x, tuple(axes), stream=stream)


def matrix_transpose(x: Any, /, *, stream: Any = None) -> Array:
    """Swap the last two axes (a stack of matrices transposed); needs at least 2 dimensions."""
    st = stream_of(stream, "matrix_transpose")
    d = operand(x, st, "matrix_transpose")
    if len(d.shape) < 2:
        raise ValueError(f"matrix_transpose: needs an array of at least 2 dimensions, got {describe(d)}")
    return swapaxes(Array._wrap(d), -1, -2, stream=st)


def moveaxis(x: Any, source: Any, destination: Any, /, *, stream: Any = None) -> Array:
    """Move axes ``source`` to positions ``destination`` (ints or tuples of one length), others in order."""
    st = stream_of(stream, "moveaxis")
    d = operand(x, st, "moveaxis")
    nd = len(d.shape)
    src, dst = ([normalize_axis(a, nd, "moveaxis") for a in (v if isinstance(v, (tuple, list)) else (v,))]
                for v in (source, destination))
    if len(src) != len(dst) or len(set(dst)) != len(dst) or len(set(src)) != len(src):
        raise ValueError(f"moveaxis: source {source!r} and destination {destination!r} must be distinct axes "
                         "of one count")
    order = [a for a in range(nd) if a not in src]
    for s, t in sorted(zip(dst, src)):
        order.insert(s, t)
    return transpose(Array._wrap(d), tuple(order), stream=st)


def flip(x: Any, /, *, axis: Any = None, stream: Any = None) -> Array:
    """Reverse the order of elements along ``axis`` (None: every axis)."""
    st = stream_of(stream, "flip")
    d = operand(x, st, "flip")
    axes = normalize_axes(axis, len(d.shape), "flip")
    return getitem(Array._wrap(d), tuple(slice(None, None, -1) if a in axes else slice(None)
                                         for a in range(len(d.shape))), stream=st)


def roll(x: Any, /, shift: Any, *, axis: Any = None, stream: Any = None) -> Array:
    """Shift elements along ``axis`` cyclically (None: of the flattened array, then reshaped back)."""
    st = stream_of(stream, "roll")
    a = _arr(x, st, "roll")
    if axis is None:
        return reshape(roll(reshape(a, (-1,), stream=st), shift, axis=0, stream=st), a.shape, stream=st)
    shifts = (shift,) if isinstance(shift, (int, np.integer)) else tuple(shift)
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    if len(shifts) != len(axes):
        raise ValueError(f"roll: {len(shifts)} shifts for {len(axes)} axes; give one shift per axis")
    for s, ax in zip(shifts, axes):
        ax = normalize_axis(ax, a.ndim, "roll")
        n = a.shape[ax]
        k = as_int(s, "shift", "roll") % n if n else 0
        if k:
            pre = (slice(None),) * ax
            a = concatenate([getitem(a, pre + (slice(n - k, None),), stream=st),
                             getitem(a, pre + (slice(0, n - k),), stream=st)], ax, stream=st)
    return a


def tile(x: Any, repetitions: Sequence[int], /, *, stream: Any = None) -> Array:
    """``x`` repeated ``repetitions[i]`` times along axis i (shapes are aligned at the right)."""
    st = stream_of(stream, "tile")
    a = _arr(x, st, "tile")
    reps = tuple(as_int(r, "each repetition", "tile") for r in repetitions)
    if any(r < 0 for r in reps):
        raise ValueError(f"tile: repetitions must be non-negative, got {reps}")
    nd = max(len(reps), a.ndim)
    reps = (1,) * (nd - len(reps)) + reps
    shape = (1,) * (nd - a.ndim) + a.shape
    inter = tuple(v for s in shape for v in (1, s))
    wide = tuple(v for r, s in zip(reps, shape) for v in (r, s))
    b = broadcast_to(reshape(a, inter, stream=st), wide, stream=st)
    return reshape(b, tuple(r * s for r, s in zip(reps, shape)), stream=st)


def repeat(x: Any, repeats: Any, /, *, axis: int | None = None, stream: Any = None) -> Array:
    """Repeat each element ``repeats`` times (an int, or one count per element along ``axis``; None:
    the flattened array). Counts given as an lf.Array are read on the host (eager only)."""
    st = stream_of(stream, "repeat")
    a = _arr(x, st, "repeat")
    if axis is None:
        a, axis = reshape(a, (-1,), stream=st), 0
    ax = normalize_axis(axis, a.ndim, "repeat")
    n = a.shape[ax]
    if isinstance(repeats, (int, np.integer)) and not isinstance(repeats, bool):
        r = int(repeats)
        if r < 0:
            raise ValueError(f"repeat: repeats must be non-negative, got {r}")
        b = expand_dims(a, ax + 1, stream=st)
        b = broadcast_to(b, a.shape[:ax + 1] + (r,) + a.shape[ax + 1:], stream=st)
        return reshape(b, a.shape[:ax] + (n * r,) + a.shape[ax + 1:], stream=st)
    from .datadep import host_value

    counts = host_value(repeats, "repeat", "the length of the result") if isinstance(repeats, Array) else \
        np.asarray(repeats)
    if counts.dtype.kind not in "iu" or counts.ndim > 1 or (counts.ndim and counts.shape[0] not in (1, n)) \
            or (counts < 0).any():
        raise ValueError(f"repeat: repeats must be non-negative integers, one or {n} of them (axis {ax} of "
                         f"shape {a.shape}), got {counts.dtype} of shape {counts.shape}")
    index = np.repeat(np.arange(n, dtype=np.int64), np.broadcast_to(counts.reshape(-1), (n,)))
    return take(a, index, axis=ax, stream=st)


def unstack(x: Any, /, *, axis: int = 0, stream: Any = None) -> tuple[Array, ...]:
    """The slices of ``x`` along ``axis``, as a tuple."""
    st = stream_of(stream, "unstack")
    a = _arr(x, st, "unstack")
    if a.ndim == 0:
        raise ValueError("unstack: a 0-d array has no axis to unstack")
    ax = normalize_axis(axis, a.ndim, "unstack")
    return tuple(getitem(a, (slice(None),) * ax + (i,), stream=st) for i in range(a.shape[ax]))


def broadcast_arrays(*arrays: Any, stream: Any = None) -> list[Array]:
    """The arrays broadcast against each other."""
    st = stream_of(stream, "broadcast_arrays")
    arrs = [_arr(a, st, "broadcast_arrays") for a in arrays]
    try:
        shape = np.broadcast_shapes(*(a.shape for a in arrs))
    except ValueError:
        raise ValueError(f"broadcast_arrays: shapes {', '.join(str(a.shape) for a in arrs)} cannot be "
                         "broadcast together") from None
    return [broadcast_to(a, shape, stream=st) for a in arrs]


def meshgrid(*arrays: Any, indexing: str = "xy", stream: Any = None) -> list[Array]:
    """Coordinate matrices from 1-d coordinate vectors (``indexing`` "xy": Cartesian, "ij": matrix)."""
    if indexing not in ("xy", "ij"):
        raise ValueError(f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}")
    st = stream_of(stream, "meshgrid")
    arrs = [_arr(a, st, "meshgrid") for a in arrays]
    if any(a.ndim != 1 for a in arrs):
        raise ValueError(f"meshgrid: needs 1-d arrays, got shapes {', '.join(str(a.shape) for a in arrs)}")
    if arrs and len({a.dtype for a in arrs}) > 1:
        res = dt.result_type(*arrs)
        arrs = [a.astype(res) for a in arrs]
    n = len(arrs)
    sizes = [a.shape[0] for a in arrs]
    if indexing == "xy" and n >= 2:
        sizes[0], sizes[1] = sizes[1], sizes[0]
    out = []
    for i, a in enumerate(arrs):
        pos = i if indexing == "ij" or n < 2 else (1 - i if i < 2 else i)
        shape = [1] * n
        shape[pos] = a.shape[0]
        out.append(broadcast_to(reshape(a, tuple(shape), stream=st), tuple(sizes), stream=st))
    return out


def _triangle(op: str, x: Any, k: int, lower: bool, stream: Any) -> Array:
    st = stream_of(stream, op)
    a = _arr(x, st, op)
    if a.ndim < 2:
        raise ValueError(f"{op}: needs an array of at least 2 dimensions, got shape {a.shape} ({a.dtype})")
    n, m = a.shape[-2:]
    keep = np.tri(n, m, k, dtype=bool) if lower else ~np.tri(n, m, k - 1, dtype=bool)
    return where(Array._wrap(constant(keep, st, op=op)), a, full((), 0, a.dtype, stream=st), stream=st)


def tril(x: Any, /, *, k: int = 0, stream: Any = None) -> Array:
    """The lower triangle of the last two axes (elements above diagonal ``k`` zeroed)."""
    return _triangle("tril", x, as_int(k, "k", "tril"), True, stream)


def triu(x: Any, /, *, k: int = 0, stream: Any = None) -> Array:
    """The upper triangle of the last two axes (elements below diagonal ``k`` zeroed)."""
    return _triangle("triu", x, as_int(k, "k", "triu"), False, stream)
