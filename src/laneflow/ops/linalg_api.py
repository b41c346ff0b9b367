"""The array API's ``linalg`` extension beyond the factorizations of ``ops/linalg.py``: named-tuple
results, determinants (one ``slogdet`` primitive: LU on every backend), norms, and the products and
helpers, built from existing ops (matmul, reductions, ``svd``, ``eigh``)."""

from __future__ import annotations

import math
from collections import namedtuple
from typing import Any

import numpy as np

from .. import dtypes as dt
from ..array import Array
from ..graph.node import Primitive
from . import linalg as _fact
from .core import as_int, describe, normalize_axes, normalize_axis, operand, outputs, stream_of
from .elementwise import GENERATED as _ew
from .elementwise import conj as _ew_conj
from .elementwise import power, where
from .index import getitem
from .manipulation import matrix_transpose
from .matmul import matmul
from .reduce import max as _max
from .reduce import min as _min
from .reduce import sum as _sum
from .shape import astype, expand_dims, reshape, stack, transpose

EighResult = namedtuple("EighResult", ["eigenvalues", "eigenvectors"])
QRResult = namedtuple("QRResult", ["Q", "R"])
SlogdetResult = namedtuple("SlogdetResult", ["sign", "logabsdet"])
SVDResult = namedtuple("SVDResult", ["U", "S", "Vh"])


class Slogdet(Primitive):
    """Sign, log |det| and det of square matrices; a fourth output is the kernel's workspace."""

    kind = "slogdet"

    def __init__(self) -> None:
        super().__init__("slogdet")


def _slogdet(op: str, x: Any, stream: Any) -> tuple:
    st = stream_of(stream, op)
    d = _fact._matrix(op, x, st, square=True)
    to = _fact._float_dtype(op, d)
    batch = d.shape[:-2]
    real = dt.real_dtype(to)  # log |det| is real; the sign of a complex determinant is det / |det|
    return outputs(Slogdet(), (_fact._cast(d, to, st),), [(batch, to), (batch, real), (batch, to), (d.shape, to)], st)


def slogdet(x: Any, /, *, stream: Any = None) -> SlogdetResult:
    """Sign and natural log of the absolute determinant of square matrices (sign 0, logabsdet -inf
    for a singular one); LU with partial pivoting."""
    sign, logabs, _, _ = _slogdet("slogdet", x, stream)
    return SlogdetResult(sign, logabs)


def det(x: Any, /, *, stream: Any = None) -> Array:
    """Determinant of square matrices (the product of the LU pivots, with the sign of the row swaps)."""
    return _slogdet("det", x, stream)[2]


def qr(x: Any, /, *, mode: str = "reduced", stream: Any = None) -> QRResult:
    """QR decomposition as ``(Q, R)``. ``mode`` "reduced" (Q: (..., M, K), R: (..., K, N), K = min(M, N))
    or "complete" (Q: (..., M, M), R: (..., M, N))."""
    q, r = _fact.qr(x, mode=mode, stream=stream)
    return QRResult(q, r)


def eigh(x: Any, /, UPLO: str = "L", stream: Any = None) -> EighResult:  # noqa: N803 - numpy's name
    """Eigenvalues (ascending) and eigenvectors of symmetric matrices, as ``(eigenvalues, eigenvectors)``."""
    return EighResult(*_fact.eigh(x, UPLO, stream=stream))


def eigvalsh(x: Any, /, *, UPLO: str = "L", stream: Any = None) -> Array:  # noqa: N803
    """Eigenvalues (ascending) of symmetric matrices."""
    return _fact.eigh(x, UPLO, stream=stream)[0]


def svd(x: Any, /, full_matrices: bool = True, compute_uv: bool = True, *, stream: Any = None) -> Any:
    """Singular value decomposition as ``(U, S, Vh)`` with ``x = U @ diag(S) @ Vh``; numpy's
    ``compute_uv=False`` gives the singular values alone (as :func:`svdvals`)."""
    if not compute_uv:
        return svdvals(x, stream=stream)
    return SVDResult(*_fact.svd(x, full_matrices=full_matrices, stream=stream))


def svdvals(x: Any, /, *, stream: Any = None) -> Array:
    """Singular values, in descending order."""
    return _fact.svd(x, compute_uv=False, stream=stream)


def cholesky(x: Any, /, upper: bool = False, stream: Any = None) -> Array:
    """Cholesky factor of symmetric positive-definite matrices (lower, or upper with ``upper=True``)."""
    return _fact.cholesky(x, upper, stream=stream)


def _float(x: Any, op: str, st) -> Array:
    d = operand(x, st, op)
    return Array._wrap(_fact._cast(d, _fact._float_dtype(op, d), st))


def diagonal(x: Any, /, *, offset: int = 0, stream: Any = None) -> Array:
    """The diagonal ``offset`` (> 0: above the main one) of the last two axes."""
    st = stream_of(stream, "diagonal")
    a = Array._wrap(operand(x, st, "diagonal"))
    if a.ndim < 2:
        raise ValueError(f"diagonal: needs an array of at least 2 dimensions, got shape {a.shape}")
    n, m = a.shape[-2:]
    k = as_int(offset, "offset", "diagonal")
    rows = np.arange(max(0, -k), min(n, m - k) if m - k > 0 else 0, dtype=np.int64)
    return getitem(a, (Ellipsis, rows, rows + k), stream=st)


def trace(x: Any, /, *, offset: int = 0, dtype: Any = None, stream: Any = None) -> Array:
    """Sum of the diagonal ``offset`` of the last two axes (in ``dtype`` when given, as :func:`lf.sum`)."""
    return _sum(diagonal(x, offset=offset, stream=stream), -1, dtype=dtype, stream=stream)


def outer(x1: Any, x2: Any, /, *, stream: Any = None) -> Array:
    """Outer product of two 1-d arrays."""
    st = stream_of(stream, "outer")
    a, b = operand(x1, st, "outer"), operand(x2, st, "outer")
    if len(a.shape) != 1 or len(b.shape) != 1:
        raise ValueError(f"outer: needs two 1-d arrays, got {describe(a, b)}")
    return _ew["multiply"](reshape(Array._wrap(a), (-1, 1), stream=st), Array._wrap(b), stream=st)


def vecdot(x1: Any, x2: Any, /, *, axis: int = -1, stream: Any = None) -> Array:
    """Dot product of vectors along ``axis`` (broadcast over the other axes); a complex ``x1`` is
    conjugated first, as the array API says (``sum(conj(x1) * x2)``)."""
    st = stream_of(stream, "vecdot")
    a, b = Array._wrap(operand(x1, st, "vecdot")), Array._wrap(operand(x2, st, "vecdot"))
    nd = max(a.ndim, b.ndim)
    if min(a.ndim, b.ndim) == 0:
        raise ValueError(f"vecdot: needs arrays of at least 1 dimension, got {describe(a._data, b._data)}")
    ax = normalize_axis(axis, nd, "vecdot") - nd
    if -ax > min(a.ndim, b.ndim) or a.shape[ax] != b.shape[ax]:
        raise ValueError(f"vecdot: axis {axis} differs in size: {describe(a._data, b._data)}")
    return _sum(_ew["multiply"](_ew_conj(a, stream=st), b, stream=st), ax, dtype=dt.result_type(a, b), stream=st)


def tensordot(x1: Any, x2: Any, /, *, axes: Any = 2, stream: Any = None) -> Array:
    """Sum of products over ``axes`` (an int: the last ``axes`` of x1 with the first of x2; or two
    sequences of axes), as one matmul of the reshaped operands."""
    st = stream_of(stream, "tensordot")
    a, b = Array._wrap(operand(x1, st, "tensordot")), Array._wrap(operand(x2, st, "tensordot"))
    if isinstance(axes, (int, np.integer)):
        k = as_int(axes, "axes", "tensordot")
        if k < 0 or k > min(a.ndim, b.ndim):
            raise ValueError(f"tensordot: axes={k} does not fit shapes {a.shape} and {b.shape}")
        ax_a, ax_b = list(range(a.ndim - k, a.ndim)), list(range(k))
    else:
        ax_a = [normalize_axis(i, a.ndim, "tensordot") for i in axes[0]]
        ax_b = [normalize_axis(i, b.ndim, "tensordot") for i in axes[1]]
    if len(ax_a) != len(ax_b) or any(a.shape[i] != b.shape[j] for i, j in zip(ax_a, ax_b)):
        raise ValueError(f"tensordot: contracted axes {ax_a} of {a.shape} and {ax_b} of {b.shape} differ in size")
    free_a = [i for i in range(a.ndim) if i not in ax_a]
    free_b = [j for j in range(b.ndim) if j not in ax_b]
    k = math.prod(a.shape[i] for i in ax_a)
    res = dt.result_type(a, b)
    shape = tuple(a.shape[i] for i in free_a) + tuple(b.shape[j] for j in free_b)
    m, n = math.prod(shape[:len(free_a)]), math.prod(shape[len(free_a):])
    am = reshape(transpose(a, tuple(free_a + ax_a), stream=st), (m, k), stream=st).astype(res)
    bm = reshape(transpose(b, tuple(ax_b + free_b), stream=st), (k, n), stream=st).astype(res)
    if k == 0:
        from .creation import zeros

        return zeros(shape, res, stream=st)
    return reshape(matmul(am, bm, stream=st), shape, stream=st)


def cross(x1: Any, x2: Any, /, *, axis: int = -1, stream: Any = None) -> Array:
    """Cross product of 3-element vectors along ``axis`` (broadcast over the other axes)."""
    st = stream_of(stream, "cross")
    a, b = Array._wrap(operand(x1, st, "cross")), Array._wrap(operand(x2, st, "cross"))
    nd = max(a.ndim, b.ndim)
    ax = normalize_axis(axis, nd, "cross") - nd
    if a.ndim < -ax or b.ndim < -ax or a.shape[ax] != 3 or b.shape[ax] != 3:
        raise ValueError(f"cross: axis {axis} must have size 3 in both, got {describe(a._data, b._data)}")
    pick = lambda v, i: getitem(v, (Ellipsis, i) + (slice(None),) * (-ax - 1), stream=st)  # noqa: E731
    mul, sub = _ew["multiply"], _ew["subtract"]
    c = [sub(mul(pick(a, i), pick(b, j), stream=st), mul(pick(a, j), pick(b, i), stream=st), stream=st)
         for i, j in ((1, 2), (2, 0), (0, 1))]
    return stack(c, axis=ax, stream=st)


def matrix_power(x: Any, n: int, /, *, stream: Any = None) -> Array:
    """``x`` multiplied by itself ``n`` times (n = 0: identity; n < 0: powers of the inverse)."""
    st = stream_of(stream, "matrix_power")
    a = Array._wrap(_fact._matrix("matrix_power", x, st, square=True))
    n = as_int(n, "n", "matrix_power")
    if n < 0:
        a, n = _fact.inv(a, stream=st), -n
    if n == 0:
        from .creation import eye

        from .shape import broadcast_to

        return broadcast_to(eye(a.shape[-1], dtype=a.dtype, stream=st), a.shape, stream=st)
    result = None
    while n:
        if n & 1:
            result = a if result is None else matmul(result, a, stream=st)
        n >>= 1
        if n:
            a = matmul(a, a, stream=st)
    return result


def pinv(x: Any, /, *, rtol: Any = None, stream: Any = None) -> Array:
    """Moore-Penrose pseudo-inverse through the SVD; singular values at or below ``rtol`` times the
    largest are treated as zero (default ``max(M, N) * eps``)."""
    st = stream_of(stream, "pinv")
    a = _float(x, "pinv", st)
    if a.ndim < 2:
        raise ValueError(f"pinv: needs an array of at least 2 dimensions, got shape {a.shape}")
    u, s, vh = _fact.svd(a, full_matrices=False, stream=st)
    tol = _tol(s, a, rtol, st)
    inv_s = where(_ew["greater"](s, tol, stream=st), _ew["divide"](1.0, s, stream=st), 0.0, stream=st)
    return matmul(_ew_conj(matrix_transpose(vh)) * expand_dims(inv_s, -2, stream=st),
                  _ew_conj(matrix_transpose(u)), stream=st)


def _tol(s: Array, a: Array, rtol: Any, st) -> Any:
    if rtol is None:
        rtol = max(a.shape[-2:]) * dt.finfo_eps(dt.real_dtype(a.dtype))
    largest = _max(s, -1, True, stream=st) if s.shape[-1] else 0.0
    return _ew["multiply"](largest, rtol if not isinstance(rtol, Array) else expand_dims(rtol, -1, stream=st),
                           stream=st)


def matrix_rank(x: Any, /, *, rtol: Any = None, stream: Any = None) -> Array:
    """Number of singular values above ``rtol`` times the largest (default ``max(M, N) * eps``)."""
    st = stream_of(stream, "matrix_rank")
    a = _float(x, "matrix_rank", st)
    if a.ndim < 2:
        raise ValueError(f"matrix_rank: needs an array of at least 2 dimensions, got shape {a.shape}")
    s = svdvals(a, stream=st)
    return _sum(_ew["greater"](s, _tol(s, a, rtol, st), stream=st), -1, stream=st)


def vector_norm(x: Any, /, *, axis: Any = None, keepdims: bool = False, ord: Any = 2,  # noqa: A002
                stream: Any = None) -> Array:
    """The ``ord``-norm of vectors along ``axis`` (None: all elements as one vector): 2 by default,
    any real p, ``inf`` (largest absolute value), ``-inf`` (smallest) and 0 (count of nonzeros)."""
    st = stream_of(stream, "vector_norm")
    a = Array._wrap(operand(x, st, "vector_norm"))
    if not dt.is_floating(a.dtype) and not dt.is_complex(a.dtype):
        a = astype(a, dt.float64, stream=st)
    axes = normalize_axes(axis, a.ndim, "vector_norm")
    m = _ew["abs"](a, stream=st)  # real, also for complex a
    if ord == math.inf:
        return _max(m, axes, keepdims, stream=st) if a.size else _sum(m, axes, keepdims, stream=st)
    if ord == -math.inf:
        return _min(m, axes, keepdims, stream=st)
    if ord == 0:
        return astype(_sum(_ew["not_equal"](m, 0, stream=st), axes, keepdims, stream=st), m.dtype, stream=st)
    if ord == 1:
        return _sum(m, axes, keepdims, stream=st)
    if ord == 2:
        return _ew["sqrt"](_sum(_ew["square"](m, stream=st), axes, keepdims, stream=st), stream=st)
    p = float(ord)
    return power(_sum(power(m, p, stream=st), axes, keepdims, stream=st), 1.0 / p, stream=st)


def matrix_norm(x: Any, /, *, keepdims: bool = False, ord: Any = "fro", stream: Any = None) -> Array:  # noqa: A002
    """Norm of the matrices in the last two axes: "fro" (default), "nuc", 1, -1, 2, -2, inf, -inf."""
    st = stream_of(stream, "matrix_norm")
    a = _float(x, "matrix_norm", st)
    if a.ndim < 2:
        raise ValueError(f"matrix_norm: needs an array of at least 2 dimensions, got shape {a.shape}")
    if ord == "fro":
        return vector_norm(a, axis=(-2, -1), keepdims=keepdims, stream=st)
    if ord in ("nuc", 2, -2):
        s = svdvals(a, stream=st)
        r = _sum(s, -1, stream=st) if ord == "nuc" else (_max if ord == 2 else _min)(s, -1, stream=st)
        return reshape(r, r.shape + (1, 1), stream=st) if keepdims else r
    if ord in (1, -1, math.inf, -math.inf):
        sums = _sum(_ew["abs"](a, stream=st), -2 if ord in (1, -1) else -1, True, stream=st)
        pick = _max if ord in (1, math.inf) else _min
        return pick(sums, (-2, -1), keepdims, stream=st)
    raise ValueError(f"matrix_norm: ord must be 'fro', 'nuc', 1, -1, 2, -2, inf or -inf, got {ord!r}")


__all__ = ["cholesky", "cross", "det", "diagonal", "eigh", "eigvalsh", "matrix_norm", "matrix_power", "matrix_rank",
           "outer", "pinv", "qr", "slogdet", "svd", "svdvals", "tensordot", "trace", "vecdot", "vector_norm",
           "EighResult", "QRResult", "SlogdetResult", "SVDResult"]
