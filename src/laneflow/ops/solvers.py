"""``lf.linalg``: cholesky, solve, inv, qr, eigh, svd with batch dimensions (numpy's semantics).

float32 and float64; integer and bool inputs compute in float64 (as numpy); float16/bfloat16 are
refused (numpy and cuSOLVER have no half-precision factorizations). A matrix the method cannot handle
(singular for solve/inv, not positive definite for cholesky) raises :class:`lf.LinAlgError` at the
eval that needs the result, as numpy raises ``LinAlgError``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes as dt
from ..array import Array
from ..graph.node import ArrayData, Primitive, multi_output
from .core import describe, node, operand, stream_of


class Factorization(Primitive):
    """One solver call; ``params`` are keyword options (e.g. full_matrices)."""

    kind = "linalg"

    def __init__(self, name: str, **params: Any):
        super().__init__(name)
        self.params = params


def _float_dtype(name: str, d: ArrayData) -> np.dtype:
    if d.dtype in (dt.float32, dt.float64):
        return d.dtype
    if d.dtype in (dt.float16, dt.bfloat16):
        raise TypeError(f"{name}: {d.dtype} is not supported by linear-algebra routines; "
                        "use .astype(lf.float32) first")
    return dt.float64


def _matrix(name: str, a: Any, st, square: bool) -> ArrayData:
    d = operand(a, st, name)
    if len(d.shape) < 2:
        raise ValueError(f"{name}: expected an array of at least 2 dimensions (..., M, N), got {describe(d)}")
    if square and d.shape[-1] != d.shape[-2]:
        raise ValueError(f"{name}: last two dimensions must be square, got {describe(d)}")
    return d


def _cast(d: ArrayData, to: np.dtype, st) -> ArrayData:
    if d.dtype == to:
        return d
    from .shape import astype

    return astype(Array._wrap(d), to, stream=st)._data


def _multi(prim: Primitive, inputs: tuple, specs: list, st) -> tuple[Array, ...]:
    datas = multi_output([ArrayData(shape, dtype, st, prim, inputs) for shape, dtype in specs])
    return tuple(Array._wrap(d) for d in datas)


def cholesky(a: Any, upper: bool = False, *, stream: Any = None) -> Array:
    """Cholesky factor of symmetric positive-definite matrices: lower ``L`` with ``a = L @ L.T``
    (or upper ``U`` with ``a = U.T @ U`` when ``upper=True``)."""
    st = stream_of(stream, "cholesky")
    d = _matrix("cholesky", a, st, square=True)
    to = _float_dtype("cholesky", d)
    return node(Factorization("cholesky", upper=bool(upper)), (_cast(d, to, st),), d.shape, to, st)


def inv(a: Any, *, stream: Any = None) -> Array:
    """Inverse of square matrices."""
    st = stream_of(stream, "inv")
    d = _matrix("inv", a, st, square=True)
    to = _float_dtype("inv", d)
    return node(Factorization("inv"), (_cast(d, to, st),), d.shape, to, st)


def solve(a: Any, b: Any, *, stream: Any = None) -> Array:
    """Solve ``a @ x = b``. ``b`` of shape (..., M) (only when 1-D, as numpy 2) or (..., M, K)."""
    st = stream_of(stream, "solve")
    da = _matrix("solve", a, st, square=True)
    db = operand(b, st, "solve")
    m = da.shape[-1]
    if len(db.shape) == 1:
        if db.shape[0] != m:
            raise ValueError(f"solve: b must have {m} rows to match a, got {describe(da, db)}")
        shape = da.shape[:-1]
    else:
        if db.shape[-2] != m:
            raise ValueError(f"solve: b must have {m} rows to match a, got {describe(da, db)}")
        try:
            batch = np.broadcast_shapes(da.shape[:-2], db.shape[:-2])
        except ValueError:
            raise ValueError(f"solve: batch dimensions of {describe(da, db)} cannot be broadcast") from None
        shape = batch + db.shape[-2:]
    to = dt.result_type(_float_dtype("solve", da), _float_dtype("solve", db))
    return node(Factorization("solve"), (_cast(da, to, st), _cast(db, to, st)), shape, to, st)


def qr(a: Any, *, stream: Any = None) -> tuple[Array, Array]:
    """Reduced QR decomposition: ``q`` (..., M, K), ``r`` (..., K, N) with K = min(M, N)."""
    st = stream_of(stream, "qr")
    d = _matrix("qr", a, st, square=False)
    to = _float_dtype("qr", d)
    *batch, m, n = d.shape
    k = min(m, n)
    batch = tuple(batch)
    return _multi(Factorization("qr"), (_cast(d, to, st),), [(batch + (m, k), to), (batch + (k, n), to)], st)


def eigh(a: Any, UPLO: str = "L", *, stream: Any = None) -> tuple[Array, Array]:  # noqa: N803 - numpy's name
    """Eigenvalues (ascending) and eigenvectors of symmetric matrices, from the ``UPLO`` triangle."""
    st = stream_of(stream, "eigh")
    if UPLO not in ("L", "U"):
        raise ValueError(f"eigh: UPLO must be 'L' or 'U', got {UPLO!r}")
    d = _matrix("eigh", a, st, square=True)
    to = _float_dtype("eigh", d)
    return _multi(Factorization("eigh", UPLO=UPLO), (_cast(d, to, st),), [(d.shape[:-1], to), (d.shape, to)], st)


def svd(a: Any, full_matrices: bool = True, compute_uv: bool = True, *, stream: Any = None):
    """Singular value decomposition ``a = u @ diag(s) @ vh`` (numpy's argument names and shapes)."""
    st = stream_of(stream, "svd")
    d = _matrix("svd", a, st, square=False)
    to = _float_dtype("svd", d)
    *batch, m, n = d.shape
    batch = tuple(batch)
    k = min(m, n)
    src = (_cast(d, to, st),)
    if not compute_uv:
        return node(Factorization("svd", full_matrices=bool(full_matrices), compute_uv=False), src,
                    batch + (k,), to, st)
    um, vn = (m, n) if full_matrices else (k, k)
    specs = [(batch + (m, um), to), (batch + (k,), to), (batch + (vn, n), to)]
    return _multi(Factorization("svd", full_matrices=bool(full_matrices), compute_uv=True), src, specs, st)
