"""lf.linalg through cuSOLVER: larger matrices than test_linalg.py, the triangle each routine reads, errors
from devInfo, per-lane workspaces, and stress under one shared handle (lanes, host threads) on the GPU; and,
everywhere, the layout bookkeeping of backends/cuda/linalg.py against a numpy model of cuSOLVER."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import repeat_in_threads

import laneflow as lf

gpu = pytest.mark.skipif(not lf.gpu_available(),
                         reason="no usable GPU: laneflow's CUDA backend or an NVIDIA driver is missing")

TOL = {np.float32: 2e-3, np.float64: 1e-9}


@pytest.fixture(autouse=True)
def policy_reset():
    lf.cuda.set_handle_policy(None)
    yield
    lf.cuda.set_handle_policy(None)


def spd(rng, shape, dtype=np.float64):
    a = rng.standard_normal(shape)
    n = shape[-1]
    return (a @ np.swapaxes(a, -1, -2) + n * np.eye(n)).astype(dtype)


def close(got, want, dtype):
    scale = max(1.0, float(np.max(np.abs(want)))) if np.size(want) else 1.0
    np.testing.assert_allclose(np.asarray(got), want, rtol=TOL[dtype], atol=TOL[dtype] * scale)


def created(lib="cusolverDn"):
    return lf.cuda.handle_stats()["handles_created"].get(lib, 0)


@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_factorizations_of_larger_matrices_match_numpy(rng, dtype):
    a = spd(rng, (2, 48, 48), dtype)
    g = (rng.standard_normal((2, 48, 48)) + 48 * np.eye(48)).astype(dtype)  # not symmetric: A and A^T differ
    b = rng.standard_normal((2, 48, 5)).astype(dtype)
    t = rng.standard_normal((40, 24)).astype(dtype)
    with lf.stream(lf.gpu):
        A, G = lf.array(a), lf.array(g)
        L, X, I = lf.linalg.cholesky(A), lf.linalg.solve(G, lf.array(b)), lf.linalg.inv(G)
        w, v = lf.linalg.eigh(A)
        q, r = lf.linalg.qr(lf.array(t))
        qw, rw = lf.linalg.qr(lf.array(t.T.copy()))
        s_tall = lf.linalg.svd(lf.array(t), compute_uv=False)
        u, s, vh = lf.linalg.svd(lf.array(t.T.copy()), full_matrices=False)
    close(L, np.linalg.cholesky(a), dtype)
    close(X, np.linalg.solve(g, b), dtype)
    close(I, np.linalg.inv(g), dtype)
    close(w, np.linalg.eigh(a)[0], dtype)
    vn, wn = np.asarray(v), np.asarray(w)
    close(vn @ (wn[..., None] * np.swapaxes(vn, -1, -2)), a, dtype)
    close(np.asarray(q) @ np.asarray(r), t, dtype)
    close(np.asarray(qw) @ np.asarray(rw), t.T, dtype)
    assert np.all(np.tril(np.asarray(r), -1) == 0) and np.all(np.tril(np.asarray(rw), -1) == 0)
    close(s_tall, np.linalg.svd(t, compute_uv=False), dtype)
    close((np.asarray(u) * np.asarray(s)[None, :]) @ np.asarray(vh), t.T, dtype)


@gpu
def test_gpu_each_routine_reads_the_triangle_numpy_reads(rng):
    a = spd(rng, (5, 5))
    lo, up = a.copy(), a.copy()
    lo[np.triu_indices(5, 1)] = 1e3      # garbage where the lower-triangle routines must not look
    up[np.tril_indices(5, -1)] = -1e3
    with lf.stream(lf.gpu):
        L = lf.linalg.cholesky(lf.array(lo))
        U = lf.linalg.cholesky(lf.array(up), upper=True)
        wl, _ = lf.linalg.eigh(lf.array(lo))
        wu, _ = lf.linalg.eigh(lf.array(up), UPLO="U")
    close(L, np.linalg.cholesky(lo), np.float64)
    close(U, np.linalg.cholesky(up, upper=True), np.float64)
    close(wl, np.linalg.eigh(lo)[0], np.float64)
    close(wu, np.linalg.eigh(up, UPLO="U")[0], np.float64)


@gpu
def test_gpu_solve_broadcasts_and_takes_vectors(rng):
    a = spd(rng, (3, 1, 4, 4))
    b = rng.standard_normal((2, 4, 3))
    v = rng.standard_normal(4)
    with lf.stream(lf.gpu):
        A = lf.array(a)
        x = lf.linalg.solve(A, lf.array(b))
        xv = lf.linalg.solve(A, lf.array(v))
    close(x, np.linalg.solve(a, b), np.float64)
    close(xv, np.linalg.solve(a, v), np.float64)


@gpu
def test_gpu_results_equal_the_cpu_backend_on_empty_and_one_by_one_inputs(rng):
    cases = [(lf.linalg.inv, np.zeros((0, 3, 3))), (lf.linalg.cholesky, np.full((2, 1, 1), 4.0)),
             (lf.linalg.qr, rng.standard_normal((3, 0))), (lf.linalg.svd, rng.standard_normal((2, 0, 3))),
             (lf.linalg.eigh, np.zeros((0, 2, 2)))]
    for fn, a in cases:
        got = fn(lf.array(a, device=lf.gpu), stream=lf.gpu)
        want = fn(lf.array(a, device=lf.cpu), stream=lf.cpu)
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-12)


@gpu
def test_gpu_errors_name_the_matrix_and_the_runtime_stays_usable(rng):
    a = spd(rng, (3, 4, 4))
    a[1] = -np.eye(4)
    with lf.stream(lf.gpu):
        L = lf.linalg.cholesky(lf.array(a))
        later = L + 1.0                  # a dependent op gets the error too
        with pytest.raises(lf.LinAlgError, match=r"cholesky: Matrix is not positive definite \(matrix 1"):
            lf.eval(L)
        with pytest.raises(lf.LinAlgError, match="cholesky"):
            lf.eval(later)
        sing = np.ones((2, 3, 3))
        sing[0] = np.eye(3)
        with pytest.raises(lf.LinAlgError, match=r"inv: Singular matrix \(matrix 1"):
            lf.eval(lf.linalg.inv(lf.array(sing)))
        with pytest.raises(lf.LinAlgError, match="solve: Singular matrix"):
            lf.eval(lf.linalg.solve(lf.array(sing), lf.ones((2, 3, 1))))
        good = spd(rng, (4, 4))
        close(lf.linalg.cholesky(lf.array(good)), np.linalg.cholesky(good), np.float64)


@gpu
def test_gpu_workspace_grows_for_a_large_matrix_and_small_ones_still_work(rng):
    s = lf.new_stream(lf.gpu, lanes=1)
    sizes = [8, 300, 8, 64]
    mats = [spd(rng, (n, n)) for n in sizes]
    outs = [lf.linalg.eigh(lf.array(m, stream=s), stream=s)[0] for m in mats]
    lf.eval(*outs)
    for o, m in zip(outs, mats):
        close(o, np.linalg.eigh(m)[0], np.float64)
    assert lf.cuda.handle_stats()["workspace_bytes"]["cusolverDn"] > 0
    s.close()


def _solve_problems(rng, k=8, n=24):
    a = [spd(rng, (n, n)) for _ in range(k)]
    b = [rng.standard_normal((n, 2)) for _ in range(k)]
    return a, b


@gpu
def test_gpu_eight_lanes_by_200_solves_sharing_one_handle_equal_one_lane(rng):
    a, b = _solve_problems(rng)
    one = lf.new_stream(lf.gpu, lanes=1)
    many = lf.new_stream(lf.gpu, lanes=8)
    A1 = [lf.array(x, stream=one) for x in a]
    B1 = [lf.array(x, stream=one) for x in b]
    A8 = [lf.array(x, stream=many) for x in a]
    B8 = [lf.array(x, stream=many) for x in b]
    lf.eval(*A1, *B1, *A8, *B8)
    lf.eval(lf.linalg.solve(A1[0], B1[0], stream=one))     # the device's solver handle exists now
    before = created()
    idx = [(i % 8, (i * 5 + 3) % 8) for i in range(1600)]
    ref = [lf.linalg.solve(A1[i], B1[j], stream=one) for i, j in idx]
    got = [lf.linalg.solve(A8[i], B8[j], stream=many) for i, j in idx]
    lf.eval(*ref, *got)
    assert created() == before
    assert len({o._data.buffer.writer.lane.id for o in got}) == 8
    for r, g in zip(ref[::37], got[::37]):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(r))
    i, j = idx[11]
    close(got[11], np.linalg.solve(a[i], b[j]), np.float64)
    one.close(), many.close()


@gpu
def test_gpu_two_solver_handles_per_device_give_the_one_lane_results_with_two_handles(rng):
    """``set_handles_per_device("cusolverDn", 2)``: the lanes split over two shared handles (each
    handed over among its own lanes), two solves can overlap, and the results are one lane's."""
    a, b = _solve_problems(rng)
    lf.cuda.set_handles_per_device("cusolverDn", 2)
    try:
        one = lf.new_stream(lf.gpu, lanes=1)
        many = lf.new_stream(lf.gpu, lanes=8)
        A1, B1 = [lf.array(x, stream=one) for x in a], [lf.array(x, stream=one) for x in b]
        A8, B8 = [lf.array(x, stream=many) for x in a], [lf.array(x, stream=many) for x in b]
        lf.eval(*A1, *B1, *A8, *B8)
        before = created()
        idx = [(i % 8, (i * 3 + 1) % 8) for i in range(400)]
        ref = [lf.linalg.solve(A1[i], B1[j], stream=one) for i, j in idx]
        got = [lf.linalg.solve(A8[i], B8[j], stream=many) for i, j in idx]
        lf.eval(*ref, *got)
        assert created() - before <= 2  # two handles per device at most, whatever the lanes
        assert len({o._data.buffer.writer.lane.id for o in got}) == 8
        for r, g in zip(ref[::13], got[::13]):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(r))
        one.close(), many.close()
    finally:
        lf.cuda.set_handles_per_device("cusolverDn", None)


@gpu
def test_gpu_four_host_threads_solving_on_one_shared_handle_get_identical_results(rng):
    a, b = _solve_problems(rng)
    ref = [np.asarray(lf.linalg.solve(lf.array(a[k], device=lf.gpu), lf.array(b[k], device=lf.gpu),
                                      stream=lf.gpu)) for k in range(8)]

    def prepare(s):
        A = [lf.array(x, stream=s) for x in a]
        B = [lf.array(x, stream=s) for x in b]
        return lambda: [lf.linalg.solve(A[k], B[k], stream=s) for k in range(8)]

    # A step repeated becomes a plan cache hit and then a CUDA graph, whose captures take the graphs' own
    # handles (SolverLib.pool_for; two threads capturing at once need two). This test is about eager
    # calls sharing the device's one handle, so hits replay commands here.
    from laneflow.graph import eval_cache

    old = eval_cache.EXECUTOR_AFTER
    lf.set_plan_cache(executor_after=10**9)
    try:
        before = created()
        repeat_in_threads(lf.gpu, prepare, ref, reps=25, check_every=6)
        assert created() == before
    finally:
        lf.set_plan_cache(executor_after=old)


@gpu
@pytest.mark.parametrize("policy, grows", [("device", False), ("stream", True)])
def test_gpu_solver_handles_grow_with_lanes_only_under_the_stream_policy(rng, policy, grows):
    lf.cuda.set_handle_policy(policy)
    lf.eval(lf.linalg.inv(lf.eye(3, stream=lf.gpu) * 2, stream=lf.gpu))
    before = created()
    streams = [lf.new_stream(lf.gpu, lanes=4) for _ in range(2)]
    m = spd(rng, (16, 6, 6))
    outs = [lf.linalg.inv(lf.array(m[k], stream=streams[k % 2]), stream=streams[k % 2]) for k in range(16)]
    lf.eval(*outs)
    used = len({o._data.buffer.writer.lane.id for o in outs})
    assert used >= 4
    assert created() - before == (used if grows else 0)
    close(outs[5], np.linalg.inv(m[5]), np.float64)
    for s in streams:
        s.close()


@gpu
def test_gpu_compiled_functions_with_factorizations_give_numpy_results(rng):
    a = spd(rng, (2, 6, 6))
    t = rng.standard_normal((7, 4))

    def f(a, t):
        q, r = lf.linalg.qr(t)
        return lf.linalg.inv(a) + 1.0, q @ r

    g = lf.compile(f)
    for _ in range(3):  # first call traces; later calls replay (as a CUDA graph where the backend can)
        with lf.stream(lf.gpu):
            inv1, qr = g(lf.array(a), lf.array(t))
        close(inv1, np.linalg.inv(a) + 1.0, np.float64)
        close(qr, t, np.float64)


# -- everywhere: cuda/linalg.py's layouts against a numpy model of cuSOLVER's column-major contract ----------

_MODEL = r'''
import ctypes, enum, importlib.abc, importlib.machinery, itertools, sys, types
import numpy as np


class Any_:
    """Whatever the backend's import-time code asks the stand-in driver for."""
    def __init__(self, *a, **k): pass
    def __getattr__(self, k): return Any_()
    def __call__(self, *a, **k): return (0, 0)
    def __int__(self): return 0
    def __eq__(self, o): return False
    def __hash__(self): return 1
    value = 0


class Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any cuda.* module not defined below imports as a stand-in."""
    def find_spec(self, name, path, target=None):
        if name == "cuda" or name.startswith("cuda."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None
    def create_module(self, spec):
        if spec.name in sys.modules:
            return sys.modules[spec.name]
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = lambda k: Any_()
        return m
    def exec_module(self, m): pass


drv = types.ModuleType("cuda.bindings.driver")
drv.__getattr__ = lambda k: Any_()
def _mv(d, s, n, *rest):
    ctypes.memmove(d, s, n)
    return (0,)
drv.cuMemcpyDtoDAsync = drv.cuMemcpyDtoHAsync = drv.cuMemcpyHtoD = drv.cuMemcpyDtoH = _mv
drv.cuStreamSynchronize = lambda s: (0,)
drv.cuMemGetInfo = lambda: (0, 1000, 2000)
sys.meta_path.insert(0, Stub())
import cuda.bindings  # noqa: E402 - stand-ins, then the driver the solver really uses
sys.modules["cuda.bindings.driver"] = cuda.bindings.driver = drv


def mod(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


class FillMode(enum.IntEnum):
    LOWER = 0; UPPER = 1; FULL = 2
class Operation(enum.IntEnum):
    N = 0; T = 1; C = 2
class EigMode(enum.IntEnum):
    NOVECTOR = 0; VECTOR = 1
mod("nvmath"); mod("nvmath.bindings")
mod("nvmath.bindings.cublas", FillMode=FillMode, Operation=Operation, create=lambda: 1, destroy=lambda h: None)
mod("nvmath.bindings.cusolver", EigMode=EigMode)
sv = mod("nvmath.bindings.cusolverDn", create=lambda: 7, destroy=lambda h: None, set_stream=lambda h, s: None)
STASH = {}


def vec(ptr, count, dt):
    ct = ctypes.c_float if dt == np.float32 else ctypes.c_double
    return np.ctypeslib.as_array((ct * max(count, 1)).from_address(ptr))[:count]


def cm(ptr, rows, cols, ld, dt):
    """The column-major rows x cols matrix at ptr with leading dimension ld (cuSOLVER's view)."""
    assert ld >= max(rows, 1), (rows, ld)
    return vec(ptr, ld * cols, dt).reshape(cols, ld).T[:rows, :]


def info(ptr, v):
    np.ctypeslib.as_array((ctypes.c_int32 * 1).from_address(ptr))[0] = v


for t, dt in (("s", np.float32), ("d", np.float64)):
    def potrf(h, uplo, n, a, lda, work, lwork, dinfo, dt=dt):
        A = cm(a, n, n, lda, dt)
        S = np.triu(A) + np.triu(A, 1).T if uplo == 1 else np.tril(A) + np.tril(A, -1).T
        try:
            L = np.linalg.cholesky(S.astype(np.float64))
        except np.linalg.LinAlgError:
            return info(dinfo, 2)
        idx = np.triu_indices(n) if uplo == 1 else np.tril_indices(n)
        A[idx] = (L.T if uplo == 1 else L)[idx]   # the other triangle is left as it was
        info(dinfo, 0)
    def getrf(h, m, n, a, lda, work, ipiv, dinfo, dt=dt):
        A = cm(a, m, n, lda, dt)
        STASH[a] = A.astype(np.float64)
        info(dinfo, 3 if np.linalg.matrix_rank(A) < n else 0)
        A[:] = 7.5   # the factors: nothing laneflow may read
    def getrs(h, trans, n, nrhs, a, lda, ipiv, b, ldb, dinfo, dt=dt):
        M = STASH[a]
        B = cm(b, n, nrhs, ldb, dt)
        try:
            B[:] = np.linalg.solve(M.T if trans == 1 else M, B.astype(np.float64))
        except np.linalg.LinAlgError:
            B[:] = np.nan
    def geqrf(h, m, n, a, lda, tau, work, lwork, dinfo, dt=dt):
        A = cm(a, m, n, lda, dt)
        Q, R = np.linalg.qr(A.astype(np.float64), mode="complete")
        A[:] = np.where(np.arange(m)[:, None] <= np.arange(n)[None, :], R, 99.0)  # reflectors below: garbage
        STASH["q", A[:, :min(m, n)].tobytes()] = Q  # found again by the factor's reflector columns
    def orgqr(h, m, n, k, a, lda, tau, work, lwork, dinfo, dt=dt):
        assert n <= m and k <= n, (m, n, k)  # cuSOLVER's contract
        cm(a, m, n, lda, dt)[:] = STASH["q", cm(a, m, k, lda, dt).tobytes()][:, :n]
    def syevd(h, jobz, uplo, n, a, lda, w, work, lwork, dinfo, dt=dt):
        A = cm(a, n, n, lda, dt)
        vals, vecs = np.linalg.eigh(A.astype(np.float64), UPLO="U" if uplo == 1 else "L")
        vec(w, n, dt)[:] = vals
        A[:] = vecs
        info(dinfo, 0)
    def gesvd(h, jobu, jobvt, m, n, a, lda, s, u, ldu, vt, ldvt, work, lwork, rwork, dinfo, dt=dt):
        assert m >= n, "cuSOLVER's gesvd needs m >= n"
        A = cm(a, m, n, lda, dt).astype(np.float64)
        if chr(jobu) == "N":
            S = np.linalg.svd(A, compute_uv=False)
        else:
            U, S, VT = np.linalg.svd(A, full_matrices=chr(jobu) == "A")
            cm(u, m, U.shape[1], ldu, dt)[:] = U
            cm(vt, n, n, ldvt, dt)[:] = VT
        vec(s, min(m, n), dt)[:] = S
        cm(a, m, n, lda, dt)[:] = 3.25
        info(dinfo, 0)
    for name, f in (("potrf", potrf), ("getrf", getrf), ("getrs", getrs), ("geqrf", geqrf), ("orgqr", orgqr),
                    ("syevd", syevd), ("gesvd", gesvd)):
        setattr(sv, t + name, f)
        setattr(sv, t + name + "_buffer_size", lambda *a: 10)

import laneflow.backends.cuda.linalg as S
from laneflow.backends.cpu.linalg import linalg as cpu_linalg
from laneflow.errors import LinAlgError

KEEP = {}


def alloc(n):
    a = np.zeros(max(n, 1) + 64, np.uint8)
    KEEP[a.ctypes.data] = a
    return a.ctypes.data


def view(ptr, dtype, shape):
    n = int(np.prod(shape))
    return vec(ptr, n, dtype).reshape(shape)


def strided(lane, out_ptr, out_dt, in_ptr, in_dt, shape, ist, ost):
    isz = np.dtype(in_dt).itemsize
    for idx in itertools.product(*[range(x) for x in shape]):
        io = sum(i * st for i, st in zip(idx, ist))
        oo = sum(i * st for i, st in zip(idx, ost))
        ctypes.memmove(out_ptr + oo * isz, in_ptr + io * isz, isz)


def tri(lane, ptr, dtype, batch, rows, cols, keep_upper):
    if batch * rows * cols:
        a = view(ptr, dtype, (batch, rows, cols))
        r, c = np.arange(rows)[:, None], np.arange(cols)[None, :]
        a[:, (c < r) if keep_upper else (c > r)] = 0


def eye(lane, ptr, dtype, batch, rows, cols):
    if batch * rows * cols:
        view(ptr, dtype, (batch, rows, cols))[:] = np.eye(rows, cols)


def defer_info(lane, op, what, detail, ptr, count, prim=None):
    # the GPU reports devInfo at the host wait; here the first failure is raised at once
    if count:
        inf = np.ctypeslib.as_array((ctypes.c_int32 * count).from_address(ptr)).copy()
        nz = np.flatnonzero(inf)
        if nz.size:
            raise S._info_error(op, what, detail, int(nz[0]), int(inf[nz[0]]), count)


def defer_finite(lane, op, a):
    # the GPU's scan flags inf or NaN for the host wait; here it is raised at once
    if a.size and not np.isfinite(view(a.ptr, a.dtype, a.shape)).all():
        raise S.non_finite_input(op, a.shape, a.dtype)


S.strided_copy, S._tri_zero, S._eye, S._defer_info, S._defer_finite = strided, tri, eye, defer_info, defer_finite


class Mem:
    capture = None
    free_stream = 0
    def raw_alloc(self, n, stream, op): return alloc(n)
    def raw_free(self, p, stream): KEEP.pop(p, None)


class Ctx:
    memory, matmul, cc = Mem(), object(), (9, 0)
    def ensure_current(self): pass
    def synchronize(self): pass


class Lane:
    def __init__(self, ctx, i): self.ctx, self.stream, self.handle, self.device, self.id, self.closed = ctx, i, i, "gpu:0", i, False


class DA:
    def __init__(self, shape, dtype, data=None):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.size = int(np.prod(self.shape))
        self.nbytes = self.size * self.dtype.itemsize
        self.ptr = alloc(self.nbytes)
        if data is not None:
            ctypes.memmove(self.ptr, np.ascontiguousarray(data, self.dtype).ctypes.data, self.nbytes)
        else:
            ctypes.memset(self.ptr, 0x7F, self.nbytes)  # poison: every element must be written
    def get(self):
        out = np.empty(self.shape, self.dtype)
        ctypes.memmove(out.ctypes.data, self.ptr, self.nbytes)
        return out


class Prim:
    def __init__(self, name, **params): self.name, self.params = name, params


ctx = Ctx()
lanes = [Lane(ctx, i) for i in range(3)]
rng = np.random.default_rng(int(sys.argv[1]))
fails = []


def run(name, ins, specs, **params):
    prim = Prim(name, **params)
    gouts = [DA(s, d) for s, d in specs]
    err_g = err_c = None
    try:
        S.linalg(lanes[rng.integers(3)], prim, [DA(a.shape, a.dtype, a) for a in ins], gouts)
    except LinAlgError as e:
        err_g = e
    couts = [np.empty(s, d) for s, d in specs]
    try:
        cpu_linalg(None, prim, [a.copy() for a in ins], couts)
    except LinAlgError as e:
        err_c = e
    what = f"{name} {params} {[a.shape for a in ins]}"
    if (err_g is None) != (err_c is None) or (
            err_g is not None and not str(err_g).startswith(str(err_c).split(":")[0] + ": " + str(err_c).split(": ")[1])):
        fails.append(f"error mismatch: {what}: {err_g!r} vs {err_c!r}")
        return
    if err_g is not None:
        return
    g = [o.get() for o in gouts]
    tol = 1e-3 if g[0].dtype == np.float32 else 1e-9
    ok = all(x.shape == y.shape for x, y in zip(g, couts))
    if ok and name == "eigh":   # eigenvectors up to sign
        sg = lambda v: v * np.sign(np.take_along_axis(v, np.abs(v).argmax(-2)[..., None, :], -2))
        ok = np.allclose(g[0], couts[0], rtol=tol, atol=tol) and (g[1].size == 0 or
                                                                 np.allclose(sg(g[1]), sg(couts[1]), rtol=tol, atol=tol))
    elif ok and name == "svd" and params["compute_uv"]:   # u, vh are free up to signs and the extra basis
        u, s, vh = g
        k = s.shape[-1]
        a = ins[0]
        eye_of = lambda n, b: np.broadcast_to(np.eye(n), b + (n, n))
        ok = (np.allclose(s, couts[1], rtol=tol, atol=tol)
              and (a.size == 0 or np.allclose((u[..., :k] * s[..., None, :]) @ vh[..., :k, :], a, rtol=tol, atol=10 * tol))
              and np.allclose(np.swapaxes(u, -1, -2) @ u, eye_of(u.shape[-1], u.shape[:-2]), atol=10 * tol)
              and np.allclose(vh @ np.swapaxes(vh, -1, -2), eye_of(vh.shape[-2], vh.shape[:-2]), atol=10 * tol))
    elif ok:
        ok = all(np.allclose(x, y, rtol=tol, atol=tol) for x, y in zip(g, couts))
    if not ok:
        fails.append(f"mismatch: {what}")


def spd(shape, dt):
    a = rng.standard_normal(shape)
    return (a @ np.swapaxes(a, -1, -2) + shape[-1] * np.eye(shape[-1])).astype(dt)


for dt in (np.float32, np.float64):
    for shape in [(4, 4), (3, 5, 5), (2, 3, 6, 6), (1, 1), (0, 3, 3)]:
        n = shape[-1]
        a = spd(shape, dt)
        lo, up = a.copy(), a.copy()
        lo[..., np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] = 1e3    # where lower routines must not look
        up[..., np.tril_indices(n, -1)[0], np.tril_indices(n, -1)[1]] = -1e3
        run("cholesky", [lo], [(shape, dt)], upper=False)
        run("cholesky", [up], [(shape, dt)], upper=True)
        g = (rng.standard_normal(shape) + 3 * n * np.eye(n)).astype(dt)   # not symmetric: A and A^T differ
        run("inv", [g], [(shape, dt)])
        for k in (3, 1):
            run("solve", [g, rng.standard_normal(shape[:-1] + (k,)).astype(dt)], [(shape[:-1] + (k,), dt)])
        run("solve", [g, rng.standard_normal(n).astype(dt)], [(shape[:-1], dt)])
        run("eigh", [lo], [(shape[:-1], dt), (shape, dt)], UPLO="L")
        run("eigh", [up], [(shape[:-1], dt), (shape, dt)], UPLO="U")
    for ash, bsh, osh in [((4, 4), (5, 4, 2), (5, 4, 2)), ((3, 1, 4, 4), (2, 4, 2), (3, 2, 4, 2)),
                          ((3, 4, 4), (4, 2), (3, 4, 2))]:
        g = (rng.standard_normal(ash) + 12 * np.eye(ash[-1])).astype(dt)
        run("solve", [g, rng.standard_normal(bsh).astype(dt)], [(osh, dt)])
    for shape in [(5, 3), (3, 5), (2, 4, 4), (2, 3, 6, 2), (2, 2, 5), (1, 7), (7, 1), (0, 2, 3), (3, 0)]:
        a = rng.standard_normal(shape).astype(dt)
        *bt, m, n = shape
        k, bt = min(m, n), tuple(bt)
        run("qr", [a], [(bt + (m, k), dt), (bt + (k, n), dt)])
        run("qr", [a], [(bt + (m, m), dt), (bt + (m, n), dt)], mode="complete")
        for full in (True, False):
            um, vn = (m, n) if full else (k, k)
            run("svd", [a], [(bt + (m, um), dt), (bt + (k,), dt), (bt + (vn, n), dt)], full_matrices=full,
                compute_uv=True)
        run("svd", [a], [(bt + (k,), dt)], full_matrices=True, compute_uv=False)
bad = spd((3, 4, 4), np.float64)
bad[1] = -np.eye(4)
run("cholesky", [bad], [((3, 4, 4), np.float64)], upper=False)
run("solve", [np.zeros((3, 3)), np.ones(3)], [((3,), np.float64)])
run("inv", [np.array([[1.0, 2.0], [2.0, 4.0]])], [((2, 2), np.float64)])
print("\n".join(fails))
print(f"checked; {len(fails)} failed")
'''


def test_solver_layouts_match_the_cpu_kernel_under_a_numpy_model_of_cusolver(tmp_path, rng):
    """Runs without a GPU: backends/cuda/linalg.py's bookkeeping (transposes, which triangle, leading
    dimensions, batch offsets, broadcasting, devInfo errors) drives numpy stand-ins that follow cuSOLVER's
    column-major contract, and must give what the CPU kernel gives. In a subprocess, because the stand-in
    ``cuda.bindings`` and ``nvmath.bindings`` modules must never meet the real ones."""
    src = os.path.dirname(os.path.dirname(lf.__file__))
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", _MODEL, str(int(rng.integers(2**31)))], capture_output=True,
                       text=True, env=env, timeout=120, cwd=str(tmp_path), check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().endswith("checked; 0 failed"), p.stdout[-3000:]
