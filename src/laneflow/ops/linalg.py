"""``lf.linalg``: cholesky, solve, inv, qr, eigh, svd with batch dimensions (numpy's semantics).

float32, float64, complex64 and complex128 (Hermitian where the real routine wants symmetric; the
eigenvalues and singular values of complex matrices are real); integer and bool inputs compute in
float64 (as numpy); float16/bfloat16 are
refused (numpy and cuSOLVER have no half-precision factorizations). A matrix the method cannot handle
(singular for solve/inv, not positive definite for cholesky) raises :class:`lf.LinAlgError` at the
eval that needs the result, as numpy raises ``LinAlgError``.

A batch the backend runs as one batched library call (``Backend.runs_linalg_batched``: small matrices
on the GPU, ``backends/cuda/linalg_batched.py``) stays one command. Otherwise, on a stream with several
lanes, a batch (leading dimension of at least 2) is split into one command per lane (at most one chunk per lane, along the first batch axis) whose results are concatenated.
Each matrix is factored by the same routine either way, so the values are the same as unsplit. On the
GPU the chunks overlap fully under the ``stream`` handle policy (a cuSOLVER handle per lane); under the
default ``device`` policy the cuSOLVER calls that share the one handle are ordered on the GPU (the
handle has internal state no lane can own), while the copies around them still overlap.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes as dt
from ..array import Array
from ..graph.node import ArrayData, Primitive
from .core import describe, operand, outputs, stream_of
from .index import getitem
from .shape import astype, concatenate


class Factorization(Primitive):
    """One solver call; ``params`` are keyword options (e.g. full_matrices)."""

    kind = "linalg"
    plain = False

    def __init__(self, name: str, **params: Any):
        super().__init__(name)
        self.params = params


def _float_dtype(name: str, d: ArrayData) -> np.dtype:
    if d.dtype in (dt.float32, dt.float64) or dt.is_complex(d.dtype):
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
    return astype(Array._wrap(d), to, stream=st)._data


def _factor(name: str, params: dict, inputs: tuple, specs: list, st, split: tuple, single: bool = False):
    """The op's node(s). ``split`` says, per input, whether it carries the batch's first axis (and is
    cut with it); every output does. Several lanes and a batch of 2 or more: one node per chunk."""
    lanes = len(st.lanes)
    b0 = specs[0][0][0] if any(split) and len(inputs[0].shape) > 2 else 0
    if lanes < 2 or b0 < 2 or st.backend.runs_linalg_batched(name, [d.shape for d in inputs],
                                                              [shape for shape, _ in specs]):
        outs = outputs(Factorization(name, **params), inputs, specs, st)
        return outs[0] if single else outs
    k = min(lanes, b0)
    bounds = [b0 * j // k for j in range(k + 1)]
    per = 1  # matrices per step of the first axis: chunk offsets in the flattened batch, for messages
    for s in inputs[0].shape[1:-2]:
        per *= s
    parts = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        ins = tuple(getitem(Array._wrap(d), slice(lo, hi), stream=st)._data if cut else d
                    for d, cut in zip(inputs, split))
        pspecs = [((hi - lo,) + shape[1:], dtype) for shape, dtype in specs]
        prim = Factorization(name, **params, first=lo * per, total=b0 * per)
        parts.append(outputs(prim, ins, pspecs, st))
    outs = tuple(concatenate([p[i] for p in parts], axis=0, stream=st) for i in range(len(specs)))
    return outs[0] if single else outs


def cholesky(a: Any, upper: bool = False, *, stream: Any = None) -> Array:
    """Cholesky factor of symmetric positive-definite matrices: lower ``L`` with ``a = L @ L.T``
    (or upper ``U`` with ``a = U.T @ U`` when ``upper=True``)."""
    st = stream_of(stream, "cholesky")
    d = _matrix("cholesky", a, st, square=True)
    to = _float_dtype("cholesky", d)
    return _factor("cholesky", {"upper": bool(upper)}, (_cast(d, to, st),), [(d.shape, to)], st, (True,), single=True)


def inv(a: Any, *, stream: Any = None) -> Array:
    """Inverse of square matrices."""
    st = stream_of(stream, "inv")
    d = _matrix("inv", a, st, square=True)
    to = _float_dtype("inv", d)
    return _factor("inv", {}, (_cast(d, to, st),), [(d.shape, to)], st, (True,), single=True)


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
    # cut along the batch only when a carries the whole batch; b too when it has that batch axis
    cut_a = len(da.shape) > 2 and len(shape) > 2 and da.shape[0] == shape[0]
    cut_b = cut_a and len(db.shape) == len(shape) and db.shape[0] == shape[0]
    if cut_a and len(db.shape) > 1 and not cut_b and len(db.shape) == len(shape):
        cut_a = False  # b broadcasts along the first axis (size 1) while a does not: keep one command
    return _factor("solve", {}, (_cast(da, to, st), _cast(db, to, st)), [(shape, to)], st, (cut_a, cut_b),
                   single=True)


def qr(a: Any, *, mode: str = "reduced", stream: Any = None) -> tuple[Array, Array]:
    """QR decomposition. ``mode="reduced"``: ``q`` (..., M, K), ``r`` (..., K, N) with K = min(M, N);
    ``"complete"``: ``q`` (..., M, M), ``r`` (..., M, N) (they differ only for a tall matrix, M > N)."""
    if mode not in ("reduced", "complete"):
        raise ValueError(f"qr: mode must be 'reduced' or 'complete', got {mode!r}")
    st = stream_of(stream, "qr")
    d = _matrix("qr", a, st, square=False)
    to = _float_dtype("qr", d)
    *batch, m, n = d.shape
    k = m if mode == "complete" else min(m, n)
    batch = tuple(batch)
    params = {"mode": "complete"} if k > min(m, n) else {}  # (a reduced QR's key stays as it was)
    return _factor("qr", params, (_cast(d, to, st),), [(batch + (m, k), to), (batch + (k, n), to)], st, (True,))


def eigh(a: Any, UPLO: str = "L", *, stream: Any = None) -> tuple[Array, Array]:  # noqa: N803 - numpy's name
    """Eigenvalues (ascending) and eigenvectors of symmetric matrices, from the ``UPLO`` triangle."""
    st = stream_of(stream, "eigh")
    if UPLO not in ("L", "U"):
        raise ValueError(f"eigh: UPLO must be 'L' or 'U', got {UPLO!r}")
    d = _matrix("eigh", a, st, square=True)
    to = _float_dtype("eigh", d)
    return _factor("eigh", {"UPLO": UPLO}, (_cast(d, to, st),), [(d.shape[:-1], dt.real_dtype(to)), (d.shape, to)],
                   st, (True,))


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
        return _factor("svd", {"full_matrices": bool(full_matrices), "compute_uv": False}, src,
                       [(batch + (k,), dt.real_dtype(to))], st, (True,), single=True)
    um, vn = (m, n) if full_matrices else (k, k)
    specs = [(batch + (m, um), to), (batch + (k,), dt.real_dtype(to)), (batch + (vn, n), to)]
    return _factor("svd", {"full_matrices": bool(full_matrices), "compute_uv": True}, src, specs, st, (True,))
