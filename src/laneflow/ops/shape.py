"""Shape ops: reshape, transpose and friends, concatenation, splitting, dtype casts."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .. import dtypes as dt
from ..array import Array
from .core import as_int, check_shape, describe, node, normalize_axis, operand, remembered, shared, stream_of
from .primitives import AsType, BroadcastTo, Concatenate, GetItem, Reshape, Transpose


def _same(d, st) -> Array:
    return Array._wrap(d)


def astype(x: Any, dtype: Any, *, copy: bool = True, device: Any = None, stream: Any = None) -> Array:
    """A copy cast to ``dtype`` (numpy's unsafe casting: floats truncate towards zero into ints,
    integers wrap around, nonzero becomes True).

    As in C and numpy, converting NaN, infinity or a float outside the integer dtype's range (a
    negative float into uint8, say) gives an unspecified value, which may differ between devices.

    Real dtypes convert to complex ones (imaginary part zero); complex to a real numeric dtype is
    refused, as the array API says (numpy silently drops the imaginary part): cast ``lf.real(x)`` or
    ``lf.imag(x)``. Complex to bool is ``x != 0``.
    """
    st = stream_of(stream if device is None else device, "astype")
    d = operand(x, st, "astype")
    try:
        to = dt.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"astype: {e}") from None
    if to == d.dtype:
        return _same(d, st)
    if dt.is_complex(d.dtype) and not dt.is_complex(to) and to != dt.bool_:
        raise TypeError(f"astype: a complex array {describe(d)} does not cast to the real dtype {to} (the array "
                        "API leaves the imaginary part's fate to the caller); cast lf.real(x) or lf.imag(x) instead")
    return node(shared(AsType, to), (d,), d.shape, to, st)


def reshape(x: Any, shape: Any, *, copy: bool | None = None, stream: Any = None) -> Array:
    """Same elements, new shape (row-major order). One dimension may be -1. ``copy`` (the array API's
    keyword) changes nothing: results are values, and a reshape is a view where no one can see it."""
    st = stream_of(stream, "reshape")
    d = operand(x, st, "reshape")
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list, np.ndarray)):
        raise TypeError(f"reshape: shape must be an int or a sequence of ints, got {shape!r}")
    shape = tuple(shape)
    for s in shape:  # (the common case, Python ints, checked without making a message per size)
        if s.__class__ is not int:
            shape = tuple(as_int(s, f"each size in shape {shape}", "reshape") for s in shape)
            break
    key = (d.shape, shape)
    return _laid_out(d, st, _RESHAPED.get(key) or remembered(_RESHAPED, key, lambda: _new_shape(d, shape)))


def _laid_out(d, st, how: tuple) -> Array:
    """``d`` reshaped or permuted as ``how`` says: (the primitive, or None for ``d`` as it is, the shape)."""
    prim, shape = how
    return _same(d, st) if prim is None else node(prim, (d,), shape, d.dtype, st)


#: (shape, requested shape) -> (its Reshape or None for the same shape, the new shape): checked once
_RESHAPED: dict = {}


def _new_shape(d, shape: tuple) -> tuple:
    """``shape`` (ints, at most one -1) as the shape of d's elements (and its Reshape, or None for the
    same shape), or ValueError."""
    n = d.size
    if shape.count(-1) > 1 or any(s < -1 for s in shape):
        raise ValueError(f"reshape: invalid shape {shape}: at most one -1 and no other negative sizes")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or n % known:
            raise ValueError(f"reshape: cannot reshape an array {describe(d)} into {shape}")
        shape = tuple(n // known if s == -1 else s for s in shape)
    if math.prod(shape) != n:
        raise ValueError(f"reshape: cannot reshape an array {describe(d)} of size {n} into shape {shape}")
    return (shared(Reshape, shape) if shape != d.shape else None), shape


def transpose(x: Any, axes: Sequence[int] | None = None, *, stream: Any = None) -> Array:
    """Permute axes (default: reverse them)."""
    st = stream_of(stream, "transpose")
    d = operand(x, st, "transpose")
    nd = len(d.shape)
    if axes is None:
        perm = tuple(range(nd - 1, -1, -1))
    else:
        key = (nd, axes) if axes.__class__ is tuple and all(a.__class__ is int for a in axes) else None
        perm = _PERMS.get(key) or remembered(_PERMS, key, lambda: _permutation(axes, d))
    return _permuted(d, perm, st)


def _permutation(axes, d) -> tuple:
    nd = len(d.shape)
    perm = tuple([normalize_axis(a, nd, "transpose") for a in axes])
    if len(perm) != nd or len(set(perm)) != nd:  # (each in range already)
        raise ValueError(f"transpose: axes {tuple(axes)} are not a permutation of the {nd} axes of {describe(d)}")
    return perm


#: (dimensions, axes of Python ints) -> the permutation they name: checked once
_PERMS: dict = {}


def _permuted(d, perm: tuple, st) -> Array:
    """``d`` with its axes in the order ``perm`` (a permutation, checked)."""
    key = (d.shape, perm)
    return _laid_out(d, st, _PERMUTED.get(key) or remembered(_PERMUTED, key, lambda: _permuted_shape(d, perm)))


def _permuted_shape(d, perm: tuple) -> tuple:
    if perm == tuple(range(len(perm))):
        return None, d.shape
    return shared(Transpose, perm), tuple([d.shape[p] for p in perm])


#: (shape, permutation) -> (its Transpose or None for none, the result shape)
_PERMUTED: dict = {}


def swapaxes(x: Any, axis1: int, axis2: int, *, stream: Any = None) -> Array:
    """Exchange two axes."""
    st = stream_of(stream, "swapaxes")
    d = operand(x, st, "swapaxes")
    nd = len(d.shape)
    a, b = normalize_axis(axis1, nd, "swapaxes"), normalize_axis(axis2, nd, "swapaxes")
    perm = list(range(nd))
    perm[a], perm[b] = perm[b], perm[a]
    return _permuted(d, tuple(perm), st)


def expand_dims(x: Any, axis: Any, *, stream: Any = None) -> Array:
    """Insert size-1 axes at ``axis`` (an int or a tuple, positions in the result)."""
    st = stream_of(stream, "expand_dims")
    d = operand(x, st, "expand_dims")
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    nd = len(d.shape) + len(axes)
    pos = sorted(normalize_axis(a, nd, "expand_dims") for a in axes)
    if len(set(pos)) != len(pos):
        raise ValueError(f"expand_dims: repeated axis in {tuple(axes)}")
    shape = list(d.shape)
    for p in pos:
        shape.insert(p, 1)
    return reshape(Array._wrap(d), tuple(shape), stream=st)


def squeeze(x: Any, axis: Any = None, *, stream: Any = None) -> Array:
    """Remove size-1 axes (all of them, or those named by ``axis``)."""
    st = stream_of(stream, "squeeze")
    d = operand(x, st, "squeeze")
    nd = len(d.shape)
    if axis is None:
        axes = {i for i, s in enumerate(d.shape) if s == 1}
    else:
        axes = {normalize_axis(a, nd, "squeeze") for a in (axis if isinstance(axis, (tuple, list)) else (axis,))}
        bad = [a for a in axes if d.shape[a] != 1]
        if bad:
            raise ValueError(f"squeeze: axis {bad[0]} of {describe(d)} has size {d.shape[bad[0]]}, not 1")
    return reshape(Array._wrap(d), tuple(s for i, s in enumerate(d.shape) if i not in axes), stream=st)


def flatten(x: Any, start_axis: int = 0, end_axis: int = -1, *, stream: Any = None) -> Array:
    """Merge axes start_axis..end_axis into one (default: all, giving a 1-D array)."""
    st = stream_of(stream, "flatten")
    d = operand(x, st, "flatten")
    nd = len(d.shape)
    if nd == 0:
        return reshape(Array._wrap(d), (1,), stream=st)
    s, e = normalize_axis(start_axis, nd, "flatten"), normalize_axis(end_axis, nd, "flatten")
    if s > e:
        raise ValueError(f"flatten: start_axis {start_axis} comes after end_axis {end_axis}")
    shape = d.shape[:s] + (math.prod(d.shape[s:e + 1]),) + d.shape[e + 1:]
    return reshape(Array._wrap(d), shape, stream=st)


def broadcast_to(x: Any, shape: Any, *, stream: Any = None) -> Array:
    """Repeat ``x`` along new or size-1 axes to ``shape`` (numpy broadcasting rules)."""
    st = stream_of(stream, "broadcast_to")
    d = operand(x, st, "broadcast_to")
    shape = check_shape(shape, "broadcast_to")
    try:
        ok = np.broadcast_shapes(d.shape, shape) == shape
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"broadcast_to: cannot broadcast an array {describe(d)} to shape {shape}")
    if shape == d.shape:
        return _same(d, st)
    return node(shared(BroadcastTo, shape), (d,), shape, d.dtype, st)


def concatenate(arrays: Sequence[Any], axis: int | None = 0, *, stream: Any = None) -> Array:
    """Join arrays along an existing axis (``axis=None`` flattens them first). dtypes promote."""
    st = stream_of(stream, "concatenate")
    if isinstance(arrays, Array) or not isinstance(arrays, (list, tuple)) or not arrays:
        raise ValueError("concatenate: expected a non-empty list or tuple of arrays")
    ds = [operand(a, st, "concatenate") for a in arrays]
    if axis is None:
        ds = [flatten(Array._wrap(d), stream=st)._data for d in ds]
        axis = 0
    nd = len(ds[0].shape)
    if nd == 0:
        raise ValueError("concatenate: zero-dimensional arrays cannot be concatenated")
    ax = normalize_axis(axis, nd, "concatenate")
    for d in ds[1:]:
        if len(d.shape) != nd or any(a != b for i, (a, b) in enumerate(zip(d.shape, ds[0].shape)) if i != ax):
            raise ValueError(f"concatenate: shapes {', '.join(str(e.shape) for e in ds)} differ outside axis {ax}")
    try:
        dtype = dt.result_type(*(d.dtype for d in ds))
    except (TypeError, np.exceptions.DTypePromotionError) as e:
        raise TypeError(f"concatenate: no common dtype for {describe(*ds)} ({e})") from None
    shape = list(ds[0].shape)
    shape[ax] = sum(d.shape[ax] for d in ds)
    return node(shared(Concatenate, ax), ds, tuple(shape), dtype, st)


def stack(arrays: Sequence[Any], axis: int = 0, *, stream: Any = None) -> Array:
    """Join same-shaped arrays along a new axis."""
    st = stream_of(stream, "stack")
    if isinstance(arrays, Array) or not isinstance(arrays, (list, tuple)) or not arrays:
        raise ValueError("stack: expected a non-empty list or tuple of arrays")
    ds = [operand(a, st, "stack") for a in arrays]
    if any(d.shape != ds[0].shape for d in ds):
        raise ValueError(f"stack: all arrays must have the same shape, got {', '.join(str(d.shape) for d in ds)}")
    ax = normalize_axis(axis, len(ds[0].shape) + 1, "stack")
    parts = [expand_dims(Array._wrap(d), ax, stream=st) for d in ds]
    return concatenate(parts, ax, stream=st)


def split(x: Any, indices_or_sections: Any, axis: int = 0, *, stream: Any = None) -> list[Array]:
    """Split into equal sections (an int) or at the given indices along ``axis``."""
    st = stream_of(stream, "split")
    d = operand(x, st, "split")
    nd = len(d.shape)
    if nd == 0:
        raise ValueError("split: cannot split a 0-d array")
    ax = normalize_axis(axis, nd, "split")
    n = d.shape[ax]
    if isinstance(indices_or_sections, (int, np.integer)) and not isinstance(indices_or_sections, bool):
        k = int(indices_or_sections)
        if k <= 0 or n % k:
            raise ValueError(f"split: axis {ax} of size {n} does not divide into {k} equal sections")
        bounds = [i * (n // k) for i in range(k + 1)]
    else:
        if not isinstance(indices_or_sections, (list, tuple, np.ndarray)):
            raise TypeError(f"split: expected an int or a sequence of ints, got {indices_or_sections!r}")
        idx = [as_int(i, "each split index", "split") for i in indices_or_sections]
        bounds = [0] + idx + [n]
    pre = (slice(None),) * ax
    parts = []
    for a, b in zip(bounds[:-1], bounds[1:]):  # numpy's x[a:b] along the axis (Python slice rules)
        sl = slice(a, b)
        size = len(range(*sl.indices(n)))
        parts.append(node(GetItem(pre + (sl,)), (d,), d.shape[:ax] + (size,) + d.shape[ax + 1:], d.dtype, st))
    return parts
