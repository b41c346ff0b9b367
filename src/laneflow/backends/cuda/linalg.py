"""``lf.linalg`` on the GPU through cuSOLVER dense (nvmath-python's bindings), with the CPU kernel's semantics.

One cuSOLVER handle per device by default (:mod:`laneflow.runtime.handle_pool`), bound to the lane
before each command; a batch is a loop of calls on that lane. A shared handle's calls never overlap on
the GPU (a lane that takes the handle over waits, on the device, for the lane that had it:
``CusolverDnLibrary.hand_over``); under the ``stream`` policy each lane has its own and they overlap,
and ``lf.cuda.set_handles_per_device("cusolverDn", k)`` lets k overlap. Workspaces come from the
``*_bufferSize`` queries (cached per shape) and live in the lane's scratch of the pool (grown on
demand, kept while the lane lives; a need above :data:`SCRATCH_CACHE_LIMIT` is allocated for the one
call instead), so two lanes never share one. Copies of the inputs (the solvers overwrite them) come
from the stream-ordered pool.

Layouts: laneflow is row-major, cuSOLVER column-major, and a row-major matrix *is* its transpose in
column-major. So cholesky and eigh (symmetric) read the input as is and pick the other triangle; inv
solves ``A^T X = I`` with the LU of the buffer (``A^T``), whose column-major X is the row-major
``A^-1``; svd of a wide or square matrix factors ``A^T`` and finds ``u`` and ``vh`` already in
row-major order; solve with several right-hand sides, qr, eigh's vectors and svd of a tall matrix
transpose through the strided-copy kernel.

Complex matrices take cuSOLVER's c/z routines (ungqr and heevd for orgqr and syevd). The layout trick
holds because it rests on plain transposes: for a Hermitian A the buffer is ``A^T = conj(A)``, whose
Cholesky factor seen row-major is A's, and whose eigenvectors are A's conjugated (eigh conjugates them
after the transpose); getrs' ``OP_T`` is the plain transpose; svd's factors need no conjugation.

Errors: numpy raises ``LinAlgError`` for a matrix that is not positive definite (cholesky), singular
(solve, inv), or when eigh/svd do not converge. cuSOLVER reports that in ``devInfo`` on the device;
a one-thread kernel copies the first failure into a check slot (:mod:`.checks`) and the command's
outputs carry a deferred check, resolved at the host wait that needs them (also of values computed
from them). So a failing matrix raises :class:`lf.LinAlgError` at that eval, as on the CPU, and the
lane never waits.

Inside a CUDA graph (``lf.compile``) the calls run on the graphs' own handle (``SolverLib.pool_for``:
a captured kernel keeps its handle's internal state, so a graph must not share one with eager calls,
and launches of such graphs are ordered among themselves), scratch is the graph's, and the devInfo
scan writes a slot of the graph that every launch copies into a fresh one (:func:`.checks.deferred`),
so each call's failure is raised at its own host wait. cholesky, solve, inv and qr are captured;
eigh and svd (:data:`NOT_CAPTURABLE`) refuse capture, so a plan holding them replays its commands.

A batch of small matrices takes one batched library call instead of this loop (:mod:`.linalg_batched`,
which the dispatch table calls first); its capture rules are its own.
"""

from __future__ import annotations

import numpy as np
from cuda.bindings import driver as cu

from ...errors import FINITE_ONLY, LaneflowError, LinAlgError, non_finite_input
from .checks import deferred
from .driver import check
from .handles import device_handles
from .kernels import cdefs as C
from .kernels.copy import strided_copy
from .kernels.elementwise import run as elementwise_run
from .kernels.launch import grid_1d
from .kernels.plan import broadcast_strides, contiguous_strides

MiB = 1 << 20
#: Per-lane scratch needs up to this size are kept (and reused) by the pool; larger ones are per call.
SCRATCH_CACHE_LIMIT = 64 * MiB
_ALIGN = 256
#: Routines stream capture fails on (tools/probe_solver_capture.py on an H200, cuSOLVER of CUDA 13:
#: gesvd and syevd fail while captured; potrf/potrs, getrf/getrs, geqrf/orgqr capture and replay).
NOT_CAPTURABLE = {"eigh": "syevd", "svd": "gesvd"}


class SolverLib:
    """Per-device cuSOLVER state: the handle pool, the enum values, cached workspace sizes."""

    def __init__(self, ctx):
        from nvmath.bindings import cublas, cusolver, cusolverDn

        self.ctx = ctx
        self.sv = cusolverDn
        self.UPPER, self.LOWER = int(cublas.FillMode.UPPER), int(cublas.FillMode.LOWER)
        self.OP_N, self.OP_T = int(cublas.Operation.N), int(cublas.Operation.T)
        self.VECTOR, self.NOVECTOR = int(cusolver.EigMode.VECTOR), int(cusolver.EigMode.NOVECTOR)
        self.pool = device_handles(ctx).pool("cusolverDn")
        self._lwork: dict = {}

    def pool_for(self, lane):
        """The handle pool for a command on ``lane``: the device's, or while a CUDA graph is captured
        the graphs' own (``cusolverDn-graph``: a captured kernel keeps its handle's internal state, so
        graphs never share a handle with eager calls)."""
        if lane.ctx.memory.capture is None:
            return self.pool
        return device_handles(self.ctx).pool("cusolverDn-graph")  # made before the capture (cudagraph.capture)

    def fn(self, dtype, name: str):
        """cuSOLVER's routine ``name`` for dtype: its s/d/c/z variant, under the complex name where
        LAPACK's differs (orgqr is ungqr, syevd heevd)."""
        if dtype.kind == "c":
            base, _, tail = name.partition("_")
            name = _COMPLEX_NAMES.get(base, base) + ("_" + tail if tail else "")
        return getattr(self.sv, _PREFIX[np.dtype(dtype).name] + name)

    def lwork(self, lane, dtype, name: str, *args) -> int:
        """Workspace elements from ``<t><name>_bufferSize(handle, *args)``, cached by the integer arguments."""
        key = (dtype, name) + tuple(a for a in args if not isinstance(a, _Ptr))
        v = self._lwork.get(key)
        if v is None:
            with self.pool_for(lane).use(lane) as (h, _):
                v = int(self.fn(dtype, name + "_buffer_size")(h, *[int(a) for a in args]))
            self._lwork[key] = v
        return v


#: cuSOLVER's type letter of each dtype, and the complex names of the real routines that differ
_PREFIX = {"float32": "s", "float64": "d", "complex64": "c", "complex128": "z"}
_COMPLEX_NAMES = {"orgqr": "ungqr", "syevd": "heevd"}


class _Ptr(int):
    """A device pointer among bufferSize arguments (not part of the cache key)."""


def _lib(ctx) -> SolverLib:
    g = device_handles(ctx)
    if g.solver is None:
        g.solver = SolverLib(ctx)
        ctx.solver = g.solver  # where graph capture looks for library pools to pre-warm
    return g.solver


def _up(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class _Call:
    """One command's device temporaries (freed in the lane's stream order) and its scratch layout."""

    def __init__(self, lane):
        self.lane = lane
        self.temps: list[int] = []

    def alloc(self, nbytes: int) -> int:
        ptr = self.lane.ctx.memory.raw_alloc(max(nbytes, 1), self.lane.stream, "linalg")
        self.temps.append(ptr)
        return ptr

    def free(self) -> None:
        mem, stream = self.lane.ctx.memory, self.lane.stream
        for t in self.temps:
            mem.raw_free(t, stream)
        self.temps.clear()


class _Scratch:
    """``with _Scratch(lib, call, sizes) as (handle, ptrs):`` the handle bound to the lane and one
    pointer per requested size, carved from the lane's workspace (or a per-call one when large)."""

    def __init__(self, lib: SolverLib, call: _Call, sizes: list[int]):
        self.lib, self.call, self.sizes = lib, call, [_up(s) for s in sizes]

    def __enter__(self):
        need = sum(self.sizes)
        lane = self.call.lane
        # While a CUDA graph is captured, scratch must be the graph's (memory.capture), never the pool's.
        cached = need <= SCRATCH_CACHE_LIMIT and lane.ctx.memory.capture is None
        self.entry = self.lib.pool_for(lane).use(lane, need if cached else 0)  # locked until __exit__
        h, ws = self.entry.current
        try:
            base = ws[0] if cached else self.call.alloc(need)
        except BaseException:
            self.entry.lock.release()
            raise
        ptrs = []
        for s in self.sizes:
            ptrs.append(base)
            base += s
        return h, ptrs

    def __exit__(self, *exc):
        self.entry.lock.release()


def _build_scan():
    # One block: each thread scans a strided share and offers its first nonzero index; the smallest
    # wins (a one-thread loop over a 4096-matrix batch took a large part of a batched solve's time).
    src = ('extern "C" __global__ void lf_info_scan(const int* info, long long count, unsigned long long* slot) {\n'
           "  __shared__ unsigned long long first;\n"
           "  if (threadIdx.x == 0) first = ~0ULL;\n"
           "  __syncthreads();\n"
           "  for (long long i = threadIdx.x; i < count; i += blockDim.x) {\n"
           "    if (info[i] != 0) { atomicMin(&first, (unsigned long long)i); break; }\n"
           "  }\n"
           "  __syncthreads();\n"
           "  if (threadIdx.x == 0) {\n"
           "    if (first != ~0ULL) { slot[0] = 1ULL; slot[1] = first;"
           " slot[2] = (unsigned long long)(long long)info[first]; }\n"
           "    else slot[0] = 0ULL;\n"  # every run writes word 0: a graph's slot is reused by each launch
           "  }\n}\n")
    return src, "lf_info_scan", "pqp"


def _info_error(op: str, what: str, detail: str, i: int, v: int, count: int) -> LinAlgError:
    """numpy's error for devInfo value ``v`` of matrix ``i`` of ``count``."""
    where = f" (matrix {i} of the batch)" if count > 1 else ""
    if v > 0:
        return LinAlgError(f"{op}: {what}{where}: {detail.format(v)}")
    return LinAlgError(f"{op}: cuSOLVER rejected argument {-v}")  # laneflow's bug, not the data


def _defer_info(lane, op: str, what: str, detail: str, ptr: int, count: int, prim=None) -> None:
    """Check ``count`` devInfo words without waiting: a one-thread kernel copies the first nonzero one
    (batch index and value) into a check slot, read at the host wait (:mod:`.checks`). A chunk of a
    batch split over lanes (``ops/linalg.py``) names matrices by their index in the whole batch."""
    if not count:
        return
    params = getattr(prim, "params", {})
    first, total = params.get("first", 0), params.get("total", count)

    def explain(words, op=op, what=what, detail=detail):
        if not words[0]:
            return None
        return _info_error(op, what, detail, first + int(words[1]), int(np.int64(np.uint64(words[2]))), total)

    slot = deferred(lane, explain, "linalg", overwrites=True)
    k = lane.ctx.modules.get(("solver_info_scan",), _build_scan)
    k.launch(lane.handle, (1, 1, 1), (256, 1, 1), (ptr, count, slot))


def _build_finite(dtype):
    T = _ctype(dtype)
    src = (f'extern "C" __global__ void lf_finite_scan(const {T}* a, long long total, unsigned long long* slot) {{\n'
           "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;"
           " i += (long long)blockDim.x * gridDim.x) {\n"
           "    if (!lf_isfinite(a[i])) { slot[0] = 1ULL; return; }\n  }\n}\n")
    return src, "lf_finite_scan", "pqp"


def _defer_finite(lane, op: str, a) -> None:
    """svd and eigh refuse inf and NaN on the GPU too (:data:`laneflow.errors.FINITE_ONLY`), without a
    host wait: a scan flags a non-finite value in a check slot, read at the host wait that needs the
    results, so the command raises the CPU's :class:`LinAlgError`."""
    if not a.size:
        return
    shape, dtype = a.shape, a.dtype
    slot = deferred(lane, lambda words: non_finite_input(op, shape, dtype) if words[0] else None, op)
    k = lane.ctx.modules.get(("solver_finite_scan", dtype), lambda: _build_finite(dtype))
    k.launch(lane.handle, grid_1d(lane.ctx, a.size), (256, 1, 1), (a.ptr, a.size, slot))


# -- small kernels: zero a triangle, write identities --------------------------------------------

def _ctype(dtype) -> str:
    return C.storage(dtype)  # float, double, lf_c64, lf_c128


def _build_tri(dtype):
    T = _ctype(dtype)
    src = (f'extern "C" __global__ void lf_tri_zero({T}* a, long long rows, long long cols, long long total, '
           "int keep_upper) {\n"
           "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;"
           " i += (long long)blockDim.x * gridDim.x) {\n"
           "    long long c = i % cols, r = (i / cols) % rows;\n"
           f"    if (keep_upper ? (c < r) : (c > r)) a[i] = ({T})0;\n  }}\n}}\n")
    return src, "lf_tri_zero", "pqqqi"


def _build_eye(dtype):
    T = _ctype(dtype)
    src = (f'extern "C" __global__ void lf_eye_batch({T}* a, long long rows, long long cols, long long total) {{\n'
           "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;"
           " i += (long long)blockDim.x * gridDim.x) {\n"
           "    long long c = i % cols, r = (i / cols) % rows;\n"
           f"    a[i] = (r == c) ? ({T})1 : ({T})0;\n  }}\n}}\n")
    return src, "lf_eye_batch", "pqqq"


def _tri_zero(lane, ptr: int, dtype, batch: int, rows: int, cols: int, keep_upper: bool) -> None:
    total = batch * rows * cols
    if total:
        k = lane.ctx.modules.get(("solver_tri", dtype), lambda: _build_tri(dtype))
        k.launch(lane.handle, grid_1d(lane.ctx, total), (256, 1, 1), (ptr, rows, cols, total, int(keep_upper)))


def _eye(lane, ptr: int, dtype, batch: int, rows: int, cols: int) -> None:
    total = batch * rows * cols
    if total:
        k = lane.ctx.modules.get(("solver_eye", dtype), lambda: _build_eye(dtype))
        k.launch(lane.handle, grid_1d(lane.ctx, total), (256, 1, 1), (ptr, rows, cols, total))


def _transpose(lane, dst: int, src: int, dtype, batch: int, rows: int, cols: int, ld: int | None = None,
               bstride: int | None = None) -> None:
    """dst (batch, rows, cols) row-major = src read column-major, ``src[b * bstride + j * ld + i]``
    (ld = rows and bstride = ld * cols by default)."""
    ld = rows if ld is None else ld
    bs = ld * cols if bstride is None else bstride
    strided_copy(lane, dst, dtype, src, dtype, (batch, rows, cols), (bs, 1, ld), (rows * cols, cols, 1))


def _to_colmajor(lane, dst: int, src: int, dtype, batch: int, rows: int, cols: int) -> None:
    """dst column-major (ld = rows) from a row-major (batch, rows, cols) src."""
    strided_copy(lane, dst, dtype, src, dtype, (batch, rows, cols), (rows * cols, cols, 1), (rows * cols, 1, rows))


def _copy(lane, dst: int, src: int, nbytes: int) -> None:
    if nbytes:
        check(cu.cuMemcpyDtoDAsync(dst, src, nbytes, lane.stream), "linalg (cuMemcpyDtoDAsync)")


def _batch(shape: tuple, core: int) -> int:
    b = 1
    for s in shape[:len(shape) - core]:
        b *= s
    return b


# -- the primitives -----------------------------------------------------------------------------

def cholesky(lane, lib: SolverLib, call: _Call, prim, a, out) -> None:
    n = a.shape[-1]
    B = _batch(a.shape, 2)
    dt, isz = a.dtype, a.dtype.itemsize
    upper = prim.params["upper"]
    # Row-major lower L (a = L L^T) is column-major upper U = L^T (a = U^T U): potrf UPPER, which reads
    # the column-major upper triangle = the row-major lower one (numpy reads the lower one too).
    uplo = lib.LOWER if upper else lib.UPPER
    _copy(lane, out.ptr, a.ptr, a.nbytes)
    lwork = lib.lwork(lane, dt, "potrf", uplo, n, _Ptr(out.ptr), n)
    potrf = lib.fn(dt, "potrf")
    with _Scratch(lib, call, [4 * B, lwork * isz]) as (h, (info, work)):
        for b in range(B):
            potrf(h, uplo, n, out.ptr + b * n * n * isz, n, work, lwork, info + 4 * b)
        _tri_zero(lane, out.ptr, dt, B, n, n, keep_upper=upper)
        _defer_info(lane, "cholesky", "Matrix is not positive definite", "the leading minor of order {} is not positive", info, B, prim)


def _lu(lane, lib: SolverLib, dt, n: int, nmat: int, lu: int, ipiv: int, work: int, info: int, h) -> None:
    getrf = lib.fn(dt, "getrf")
    isz = dt.itemsize
    for b in range(nmat):
        getrf(h, n, n, lu + b * n * n * isz, n, work, ipiv + b * n * 4, info + 4 * b)


def inv(lane, lib: SolverLib, call: _Call, prim, a, out) -> None:
    n = a.shape[-1]
    B = _batch(a.shape, 2)
    dt, isz = a.dtype, a.dtype.itemsize
    lu = call.alloc(a.nbytes)
    _copy(lane, lu, a.ptr, a.nbytes)
    _eye(lane, out.ptr, dt, B, n, n)
    lwork = lib.lwork(lane, dt, "getrf", n, n, _Ptr(lu), n)
    getrs = lib.fn(dt, "getrs")
    with _Scratch(lib, call, [4 * B, 4 * B, 4 * B * n, lwork * isz]) as (h, (info, info2, ipiv, work)):
        _lu(lane, lib, dt, n, B, lu, ipiv, work, info, h)
        # The buffer holds A^T (column-major view), so solving (A^T) X = I gives X = A^-T, whose
        # column-major layout is the row-major A^-1.
        for b in range(B):
            getrs(h, lib.OP_N, n, n, lu + b * n * n * isz, n, ipiv + b * n * 4, out.ptr + b * n * n * isz, n,
                  info2 + 4 * b)
        _defer_info(lane, "inv", "Singular matrix", "U[{0},{0}] is exactly zero (1-based)", info, B, prim)


def solve(lane, lib: SolverLib, call: _Call, prim, a, bm, out) -> None:
    n = a.shape[-1]
    dt, isz = a.dtype, a.dtype.itemsize
    a_batch = tuple(a.shape[:-2])
    na = _batch(a.shape, 2)
    if len(bm.shape) == 1:  # one vector for every matrix of a (numpy 2)
        out_batch, k = a_batch, 1
        b_strides = (0,) * len(out_batch) + (1, 0)
    else:
        out_batch, k = tuple(out.shape[:-2]), bm.shape[-1]
        b_strides = broadcast_strides(tuple(bm.shape), out_batch + (n, k))
    nout = _batch(out_batch, 0)
    amap = np.broadcast_to(np.arange(na).reshape(a_batch), out_batch).ravel()
    lu = call.alloc(a.nbytes)
    _copy(lane, lu, a.ptr, a.nbytes)
    # Right-hand sides column-major (n x k, ld n) per output matrix; for k == 1 that is the output's
    # own layout, so they are solved in place there.
    x = out.ptr if k == 1 else call.alloc(out.nbytes)
    ost = tuple(n * k * st for st in contiguous_strides(out_batch)) + (1, n)
    strided_copy(lane, x, dt, bm.ptr, dt, out_batch + (n, k), b_strides, ost)
    lwork = lib.lwork(lane, dt, "getrf", n, n, _Ptr(lu), n)
    getrs = lib.fn(dt, "getrs")
    with _Scratch(lib, call, [4 * na, 4, 4 * na * n, lwork * isz]) as (h, (info, info2, ipiv, work)):
        _lu(lane, lib, dt, n, na, lu, ipiv, work, info, h)
        # The LU is of the buffer, A^T; OP_T solves (A^T)^T X = A X = B.
        for t in range(nout):
            j = int(amap[t])
            getrs(h, lib.OP_T, n, k, lu + j * n * n * isz, n, ipiv + j * n * 4, x + t * n * k * isz, n, info2)
        _defer_info(lane, "solve", "Singular matrix", "U[{0},{0}] is exactly zero (1-based)", info, na, prim)
    if k != 1:
        _transpose(lane, out.ptr, x, dt, nout, n, k)


def qr(lane, lib: SolverLib, call: _Call, prim, a, q, r) -> None:
    m, n = a.shape[-2:]
    k = min(m, n)
    B = _batch(a.shape, 2)
    dt, isz = a.dtype, a.dtype.itemsize
    if B == 0:
        return
    if k == 0:  # nothing to factor: a complete Q of an (m, 0) matrix is the identity (numpy)
        if q.size:
            _eye(lane, q.ptr, dt, B, m, q.shape[-1])
        return
    qc = q.shape[-1]  # k, or m for a complete QR of a tall matrix (Q square, R with m rows)
    t = call.alloc(a.nbytes)
    _to_colmajor(lane, t, a.ptr, dt, B, m, n)
    # orgqr forms qc columns of Q in place of the factor: for qc > n, in a column-major m x qc buffer whose
    # first n columns are the factor (its reflectors), the rest overwritten.
    qb, qstride = (t, m * n) if qc <= n else (call.alloc(B * m * qc * isz), m * qc)
    lw1 = lib.lwork(lane, dt, "geqrf", m, n, _Ptr(t), m)
    tau_bytes = B * k * isz
    lw2 = lib.lwork(lane, dt, "orgqr", m, qc, k, _Ptr(qb), m, _Ptr(t))
    lwork = max(lw1, lw2)
    geqrf, orgqr = lib.fn(dt, "geqrf"), lib.fn(dt, "orgqr")
    with _Scratch(lib, call, [4, tau_bytes, lwork * isz]) as (h, (info, tau, work)):
        for b in range(B):
            geqrf(h, m, n, t + b * m * n * isz, m, tau + b * k * isz, work, lwork, info)
        # R: the upper r-rows x n of the column-major factor, row-major, below-diagonal zeroed.
        rows = r.shape[-2]
        _transpose(lane, r.ptr, t, dt, B, rows, n, ld=m, bstride=m * n)
        _tri_zero(lane, r.ptr, dt, B, rows, n, keep_upper=True)
        if qb != t:
            for b in range(B):
                _copy(lane, qb + b * m * qc * isz, t + b * m * n * isz, m * n * isz)
        for b in range(B):
            orgqr(h, m, qc, k, qb + b * qstride * isz, m, tau + b * k * isz, work, lwork, info)
        _transpose(lane, q.ptr, qb, dt, B, m, qc, ld=m, bstride=qstride)


def eigh(lane, lib: SolverLib, call: _Call, prim, a, w, v) -> None:
    n = a.shape[-1]
    B = _batch(a.shape, 2)
    dt, isz = a.dtype, a.dtype.itemsize
    if B == 0 or n == 0:
        return
    # Row-major lower ('L') = column-major upper.
    uplo = lib.UPPER if prim.params["UPLO"] == "L" else lib.LOWER
    t = call.alloc(a.nbytes)
    _copy(lane, t, a.ptr, a.nbytes)
    lwork = lib.lwork(lane, dt, "syevd", lib.VECTOR, uplo, n, _Ptr(t), n, _Ptr(w.ptr))
    syevd = lib.fn(dt, "syevd")  # (heevd for complex)
    wsz = w.dtype.itemsize  # eigenvalues are real
    with _Scratch(lib, call, [4 * B, lwork * isz]) as (h, (info, work)):
        for b in range(B):
            syevd(h, lib.VECTOR, uplo, n, t + b * n * n * isz, n, w.ptr + b * n * wsz, work, lwork, info + 4 * b)
        # column-major eigenvectors (columns) -> row-major v with v[:, i] the i-th eigenvector
        _transpose(lane, v.ptr, t, dt, B, n, n)
        if dt.kind == "c":
            # The buffer held A^T = conj(A) (A Hermitian): its eigenvectors are those of A conjugated.
            elementwise_run(lane, "conj", (0,), [v], v)
        _defer_info(lane, "eigh", "Eigenvalues did not converge", "{} off-diagonal elements did not converge", info, B, prim)


def svd(lane, lib: SolverLib, call: _Call, prim, a, outs) -> None:
    m, n = a.shape[-2:]
    k = min(m, n)
    B = _batch(a.shape, 2)
    dt, isz = a.dtype, a.dtype.itemsize
    uv = prim.params["compute_uv"]
    full = prim.params["full_matrices"]
    if uv:
        u, s, vh = outs
    else:
        (s,) = outs
    if B == 0:
        return
    if k == 0:  # numpy: empty s, identity u and vh
        if uv:
            _eye(lane, u.ptr, dt, B, *u.shape[-2:])
            _eye(lane, vh.ptr, dt, B, *vh.shape[-2:])
        return
    gesvd = lib.fn(dt, "gesvd")
    t = call.alloc(a.nbytes)
    wide = n >= m
    if wide:
        # Column-major A^T (n x m, rows >= cols): A^T = U' S V'^T, so u = V' (row-major = VT' as stored)
        # and vh = U'^T (row-major = U' as stored): no transposes. Complex: A^T = U' S V'^H gives
        # A = conj(V') S U'^T, and the row-major view of the stored V'^H is conj(V'): still no copies.
        _copy(lane, t, a.ptr, a.nbytes)
        rows, cols = n, m
    else:
        _to_colmajor(lane, t, a.ptr, dt, B, m, n)
        rows, cols = m, n
    if not uv:
        jobu = jobvt = ord("N")
    else:
        jobu = ord("A") if full else ord("S")
        jobvt = ord("A")  # cols == k: all of V^T is needed
    ucols = rows if (uv and full) else k
    if uv and not wide:
        ubuf, vtbuf = call.alloc(B * rows * ucols * isz), call.alloc(B * cols * cols * isz)
    elif uv:
        ubuf, vtbuf = vh.ptr, u.ptr
    else:
        ubuf = vtbuf = 0
    lwork = lib.lwork(lane, dt, "gesvd", rows, cols)
    with _Scratch(lib, call, [4 * B, lwork * isz]) as (h, (info, work)):
        for b in range(B):
            gesvd(h, jobu, jobvt, rows, cols, t + b * rows * cols * isz, rows, s.ptr + b * k * s.dtype.itemsize,
                  ubuf + b * rows * ucols * isz if uv else 0, rows,
                  vtbuf + b * cols * cols * isz if uv else 0, cols, work, lwork, 0, info + 4 * b)
        _defer_info(lane, "svd", "SVD did not converge", "{} superdiagonals did not converge", info, B, prim)
    if uv and not wide:
        _transpose(lane, u.ptr, ubuf, dt, B, m, ucols)   # u = U (column-major m x ucols)
        _transpose(lane, vh.ptr, vtbuf, dt, B, n, n)     # vh = V^T (column-major n x n)


def linalg(lane, prim, ins, outs) -> None:
    """The ``linalg`` primitive kind on a CUDA lane (see :mod:`laneflow.ops.linalg`)."""
    if all(o.size == 0 for o in outs):
        return
    name = prim.name
    if name in NOT_CAPTURABLE and lane.ctx.memory.capture is not None:
        # refused before cuSOLVER sees the capture: a failed syevd capture left the stream unusable
        raise LaneflowError(f"{name}: cuSOLVER's {NOT_CAPTURABLE[name]} cannot be captured into a CUDA graph "
                            "(tools/probe_solver_capture.py); the compiled function replays its commands")
    if name in FINITE_ONLY:
        _defer_finite(lane, name, ins[0])  # first: its error is the one a failing matrix reports
    lib = _lib(lane.ctx)
    call = _Call(lane)
    try:
        if name == "cholesky":
            cholesky(lane, lib, call, prim, ins[0], outs[0])
        elif name == "inv":
            inv(lane, lib, call, prim, ins[0], outs[0])
        elif name == "solve":
            solve(lane, lib, call, prim, ins[0], ins[1], outs[0])
        elif name == "qr":
            qr(lane, lib, call, prim, ins[0], *outs)
        elif name == "eigh":
            eigh(lane, lib, call, prim, ins[0], *outs)
        elif name == "svd":
            svd(lane, lib, call, prim, ins[0], outs)
        else:
            raise NotImplementedError(f"linalg: {name} on the GPU")
    finally:
        call.free()
