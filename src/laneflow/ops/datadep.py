"""Ops whose result shape depends on the values (``nonzero``, ``unique_*``, boolean-mask indexing,
``repeat`` with an array of counts): run eagerly, the values read on the host, as JAX does outside
``jit``. On a GPU that is a round trip through the host (the input is copied back, the small result
copied up again). Inside ``lf.compile`` no value is known while tracing, so they raise
:class:`~laneflow.errors.CompileError` naming the op, as JAX raises ``ConcretizationTypeError``.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import numpy as np

from ..array import Array
from ..errors import CompileError
from ..graph import tracer
from .core import constant, operand, stream_of


def host_value(x: Any, op: str, what: str = "its result's shape") -> np.ndarray:
    """The values of ``x`` on the host, for an op whose ``what`` depends on them; CompileError inside lf.compile."""
    if tracer.ACTIVE[0] and tracer.tracing():
        raise CompileError(f"{op}: {what} depends on the values of the input, which are unknown while lf.compile "
                           "traces; call it outside the compiled function, or use a fixed-shape form "
                           "(lf.where(mask, x, other) instead of x[mask], for instance)")
    return np.asarray(x)


def _result(host: np.ndarray, like: Any, st) -> Array:
    return Array._wrap(constant(np.array(host, order="C"), st, op="array"))


def nonzero(x: Any, /, *, stream: Any = None) -> tuple[Array, ...]:
    """The indices of the nonzero elements, one int64 array per axis (data-dependent: eager only;
    on a GPU through the host). 0-d inputs are refused, as the array API standard says."""
    st = stream_of(stream if stream is not None or not isinstance(x, Array) else x.device, "nonzero")
    d = operand(x, st, "nonzero")
    if not d.shape:
        raise ValueError("nonzero: a 0-d array has no axes to index; use lf.reshape(x, (1,)) first")
    host = host_value(Array._wrap(d), "nonzero")
    return tuple(_result(i.astype(np.int64), x, st) for i in np.nonzero(host))


UniqueAllResult = namedtuple("UniqueAllResult", ["values", "indices", "inverse_indices", "counts"])
UniqueCountsResult = namedtuple("UniqueCountsResult", ["values", "counts"])
UniqueInverseResult = namedtuple("UniqueInverseResult", ["values", "inverse_indices"])


def _unique(op: str, x: Any, stream: Any) -> tuple:
    st = stream_of(stream if stream is not None or not isinstance(x, Array) else x.device, op)
    d = operand(x, st, op)
    host = host_value(Array._wrap(d), op).reshape(-1)
    # every NaN is its own value (the standard's rule): numpy's equal_nan=False
    values, index, inverse, counts = np.unique(host, return_index=True, return_inverse=True, return_counts=True,
                                               equal_nan=False)
    wrap = lambda a: _result(a, x, st)  # noqa: E731
    return (wrap(values), wrap(index.astype(np.int64)), wrap(inverse.reshape(d.shape).astype(np.int64)),
            wrap(counts.astype(np.int64)))


def unique_all(x: Any, /, *, stream: Any = None) -> UniqueAllResult:
    """Sorted unique values, the first index of each, the inverse (shape of ``x``) and the counts.
    NaNs are all distinct. Data-dependent: eager only, on a GPU through the host."""
    return UniqueAllResult(*_unique("unique_all", x, stream))


def unique_counts(x: Any, /, *, stream: Any = None) -> UniqueCountsResult:
    """Sorted unique values and how often each occurs (see :func:`unique_all`)."""
    v, _, _, c = _unique("unique_counts", x, stream)
    return UniqueCountsResult(v, c)


def unique_inverse(x: Any, /, *, stream: Any = None) -> UniqueInverseResult:
    """Sorted unique values and, per element of ``x``, the index of its value (see :func:`unique_all`)."""
    v, _, inv, _ = _unique("unique_inverse", x, stream)
    return UniqueInverseResult(v, inv)


def unique_values(x: Any, /, *, stream: Any = None) -> Array:
    """Sorted unique values (see :func:`unique_all`)."""
    return _unique("unique_values", x, stream)[0]
