"""Slices at positions known only on the device: ``dynamic_slice`` and ``dynamic_update_slice``.

A KV-cache decode step writes the new keys at the current position and reads the cache up to it. When
the position is a 0-d array on the device, the kernel reads it there, so the step needs no host read
and a compiled step replays with a new position and no new capture. Start entries may be Python ints
(static: part of the op) or 0-d integer arrays (read when the command runs).

Out-of-range starts are clamped as JAX clamps them: each start becomes ``min(max(start, 0), dim - size)``,
so the slice always lies inside the array (a start past the end reads or writes the last ``size``
elements; a negative start the first). Nothing raises at run time.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..array import Array
from .core import cast, describe, node, operand, stream_of
from .primitives import DynamicSlice, DynamicUpdateSlice


def _starts(op: str, start: Any, d, st) -> tuple[tuple, list]:
    """(static starts, None where an array gives the start; the 0-d integer start arrays)."""
    if isinstance(start, (Array, np.ndarray)) and np.ndim(start) == 1:
        start = [start[k] for k in range(start.shape[0])]  # a 1-d array of starts: its elements
    if not isinstance(start, (list, tuple)):
        raise TypeError(f"{op}: start must be a sequence of ints or 0-d integer arrays, one per dimension of "
                        f"the array {describe(d)}, got {type(start).__name__}")
    if len(start) != len(d.shape):
        raise ValueError(f"{op}: {len(start)} start indices for an array {describe(d)} of {len(d.shape)} dimensions")
    static: list = []
    arrays: list = []
    for k, s in enumerate(start):
        if isinstance(s, (bool, np.bool_)):
            raise TypeError(f"{op}: start index {k} is a bool; use an int or a 0-d integer array")
        if isinstance(s, (int, np.integer)):
            static.append(int(s))
            continue
        if isinstance(s, np.ndarray) and s.ndim == 0 and s.dtype.kind in "iu":
            static.append(int(s))
            continue
        if isinstance(s, Array):
            a = operand(s, st, op)
            if a.shape != () or not (a.dtype.kind in "iu"):
                raise TypeError(f"{op}: start index {k} must be a 0-d integer array, got {describe(a)}")
            static.append(None)
            arrays.append(a)
            continue
        raise TypeError(f"{op}: start index {k} must be an int or a 0-d integer array, got {type(s).__name__}")
    return tuple(static), arrays


def _clamp(static: tuple, shape: tuple, sizes: tuple) -> tuple:
    return tuple(None if s is None else min(max(s, 0), n - z) for s, n, z in zip(static, shape, sizes))


def dynamic_slice(x: Any, start: Sequence[Any], sizes: Sequence[int], *, stream: Any = None) -> Array:
    """``x[start[0]:start[0] + sizes[0], ...]`` with starts that may be 0-d integer arrays on the device.

    Starts are clamped so that the slice lies inside ``x`` (JAX's rule): ``min(max(start, 0), dim - size)``.
    ``sizes`` are static ints, ``0 <= sizes[k] <= x.shape[k]``.
    """
    st = stream_of(stream, "dynamic_slice")
    d = operand(x, st, "dynamic_slice")
    static, arrays = _starts("dynamic_slice", start, d, st)
    try:
        sizes = tuple(int(z) for z in sizes)
    except TypeError:
        raise TypeError(f"dynamic_slice: sizes must be a sequence of ints, got {sizes!r}") from None
    if len(sizes) != len(d.shape) or any(not 0 <= z <= n for z, n in zip(sizes, d.shape)):
        raise ValueError(f"dynamic_slice: sizes {sizes} do not fit an array {describe(d)} "
                         f"(one size per dimension, each between 0 and the dimension)")
    return node(DynamicSlice(_clamp(static, d.shape, sizes), sizes), (d, *arrays), sizes, d.dtype, st)


def dynamic_update_slice(x: Any, update: Any, start: Sequence[Any], *, stream: Any = None) -> Array:
    """``x`` with ``update`` written at ``start`` (starts may be 0-d integer arrays on the device).

    The result is a new value; ``x`` keeps its own (value semantics). When nothing else can see ``x``
    (a cache rebound each step: ``cache = lf.dynamic_update_slice(cache, kv, (0, 0, pos, 0))``) the
    update is written in place: no copy of ``x``. ``update`` has ``x``'s number of dimensions, each no
    larger than ``x``'s, and is converted to ``x``'s dtype. Starts are clamped as in :func:`dynamic_slice`.
    """
    st = stream_of(stream, "dynamic_update_slice")
    d = operand(x, st, "dynamic_update_slice")
    u = operand(update, st, "dynamic_update_slice")
    if len(u.shape) != len(d.shape) or any(a > b for a, b in zip(u.shape, d.shape)):
        raise ValueError(f"dynamic_update_slice: an update {describe(u)} does not fit an array {describe(d)} "
                         f"(same number of dimensions, each no larger)")
    static, arrays = _starts("dynamic_update_slice", start, d, st)
    u = cast(u, d.dtype, st)
    return node(DynamicUpdateSlice(_clamp(static, d.shape, u.shape)), (d, u, *arrays), d.shape, d.dtype, st)
