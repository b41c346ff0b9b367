"""Indexing: basic (ints, slices, None, Ellipsis) and integer-array indexing, slice assignment, take.

A boolean *numpy* mask is known on the host and becomes integer indices; a boolean laneflow array
has a data-dependent shape: it is read on the host eagerly and refused inside ``lf.compile``
(``ops/datadep.py``; use ``lf.where``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes as dt
from ..array import Array
from ..graph.node import ArrayData
from .datadep import host_value
from .core import cast, constant, describe, node, normalize_axis, operand, remembered, shared, stream_of
from .primitives import GetItem, Reshape, SetItem, Take


def _dummy(shape: tuple, dtype=np.int8) -> np.ndarray:
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape=shape, strides=(0,) * len(shape))


def _normalize(op: str, index: Any, d, st) -> tuple[tuple, list]:
    """Index entries for the primitive, and the integer index arrays (inputs).

    Index arrays given as host data (lists, numpy arrays, numpy boolean masks) are known now, so
    they are checked against the array's shape now, as numpy does; laneflow index arrays are
    checked when the op runs.
    """
    if not isinstance(index, tuple):
        index = (index,)
    arrays: list = []
    entries: list = []
    hosts: dict[int, np.ndarray] = {}  # array number -> host integer indices
    masks: dict[int, np.ndarray] = {}  # array number of a mask's first dimension -> the mask
    for e in index:
        if e.__class__ is Array and e.dtype == dt.bool_ and e.ndim:  # a data-dependent shape: eager only
            e = host_value(e, op, "the shape of a boolean-mask index")
        if e is None or e is Ellipsis or isinstance(e, slice):
            entries.append(e)
        elif isinstance(e, bool) or isinstance(e, np.bool_):
            raise TypeError(f"{op}: a boolean scalar index is not supported")
        elif isinstance(e, (int, np.integer)):
            entries.append(int(e))
        elif isinstance(e, Array) or isinstance(e, (list, np.ndarray)):
            if isinstance(e, Array):
                a = operand(e, st, op)
            else:
                host = np.asarray(e)
                if host.dtype == np.bool_ and not host.ndim:
                    raise TypeError(f"{op}: a boolean scalar index is not supported")
                if host.dtype == np.bool_:
                    # A host mask is static: turn it into integer index arrays now.
                    masks[len(arrays)] = host
                    for nz in np.nonzero(host):
                        arrays.append(constant(nz.astype(np.int64), st, op=op))
                        entries.append(("array", len(arrays) - 1))
                    continue
                if host.size == 0:
                    host = host.astype(np.int64)
                if host.dtype.kind in "iu":
                    hosts[len(arrays)] = host
                a = constant(host, st, op=op) if host.dtype.kind in "iu" else None
            if a is None or (not dt.is_integer(a.dtype) and a.dtype != dt.bool_):
                raise IndexError(f"{op}: index arrays must have an integer dtype, got {np.asarray(e).dtype}")
            if a.dtype == dt.bool_:
                raise TypeError(f"{op}: boolean mask indexing with an lf.Array has a data-dependent shape; "
                                "use lf.where(mask, x, other) or integer index arrays")
            arrays.append(a)
            entries.append(("array", len(arrays) - 1))
        else:
            raise IndexError(f"{op}: unsupported index {e!r} of type {type(e).__name__}; "
                             "use ints, slices, None, ..., or integer arrays")
    if entries.count(Ellipsis) > 1:
        raise IndexError(f"{op}: an index can only have a single ellipsis ('...')")
    used = sum(1 for e in entries if e is not None and e is not Ellipsis)
    nd = len(d.shape)
    if used > nd:
        raise IndexError(f"{op}: too many indices for an array {describe(d)}: {used} were given")
    if Ellipsis in entries:
        k = entries.index(Ellipsis)
        entries[k:k + 1] = [slice(None)] * (nd - used)
    _check_host_indices(op, entries, hosts, masks, d)
    return tuple(entries), arrays


def _check_host_indices(op: str, entries: list, hosts: dict, masks: dict, d) -> None:
    dim = 0
    for e in entries:
        if e is None:
            continue
        if isinstance(e, tuple):
            n = d.shape[dim]
            mask = masks.get(e[1])
            if mask is not None and mask.shape != d.shape[dim:dim + mask.ndim]:
                raise IndexError(f"{op}: boolean index of shape {mask.shape} does not match the array "
                                 f"{describe(d)} at axis {dim}")
            host = hosts.get(e[1])
            if host is not None and host.size and not (-n <= host.min() and host.max() < n):
                bad = host.max() if host.max() >= n else host.min()
                raise IndexError(f"{op}: index {bad} is out of bounds for axis {dim} with size {n} "
                                 f"(array {describe(d)})")
        dim += 1


def _indexed_shape(op: str, d, entries: tuple, arrays: list) -> tuple:
    if not arrays:  # ints, slices and None: pure Python (no numpy probe per op)
        out = []
        dim = 0
        shape = d.shape
        for e in entries:
            if e is None:
                out.append(1)
                continue
            n = shape[dim]
            if e.__class__ is slice:
                out.append(len(range(*e.indices(n))))
            elif not -n <= e < n:
                raise IndexError(f"{op}: index {e} is out of bounds for axis {dim} with size {n} (array {describe(d)})")
            dim += 1
        return tuple(out) + shape[dim:]
    probe = tuple(_dummy(arrays[e[1]].shape, np.intp) if isinstance(e, tuple) else e for e in entries)
    try:
        return _dummy(d.shape)[probe].shape
    except IndexError as e:
        raise IndexError(f"{op}: {e} (array {describe(d)})") from None
    except ValueError as e:
        raise IndexError(f"{op}: index arrays cannot be broadcast together ({e})") from None


def _bool_scalar(index: Any) -> bool | None:
    """The truth value of a boolean scalar index (a Python, numpy or 0-d laneflow bool), else None."""
    if isinstance(index, (bool, np.bool_)):
        return bool(index)
    if index.__class__ is Array and index.dtype == dt.bool_ and not index.ndim:
        return bool(host_value(index, "getitem", "the shape of a boolean-scalar index"))
    return None


def getitem(x: Any, index: Any, *, stream: Any = None) -> Array:
    """``x[index]`` as a new value (a copy; laneflow arrays are values, not numpy views)."""
    st = stream_of(stream, "getitem")
    d = operand(x, st, "getitem")
    key = _basic_key(index)
    if key is not None:  # ints, slices of ints, None, Ellipsis: what this index of this shape gives, made once
        key = (key, d.shape)
        shape, prim = _BASIC.get(key) or remembered(_BASIC, key, lambda: _basic_index(index, d, st))
        if prim is None and shape == d.shape:
            return Array._wrap(d)
        return node(prim, (d,), shape, d.dtype, st)
    flag = _bool_scalar(index)
    if flag is not None:  # x[True] is x with a new leading axis; x[False] the same, emptied (numpy's rule)
        wide = node(Reshape((1,) + d.shape), (d,), (1,) + d.shape, d.dtype, st)
        return getitem(wide, slice(0, int(flag)), stream=st)
    entries, arrays = _normalize("getitem", index, d, st)
    shape = _indexed_shape("getitem", d, entries, arrays)
    if not arrays and _whole(entries) and shape == d.shape:
        return Array._wrap(d)
    return node(GetItem(entries), (d, *arrays), shape, d.dtype, st)


def _basic_index(index: Any, d, st) -> tuple:
    entries, _ = _normalize("getitem", index, d, st)
    return _indexed_shape("getitem", d, entries, []), None if _whole(entries) else GetItem(entries)


def _whole(entries: tuple) -> bool:
    return all(isinstance(e, slice) and e.start is None and e.stop is None and e.step is None for e in entries)


#: (basic index key, shape) -> (result shape, the GetItem, or None where the index is every slice whole):
#: a forward's slices are one primitive each, whose key the plan cache reads once
_BASIC: dict = {}


def _basic_key(index: Any) -> tuple | None:
    """A hashable stand-in for a basic index of Python ints, slices of them, None and Ellipsis (slices
    do not hash); None for any other index."""
    if index.__class__ is not tuple:
        index = (index,)
    key = []
    for e in index:
        c = e.__class__
        if c is slice:
            a, b, k = e.start, e.stop, e.step
            if not ((a is None or a.__class__ is int) and (b is None or b.__class__ is int)
                    and (k is None or k.__class__ is int)):
                return None
            key.append((a, b, k))
        elif c is int or e is None or e is Ellipsis:
            key.append(e)
        else:
            return None
    return tuple(key)


def setitem(x: Any, index: Any, value: Any, *, stream: Any = None) -> Array:
    """The value of ``x`` after ``x[index] = value``, as a new array (``x`` itself is not changed).

    ``Array.__setitem__`` rebinds the array to this value. When nothing else can see the old value,
    the update is written in place (a real write that the encoder orders after earlier readers).
    With repeated integer indices the last write wins on the CPU; on the GPU the winner is unspecified.
    """
    st = stream_of(stream, "setitem")
    d = operand(x, st, "setitem")
    flag = _bool_scalar(index)
    if flag is not None:  # x[True] = v sets every element to v (broadcast to (1,) + x.shape); x[False]: none
        if not flag:
            return Array._wrap(d)
        v = getitem(value, 0, stream=st) if isinstance(value, Array) and value.ndim > len(d.shape) else value
        return setitem(Array._wrap(d), Ellipsis, v, stream=st)
    entries, arrays = _normalize("setitem", index, d, st)
    target = _indexed_shape("setitem", d, entries, arrays)
    if isinstance(value, Array):
        v = operand(value, st, "setitem")
        v = cast(v, d.dtype, st)
    else:
        try:
            host = np.asarray(value)
            if not (host.dtype.kind in "biuf" or host.dtype == dt.bfloat16 or  # strings, objects
                    (host.dtype.kind == "c" and dt.is_complex(d.dtype))):  # complex into a real array
                raise TypeError(f"unsupported element type {host.dtype}")
            with np.errstate(all="ignore"):
                host = np.array(value, dtype=d.dtype) if np.ndim(value) == 0 else host.astype(d.dtype)
        except (TypeError, ValueError, OverflowError) as e:
            raise type(e)(f"setitem: cannot store {value!r} into an array {describe(d)}: {e}") from None
        v = constant(host, st, d.dtype, op="setitem")
    vshape = v.shape
    while len(vshape) > len(target) and vshape[0] == 1:
        vshape = vshape[1:]
    try:
        ok = np.broadcast_shapes(vshape, target) == target
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"setitem: cannot broadcast a value of shape {v.shape} into the indexed shape {target} "
                         f"of an array {describe(d)}")
    if vshape != v.shape:  # leading size-1 dims dropped: the same elements
        v = ArrayData(vshape, v.dtype, st, shared(Reshape, vshape), (v,))
    return node(SetItem(entries), (d, v, *arrays), d.shape, d.dtype, st)


def take(a: Any, indices: Any, axis: int | None = None, *, stream: Any = None) -> Array:
    """Elements of ``a`` at integer ``indices`` along ``axis`` (None: of the flattened array).

    Negative indices count from the end. Out-of-range host indices (lists, numpy arrays) raise
    IndexError here; out-of-range laneflow indices raise lf.ExecutionError at the eval that runs it.
    """
    st = stream_of(stream, "take")
    d = operand(a, st, "take")
    host = None
    if isinstance(indices, Array):
        i = operand(indices, st, "take")
    else:
        host = np.asarray(indices)
        if host.size == 0:
            host = host.astype(np.int64)
        if host.dtype.kind not in "iu":
            raise IndexError(f"take: indices must have an integer dtype, got {host.dtype}")
        i = constant(host, st, op="take")
    if not dt.is_integer(i.dtype):
        raise IndexError(f"take: indices must have an integer dtype, got {i.dtype}")
    if axis is None:
        n, shape, ax = d.size, i.shape, None
    else:
        ax = normalize_axis(axis, len(d.shape), "take")
        n, shape = d.shape[ax], d.shape[:ax] + i.shape + d.shape[ax + 1:]
    if host is not None and host.size and not (-n <= host.min() and host.max() < n):
        bad = host.max() if host.max() >= n else host.min()
        where = "the flattened array" if ax is None else f"axis {ax}"
        raise IndexError(f"take: index {bad} is out of bounds for {where} of size {n} (array {describe(d)})")
    if n == 0 and i.size:
        raise IndexError(f"take: cannot take from {'an empty array' if ax is None else f'empty axis {ax}'} "
                         f"of {describe(d)}")
    return node(shared(Take, ax), (d, i), shape, d.dtype, st)
