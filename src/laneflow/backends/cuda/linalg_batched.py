"""``lf.linalg`` for batches of small matrices: one batched library call per command instead of a loop.

A cuSOLVER handle runs its calls one after another (its internal state, :mod:`.linalg`), so concurrency
for many small factorizations comes from the libraries' batched routines, under one handle per device:

==========  ==========================================================  ============================
op          routine                                                     limit
==========  ==========================================================  ============================
cholesky    cuSOLVER ``potrfBatched`` (pointer array, info per matrix)   n <= :func:`batched_max_n`
solve       cuBLAS ``getrfBatched`` + ``getrsBatched`` (pointer arrays)  ``a`` carries the whole batch
inv         cuBLAS ``matinvBatched`` (n <= 32), else ``getrfBatched`` +
            ``getriBatched``
eigh        cuSOLVER ``syevjBatched`` (Jacobi; its params object)        n <= 32 (the library's)
svd         cuSOLVER ``gesvdjBatched`` (Jacobi; full u and v)            m, n <= 32 (the library's)
==========  ==========================================================  ============================

qr stays a loop: cuBLAS has ``geqrfBatched`` but no batched routine forms Q. ``potrsBatched`` is not
used: ``lf.linalg.solve`` does not know that ``a`` is positive definite, and it takes one right-hand
side only.

**Which path.** A batch of at least :data:`BATCHED_MIN_BATCH` matrices no larger than
:func:`batched_max_n` (:data:`BATCHED_MAX_N`, overridden by ``LANEFLOW_LINALG_BATCHED_MAX_N``; 0 turns
the batched path off) takes it; larger matrices keep the per-matrix loop, which is faster once each
matrix fills the GPU. The crossover is a measurement (``python -m laneflow bench handles``, rows
"looped vs batched"). ``ops/linalg.py`` asks the backend (``Backend.runs_linalg_batched``) and keeps such a
batch one command rather than splitting it over lanes.

**Pointer arrays** (:mod:`.kernels.pointers`) are written by a small kernel on the lane before the call,
in memory from the stream-ordered pool freed on that lane after it, so they stay valid until the call is
done; inside a graph capture they are graph-owned memory written once.

**Errors**: every batched routine reports per matrix (``infoArray``); the same check-slot scan as the loop
(:func:`.linalg._defer_info`) raises :class:`lf.LinAlgError` naming the first failing matrix, for the
values computed from that batch only.

**Graphs**: potrfBatched and the cuBLAS routines are captured like their loop counterparts. Whether
syevjBatched and gesvdjBatched capture is :data:`BATCHED_CAPTURES` (``tools/probe_solver_capture.py``
measures it); until measured they refuse capture, as syevd and gesvd do.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from ...errors import FINITE_ONLY, LaneflowError
from . import linalg as looped
from .handles import device_handles, per_device
from .kernels.pointers import strided_pointers

#: Largest n (of n x n, or of m and n) that takes the batched path. No crossover was found up to 128:
#: on 512 matrices one batched call beat the per-matrix loop 50-403x at n = 32, 64 and 128 (``bench
#: handles``, H200, 2026-12-04), so this is the largest size measured, not a measured crossover.
BATCHED_MAX_N = 128
#: The environment variable that overrides :data:`BATCHED_MAX_N` (read at each decision; 0: never batch).
BATCHED_MAX_N_ENV = "LANEFLOW_LINALG_BATCHED_MAX_N"
#: A batch of fewer matrices runs the loop (one matrix is one call either way).
BATCHED_MIN_BATCH = 2
#: What the libraries accept: syevjBatched and gesvdjBatched take n <= 32; matinvBatched too (above it,
#: inv factors with getrfBatched and inverts with getriBatched).
ROUTINE_MAX_N = {"eigh": 32, "svd": 32}
MATINV_MAX_N = 32
#: Whether the Jacobi routines capture into a CUDA graph: both do, and the graph's results match numpy,
#: cold and warm (tools/probe_solver_capture.py, H200, 2026-12-04: docs/perf/suite-decode-h200-2026-12-04-
#: 08b793a.txt). So eigh and svd on the batched path no longer keep a compiled function on commands;
#: the loop's syevd and gesvd still refuse capture.
BATCHED_CAPTURES = {"eigh": True, "svd": True}
#: The batched routine behind each op (messages, the capture refusal).
ROUTINES = {"cholesky": "potrfBatched", "solve": "getrfBatched/getrsBatched", "inv": "matinvBatched",
            "eigh": "syevjBatched", "svd": "gesvdjBatched"}


def batched_max_n() -> int:
    """The crossover in force: ``LANEFLOW_LINALG_BATCHED_MAX_N`` when set, else :data:`BATCHED_MAX_N`."""
    raw = os.environ.get(BATCHED_MAX_N_ENV)
    if raw is None:
        return BATCHED_MAX_N
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{BATCHED_MAX_N_ENV} must be a whole number (0 turns batched linalg off), "
                         f"got {raw!r}") from None


def takes_batched(name: str, in_shapes: Sequence[tuple], out_shapes: Sequence[tuple]) -> bool:
    """Whether op ``name`` with these input and output shapes runs as one batched library call."""
    if name not in ROUTINES:
        return False
    a = tuple(in_shapes[0])
    if len(a) < 3:
        return False
    count = 1
    for s in a[:-2]:
        count *= s
    m, n = a[-2:]
    if count < BATCHED_MIN_BATCH or m == 0 or n == 0:
        return False
    if max(m, n) > min(batched_max_n(), ROUTINE_MAX_N.get(name, max(m, n))):
        return False
    if name == "solve":  # one factorization per right-hand side matrix: a must not broadcast
        out = tuple(out_shapes[0])
        out_batch = out[:-1] if len(in_shapes[1]) == 1 else out[:-2]
        return out_batch == a[:-2]
    return True


class BatchedLib:
    """Per-device state of the batched path: the cuBLAS pool (the device's, shared with grouped
    matmuls), the Jacobi params objects (host-side settings: tolerance, sweeps, sorting; defaults kept)."""

    def __init__(self, ctx: Any):
        from nvmath.bindings import cusolverDn

        self.ctx = ctx
        self.solver = looped._lib(ctx)
        self.blas = device_handles(ctx).pool("cublas")
        self.cb = self.blas.library.mod
        self.syevj = int(cusolverDn.create_syevj_info())
        self.gesvdj = int(cusolverDn.create_gesvdj_info())

    def fn(self, dtype, name: str):
        """cuBLAS's ``<t><name>`` for float32 / float64."""
        return getattr(self.cb, ("s" if dtype == np.float32 else "d") + name)


def _batched_lib(ctx) -> BatchedLib:
    b = getattr(ctx, "linalg_batched", None)
    if b is None:
        looped._lib(ctx)  # what BatchedLib reads is made first: per_device's lock is not re-entrant
        device_handles(ctx).pool("cublas")
        b = per_device(ctx, "linalg_batched", lambda: BatchedLib(ctx))
    return b


def _count(shape: tuple) -> int:
    return looped._batch(shape, 2)


def _pointers(lane, call, arrays: list[tuple[int, int]], count: int) -> list[int]:
    dst = call.alloc(8 * count * len(arrays))
    return strided_pointers(lane, dst, arrays, count)


def _blas_status(op: str, routine: str, info: np.ndarray) -> None:
    """cuBLAS's host-side info (argument checks of getrsBatched): nonzero is laneflow's bug."""
    if int(info[0]) != 0:
        raise LaneflowError(f"{op}: cuBLAS {routine} rejected argument {-int(info[0])} (a laneflow bug; "
                            "set LANEFLOW_LINALG_BATCHED_MAX_N=0 to use the per-matrix path meanwhile)")


def cholesky(lane, blib: BatchedLib, call, prim, a, out) -> None:
    n = a.shape[-1]
    B = _count(a.shape)
    dt, isz = a.dtype, a.dtype.itemsize
    lib = blib.solver
    upper = prim.params["upper"]
    uplo = lib.LOWER if upper else lib.UPPER  # as the loop: row-major lower = column-major upper
    looped._copy(lane, out.ptr, a.ptr, a.nbytes)
    (arr,) = _pointers(lane, call, [(out.ptr, n * n * isz)], B)
    potrf = lib.fn(dt, "potrf_batched")
    with looped._Scratch(lib, call, [4 * B]) as (h, (info,)):
        potrf(h, uplo, n, arr, n, info, B)
        # potrfBatched uses the other triangle as workspace: zeroing it is needed, not cosmetic
        looped._tri_zero(lane, out.ptr, dt, B, n, n, keep_upper=upper)
        looped._defer_info(lane, "cholesky", "Matrix is not positive definite",
                           "the leading minor of order {} is not positive", info, B, prim)


def solve(lane, blib: BatchedLib, call, prim, a, bm, out) -> None:
    n = a.shape[-1]
    B = _count(a.shape)
    dt, isz = a.dtype, a.dtype.itemsize
    out_batch = tuple(a.shape[:-2])  # takes_batched: the output's batch is a's
    if len(bm.shape) == 1:  # one vector for every matrix of a (numpy 2)
        k = 1
        b_strides = (0,) * len(out_batch) + (1, 0)
    else:
        k = bm.shape[-1]
        b_strides = looped.broadcast_strides(tuple(bm.shape), out_batch + (n, k))
    lu = call.alloc(a.nbytes)
    looped._copy(lane, lu, a.ptr, a.nbytes)
    x = out.ptr if k == 1 else call.alloc(out.nbytes)  # column-major right-hand sides, as the loop
    ost = tuple(n * k * st for st in looped.contiguous_strides(out_batch)) + (1, n)
    looped.strided_copy(lane, x, dt, bm.ptr, dt, out_batch + (n, k), b_strides, ost)
    a_arr, x_arr = _pointers(lane, call, [(lu, n * n * isz), (x, n * k * isz)], B)
    ipiv, info = call.alloc(4 * B * n), call.alloc(4 * B)
    host_info = np.zeros(1, np.int32)
    getrf, getrs = blib.fn(dt, "getrf_batched"), blib.fn(dt, "getrs_batched")
    e = blib.blas.use(lane)
    try:
        h, _ws = e.current
        getrf(h, n, a_arr, n, ipiv, info, B)
        # The LU is of the buffer, A^T; op T solves (A^T)^T X = A X = B.
        getrs(h, blib.solver.OP_T, n, k, a_arr, n, ipiv, x_arr, n, host_info.ctypes.data, B)
    finally:
        e.lock.release()
    _blas_status("solve", "getrsBatched", host_info)
    looped._defer_info(lane, "solve", "Singular matrix", "U[{0},{0}] is exactly zero (1-based)", info, B, prim)
    if k != 1:
        looped._transpose(lane, out.ptr, x, dt, B, n, k)


def inv(lane, blib: BatchedLib, call, prim, a, out) -> None:
    n = a.shape[-1]
    B = _count(a.shape)
    dt, isz = a.dtype, a.dtype.itemsize
    step = n * n * isz
    info = call.alloc(4 * B)
    e = blib.blas.use(lane)
    try:
        h, _ws = e.current
        # The buffer holds A^T; its inverse (A^-1)^T, column-major, is the row-major A^-1.
        if n <= MATINV_MAX_N:
            a_arr, c_arr = _pointers(lane, call, [(a.ptr, step), (out.ptr, step)], B)
            blib.fn(dt, "matinv_batched")(h, n, a_arr, n, c_arr, n, info, B)  # reads a, writes out
        else:
            lu = call.alloc(a.nbytes)
            looped._copy(lane, lu, a.ptr, a.nbytes)
            a_arr, c_arr = _pointers(lane, call, [(lu, step), (out.ptr, step)], B)
            ipiv, info2 = call.alloc(4 * B * n), call.alloc(4 * B)
            blib.fn(dt, "getrf_batched")(h, n, a_arr, n, ipiv, info, B)
            blib.fn(dt, "getri_batched")(h, n, a_arr, n, ipiv, c_arr, n, info2, B)
    finally:
        e.lock.release()
    looped._defer_info(lane, "inv", "Singular matrix", "U[{0},{0}] is exactly zero (1-based)", info, B, prim)


def eigh(lane, blib: BatchedLib, call, prim, a, w, v) -> None:
    n = a.shape[-1]
    B = _count(a.shape)
    dt, isz = a.dtype, a.dtype.itemsize
    lib = blib.solver
    uplo = lib.UPPER if prim.params["UPLO"] == "L" else lib.LOWER  # row-major lower = column-major upper
    t = call.alloc(a.nbytes)
    looped._copy(lane, t, a.ptr, a.nbytes)
    lwork = lib.lwork(lane, dt, "syevj_batched", lib.VECTOR, uplo, n, looped._Ptr(t), n, looped._Ptr(w.ptr),
                      looped._Ptr(blib.syevj), B)
    syevj = lib.fn(dt, "syevj_batched")
    with looped._Scratch(lib, call, [4 * B, lwork * isz]) as (h, (info, work)):
        syevj(h, lib.VECTOR, uplo, n, t, n, w.ptr, work, lwork, info, blib.syevj, B)
        looped._transpose(lane, v.ptr, t, dt, B, n, n)  # eigenvectors are the columns
        looped._defer_info(lane, "eigh", "Eigenvalues did not converge",
                           "the Jacobi method did not converge (info {})", info, B, prim)


def svd(lane, blib: BatchedLib, call, prim, a, outs) -> None:
    m, n = a.shape[-2:]
    k = min(m, n)
    B = _count(a.shape)
    dt, isz = a.dtype, a.dtype.itemsize
    lib = blib.solver
    uv, full = prim.params["compute_uv"], prim.params["full_matrices"]
    s = outs[1] if uv else outs[0]
    # The buffer is A^T (n x m, column-major) = U' S V'^T, so a = V' S U'^T: u = V' (m x m),
    # vh = U'^T (n x n). gesvdjBatched takes any m, n up to 32 and returns full U' and V' (not V'^T).
    t = call.alloc(a.nbytes)
    looped._copy(lane, t, a.ptr, a.nbytes)
    ubuf, vbuf = call.alloc(B * n * n * isz), call.alloc(B * m * m * isz)
    jobz = lib.VECTOR if uv else lib.NOVECTOR
    lwork = lib.lwork(lane, dt, "gesvdj_batched", jobz, n, m, looped._Ptr(t), n, looped._Ptr(s.ptr),
                      looped._Ptr(ubuf), n, looped._Ptr(vbuf), m, looped._Ptr(blib.gesvdj), B)
    gesvdj = lib.fn(dt, "gesvdj_batched")
    with looped._Scratch(lib, call, [4 * B, lwork * isz]) as (h, (info, work)):
        gesvdj(h, jobz, n, m, t, n, s.ptr, ubuf, n, vbuf, m, work, lwork, info, blib.gesvdj, B)
        looped._defer_info(lane, "svd", "SVD did not converge", "the Jacobi method did not converge (info {})",
                           info, B, prim)
    if uv:
        u, vh = outs[0], outs[2]
        ucols, vrows = u.shape[-1], vh.shape[-2]
        looped._transpose(lane, u.ptr, vbuf, dt, B, m, ucols, ld=m, bstride=m * m)   # u[i, j] = V'[i, j]
        # vh[i, j] = U'[j, i]: the first vrows columns of each column-major U', read row by row
        looped.strided_copy(lane, vh.ptr, dt, ubuf, dt, (B, vrows, n), (n * n, n, 1), (vrows * n, n, 1))


_OPS = {"cholesky": cholesky, "solve": solve, "inv": inv, "eigh": eigh, "svd": svd}


def linalg(lane, prim, ins, outs) -> None:
    """The ``linalg`` primitive kind on a CUDA lane: the batched path when :func:`takes_batched` says so,
    else the per-matrix loop of :mod:`.linalg`."""
    name = prim.name
    if ins[0].dtype.kind == "c" or not takes_batched(name, [x.shape for x in ins], [o.shape for o in outs]):
        return looped.linalg(lane, prim, ins, outs)  # complex: the loop's c/z routines (not batched here)
    if name in looped.NOT_CAPTURABLE and not BATCHED_CAPTURES.get(name) and lane.ctx.memory.capture is not None:
        raise LaneflowError(f"{name}: cuSOLVER's {ROUTINES[name]} is not known to capture into a CUDA graph "
                            "(BATCHED_CAPTURES; tools/probe_solver_capture.py); the compiled function replays "
                            "its commands")
    if name in FINITE_ONLY:
        looped._defer_finite(lane, name, ins[0])  # inf/NaN refused as on the loop's path and the CPU
    blib = _batched_lib(lane.ctx)
    call = looped._Call(lane)
    try:
        if name == "svd":
            svd(lane, blib, call, prim, ins[0], outs)
        else:
            _OPS[name](lane, blib, call, prim, *ins, *outs)
    finally:
        call.free()
