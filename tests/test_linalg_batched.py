"""Batched small-matrix linear algebra (backends/cuda/linalg_batched.py): a batch of small matrices is one
batched library call (potrfBatched, getrfBatched + getrsBatched, matinvBatched, syevjBatched,
gesvdjBatched) instead of a loop. On every device: results against numpy, eager and compiled, and one
failing matrix in a batch raising for that value only, named alike on the CPU and the GPU. Everywhere,
without a GPU: the fake driver counts library calls (one batched call below the crossover, the loop above
it, the loop with LANEFLOW_LINALG_BATCHED_MAX_N=0), checks the pointer arrays each call gets and which
compiled functions become CUDA graphs; and the numpy model of cuSOLVER/cuBLAS (test_cuda_solver.py) runs
the batched layouts against the CPU kernel."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import run_under_fake_driver
from test_cuda_solver import _MODEL

import laneflow as lf

TOL = {np.float32: 2e-3, np.float64: 1e-9}
BATCH = 12


def spd(rng, shape, dtype):
    a = rng.standard_normal(shape)
    n = shape[-1]
    return (a @ np.swapaxes(a, -1, -2) + n * np.eye(n)).astype(dtype)


def close(got, want, dtype):
    scale = max(1.0, float(np.max(np.abs(want))))
    np.testing.assert_allclose(np.asarray(got), want, rtol=TOL[dtype], atol=TOL[dtype] * scale)


def _ops(a, g, b):
    """Every batched op on spd batch ``a`` and general batch ``g`` (right-hand sides ``b``)."""
    w, v = lf.linalg.eigh(a)
    u, s, vh = lf.linalg.svd(g, full_matrices=False)
    return (lf.linalg.cholesky(a), lf.linalg.solve(g, b), lf.linalg.solve(g, b[..., 0:1]), lf.linalg.inv(g),
            w, v, u, s, vh, lf.linalg.svd(g, compute_uv=False))


def _check(outs, a, g, b, dtype):
    L, X, x1, I, w, v, u, s, vh, s_only = (np.asarray(o) for o in outs)
    close(L, np.linalg.cholesky(a), dtype)
    close(X, np.linalg.solve(g, b), dtype)
    close(x1, np.linalg.solve(g, b[..., 0:1]), dtype)
    close(I, np.linalg.inv(g), dtype)
    close(w, np.linalg.eigh(a)[0], dtype)
    close(v @ (w[..., None] * np.swapaxes(v, -1, -2)), a, dtype)
    close(s, np.linalg.svd(g, compute_uv=False), dtype)
    close(s_only, np.linalg.svd(g, compute_uv=False), dtype)
    close((u * s[..., None, :]) @ vh, g, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [4, 16, 32])
def test_batched_factorizations_match_numpy_eager_and_compiled(device, rng, dtype, n):
    a = spd(rng, (BATCH, n, n), dtype)
    g = (rng.standard_normal((BATCH, n, n)) + 2 * np.sqrt(n) * np.eye(n)).astype(dtype)  # not symmetric
    b = rng.standard_normal((BATCH, n, 3)).astype(dtype)
    s = lf.new_stream(device, lanes=4)
    with lf.stream(s):
        A, G, Bm = lf.array(a), lf.array(g), lf.array(b)
        _check(_ops(A, G, Bm), a, g, b, dtype)
        f = lf.compile(_ops)
        for _ in range(3):  # trace, then replay (a CUDA graph on the GPU where the routines capture)
            _check(f(A, G, Bm), a, g, b, dtype)
        np.testing.assert_array_equal(np.asarray(G), g)  # matinvBatched reads the input in place: unchanged
    s.close()


@pytest.mark.parametrize("op, bad, what", [
    ("cholesky", "not_pd", "Matrix is not positive definite"),
    ("inv", "singular", "Singular matrix"),
    ("solve", "singular", "Singular matrix"),
])
def test_one_failing_matrix_raises_for_that_value_only_and_names_it(device, rng, op, bad, what):
    n = 8
    a = spd(rng, (6, n, n), np.float64)
    a[3] = -np.eye(n) if bad == "not_pd" else np.ones((n, n))
    good = spd(rng, (6, n, n), np.float64)
    b = rng.standard_normal((6, n, 2))
    fn = {"cholesky": lf.linalg.cholesky, "inv": lf.linalg.inv,
          "solve": lambda x: lf.linalg.solve(x, lf.array(b))}[op]
    with lf.stream(device):
        failing, fine = fn(lf.array(a)), fn(lf.array(good))
        later = failing * 2.0
        lf.async_eval(failing, fine, later)
        with pytest.raises(lf.LinAlgError, match=rf"{op}: {what} \(matrix 3 of the batch\)"):
            lf.eval(failing)
        with pytest.raises(lf.LinAlgError, match=op):
            lf.eval(later)
        want = {"cholesky": np.linalg.cholesky, "inv": np.linalg.inv, "solve": lambda x: np.linalg.solve(x, b)}[op]
        close(fine, want(good), np.float64)  # the other batch, evaluated alongside, is unaffected


def test_cpu_and_gpu_name_the_same_failing_matrix_of_a_split_batch(rng):
    """The CPU splits a batch over its lanes: the failing matrix keeps its index in the whole batch."""
    a = spd(rng, (8, 5, 5), np.float64)
    a[6] = -np.eye(5)
    s = lf.new_stream(lf.cpu, lanes=4)
    with pytest.raises(lf.LinAlgError, match=r"\(matrix 6 of the batch\)"):
        lf.eval(lf.linalg.cholesky(lf.array(a, stream=s), stream=s))
    s.close()


# -- without a GPU: the fake driver ----------------------------------------------------------------

_FAKE = r'''
import os, sys
sys.path.insert(0, sys.argv[1])
import fake_cuda
fake_cuda.install()
import numpy as np
import laneflow as lf
from laneflow.backends.cuda import linalg_batched as LB
calls = fake_cuda.LIBRARY_CALLS
made = []
real_pointers = LB.strided_pointers
def recording(lane, dst, arrays, count):
    made.append((dst, list(arrays), count))
    return real_pointers(lane, dst, arrays, count)
LB.strided_pointers = recording

s = lf.new_stream(lf.gpu, lanes=4)
rng = np.random.default_rng(0)

def names(fn, *args):
    calls.clear(); made.clear()
    r = fn(*args)
    lf.eval(*(r if isinstance(r, tuple) else (r,)))
    return [c[0] for c in calls if not c[0].startswith(("set_", "create", "destroy"))], r

with lf.stream(s):
    for B, n, batched in ((6, 8, True), (6, 136, False)):  # BATCHED_MAX_N is 128
        A = lf.array(rng.standard_normal((B, n, n)).astype(np.float32))
        Bm = lf.array(rng.standard_normal((B, n, 2)).astype(np.float32))
        lf.eval(A, Bm)
        lf.reset_stats()
        got, L = names(lf.linalg.cholesky, A)
        assert lf.stats()["commands"] >= 1
        if batched:  # one potrfBatched for the whole batch, not a loop and not split over the 4 lanes
            assert got == ["spotrf_batched"], got
            (dst, arrays, count), = made
            assert arrays == [(L._data.buffer.data.ptr, n * n * 4)] and count == B, (arrays, L._data.buffer.data.ptr)
            call = next(c for c in calls if c[0] == "spotrf_batched")
            assert call[1][3] == dst and call[1][4] == n and call[1][6] == B, call   # aarray, lda, batch
        else:
            assert got.count("spotrf") == B and not any("batched" in g for g in got), got
        got, X = names(lf.linalg.solve, A, Bm)
        if batched:
            assert got == ["sgetrf_batched", "sgetrs_batched"], got
            (dst, arrays, count), = made
            assert count == B and [st for _, st in arrays] == [n * n * 4, n * 2 * 4], arrays
            a_arr, x_arr = dst, dst + 8 * B
            rf = next(c for c in calls if c[0] == "sgetrf_batched")[1]
            rs = next(c for c in calls if c[0] == "sgetrs_batched")[1]
            assert rf[2] == a_arr and rf[6] == B and rs[4] == a_arr and rs[7] == x_arr and rs[10] == B, (rf, rs)
            assert rs[1] == 1 and rs[3] == 2 and rs[6] == rf[4], rs   # op T (the buffer is A^T), 2 rhs, same pivots
        else:
            assert got.count("sgetrf") == B and got.count("sgetrs") == B, got
        got, I = names(lf.linalg.inv, A)
        if batched:
            assert got == ["smatinv_batched"], got
            (dst, arrays, count), = made
            assert arrays == [(A._data.buffer.data.ptr, n * n * 4), (I._data.buffer.data.ptr, n * n * 4)], arrays
        got, _ = names(lf.linalg.eigh, A)
        assert (got[-1:] == ["ssyevj_batched"]) if batched else got.count("ssyevd") == B, got
        got, _ = names(lf.linalg.svd, A)
        assert (got[-1:] == ["sgesvdj_batched"]) if batched else got.count("sgesvd") == B, got
        got, _ = names(lf.linalg.qr, A)      # no batched routine forms Q: always the loop
        assert got.count("sgeqrf") == B, got

    # inv above matinvBatched's n <= 32: getrfBatched + getriBatched; eigh above syevjBatched's: the loop
    A = lf.array(rng.standard_normal((4, 40, 40)).astype(np.float64))
    assert names(lf.linalg.inv, A)[0] == ["dgetrf_batched", "dgetri_batched"]
    assert names(lf.linalg.eigh, A)[0].count("dsyevd") == 4
    # a broadcast a (one matrix for several right-hand sides) keeps the loop
    got, _ = names(lf.linalg.solve, lf.array(np.eye(8, dtype=np.float32)), lf.array(np.ones((5, 8, 2), np.float32)))
    assert "sgetrf_batched" not in got, got
    # the environment override: 0 turns the batched path off
    os.environ["LANEFLOW_LINALG_BATCHED_MAX_N"] = "0"
    A = lf.array(rng.standard_normal((6, 8, 8)).astype(np.float32))
    assert names(lf.linalg.cholesky, A)[0].count("spotrf") == 6
    os.environ["LANEFLOW_LINALG_BATCHED_MAX_N"] = "64"

    # graphs: cholesky/solve/inv capture on the batched path; eigh follows BATCHED_CAPTURES
    A = lf.array(rng.standard_normal((6, 8, 8)).astype(np.float32))
    lf.eval(A)
    def mode(fn):
        f = lf.compile(fn)
        for _ in range(3):
            lf.eval(f(A))
        return f.stats()[0]["mode"]
    assert mode(lambda a: lf.linalg.cholesky(a) + lf.linalg.inv(a)) == "cuda graph"
    assert mode(lambda a: lf.linalg.eigh(a)[0]) == "cuda graph"  # syevjBatched captures (measured)
    assert mode(lambda a: lf.linalg.svd(a)[1]) == "cuda graph"   # gesvdjBatched too
    LB.BATCHED_CAPTURES["eigh"] = False
    assert mode(lambda a: lf.linalg.eigh(a)[0] * 2.0) == "commands"
    LB.BATCHED_CAPTURES["eigh"] = True
    os.environ["LANEFLOW_LINALG_BATCHED_MAX_N"] = "0"   # the loop's syevd never captures, whatever was measured
    assert mode(lambda a: lf.linalg.eigh(a)[0] * 3.0) == "commands"
print("ok")
'''


def test_fake_driver_one_batched_call_below_the_crossover_the_loop_above_and_pointer_arrays(tmp_path):
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed (pip install -e '.[dev]')")
    r = run_under_fake_driver(_FAKE, tmp_path, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-3000:] + r.stderr[-3000:]


# -- without a GPU: the numpy model of the libraries ------------------------------------------------

_BATCHED_STANDINS = r'''
cb = mod("nvmath.bindings.cublas", FillMode=FillMode, Operation=Operation, create=lambda: 1, destroy=lambda h: None,
         set_stream=lambda h, s: None, set_workspace=lambda h, p, n: None)
sys.modules["nvmath.bindings"].cublas = cb
sv.create_syevj_info = sv.create_gesvdj_info = lambda: 11
BATCHED = []


def ptrs(arr, count):
    return [int(p) for p in np.ctypeslib.as_array((ctypes.c_uint64 * count).from_address(arr))]


for t, dt in (("s", np.float32), ("d", np.float64)):
    isz = np.dtype(dt).itemsize
    def potrf_batched(h, uplo, n, aarray, lda, infos, batch, t=t):
        BATCHED.append("potrfBatched")
        for i, p in enumerate(ptrs(aarray, batch)):
            getattr(sv, t + "potrf")(h, uplo, n, p, lda, 0, 0, infos + 4 * i)
            A = cm(p, n, n, lda, dt)
            A[np.tril_indices(n, -1) if uplo == 1 else np.triu_indices(n, 1)] = 5.5   # its workspace
    def getrf_batched(h, n, aarray, lda, ipiv, infos, batch, t=t):
        BATCHED.append("getrfBatched")
        for i, p in enumerate(ptrs(aarray, batch)):
            getattr(sv, t + "getrf")(h, n, n, p, lda, 0, ipiv + 4 * n * i, infos + 4 * i)
    def getrs_batched(h, trans, n, nrhs, aarray, lda, ipiv, barray, ldb, host_info, batch, t=t):
        BATCHED.append("getrsBatched")
        for pa, pb in zip(ptrs(aarray, batch), ptrs(barray, batch)):
            getattr(sv, t + "getrs")(h, trans, n, nrhs, pa, lda, 0, pb, ldb, 0)
        info(host_info, 0)
    def matinv_batched(h, n, aarray, lda, carray, ldc, infos, batch, dt=dt):
        BATCHED.append("matinvBatched")
        for i, (pa, pc) in enumerate(zip(ptrs(aarray, batch), ptrs(carray, batch))):
            A = cm(pa, n, n, lda, dt).astype(np.float64)
            singular = np.linalg.matrix_rank(A) < n
            info(infos + 4 * i, 1 if singular else 0)
            cm(pc, n, n, ldc, dt)[:] = np.nan if singular else np.linalg.inv(A)
    def getri_batched(h, n, aarray, lda, ipiv, carray, ldc, infos, batch, dt=dt):
        BATCHED.append("getriBatched")
        for i, (pa, pc) in enumerate(zip(ptrs(aarray, batch), ptrs(carray, batch))):
            M = STASH[pa]
            cm(pc, n, n, ldc, dt)[:] = np.nan if np.linalg.matrix_rank(M) < n else np.linalg.inv(M)
            info(infos + 4 * i, 0)
    def syevj_batched(h, jobz, uplo, n, a, lda, w, work, lwork, infos, params, batch, t=t, isz=isz):
        BATCHED.append("syevjBatched")
        assert n <= 32 and params == 11
        for i in range(batch):
            getattr(sv, t + "syevd")(h, jobz, uplo, n, a + i * lda * n * isz, lda, w + i * n * isz, 0, 0, infos + 4 * i)
    def gesvdj_batched(h, jobz, m, n, a, lda, s, u, ldu, v, ldv, work, lwork, infos, params, batch, dt=dt, isz=isz):
        BATCHED.append("gesvdjBatched")
        assert m <= 32 and n <= 32 and params == 11
        for i in range(batch):
            A = cm(a + i * lda * n * isz, m, n, lda, dt)
            U, S, VT = np.linalg.svd(A.astype(np.float64), full_matrices=True)
            vec(s + i * min(m, n) * isz, min(m, n), dt)[:] = S
            if jobz == 1:
                cm(u + i * ldu * m * isz, m, m, ldu, dt)[:] = U
                cm(v + i * ldv * n * isz, n, n, ldv, dt)[:] = VT.T    # V, not V^T
            A[:] = 2.5
            info(infos + 4 * i, 0)
    for name, f in (("potrf_batched", potrf_batched), ("syevj_batched", syevj_batched),
                    ("gesvdj_batched", gesvdj_batched)):
        setattr(sv, t + name, f)
        setattr(sv, t + name + "_buffer_size", lambda *a: 10)
    for name, f in (("getrf_batched", getrf_batched), ("getrs_batched", getrs_batched),
                    ("matinv_batched", matinv_batched), ("getri_batched", getri_batched)):
        setattr(cb, t + name, f)

import laneflow.backends.cuda.linalg_batched as LB
from laneflow.backends.cuda.kernels.pointers import pointer_words


def host_pointers(lane, dst, arrays, count):
    words = pointer_words(arrays, count)
    ctypes.memmove(dst, words.ctypes.data, words.nbytes)
    return [dst + 8 * count * j for j in range(len(arrays))]


LB.strided_pointers = host_pointers
'''

_BATCHED_CASES = r'''
for dt in (np.float32, np.float64):
    a = spd((5, 6, 6), dt)
    a[2] = -np.eye(6)
    run("cholesky", [a], [((5, 6, 6), dt)], upper=False)
    g = (rng.standard_normal((2, 3, 40, 40)) + 40 * np.eye(40)).astype(dt)   # inv through getrf + getri
    run("inv", [g], [((2, 3, 40, 40), dt)])
    s = (rng.standard_normal((4, 5, 5)) + 5 * np.eye(5)).astype(dt)
    s[1] = 1.0
    for op in ("inv", "solve"):
        ins = [s] + ([rng.standard_normal((4, 5, 2)).astype(dt)] if op == "solve" else [])
        run(op, ins, [((4, 5, 5) if op == "inv" else (4, 5, 2), dt)])
print("batched calls:", len(BATCHED))
'''


@pytest.mark.parametrize("max_n", ["64", "0"])
def test_batched_layouts_match_the_cpu_kernel_under_a_numpy_model_of_the_libraries(tmp_path, rng, max_n):
    """test_cuda_solver.py's model of cuSOLVER's column-major contract, with the batched routines added
    (they read the pointer arrays from memory): every case of that model, plus failing matrices inside
    batches, through the batched path (max_n 64) and the loop (0), must give the CPU kernel's results."""
    marker = "\nfor dt in (np.float32, np.float64):\n    for shape in [(4, 4)"
    head, tail = _MODEL.split(marker)
    tail = tail.replace('print("\\n".join(fails))', _BATCHED_CASES + 'print("\\n".join(fails))')
    script = (head + _BATCHED_STANDINS + marker + tail).replace("S.linalg(lanes", "LB.linalg(lanes")
    src = os.path.dirname(os.path.dirname(lf.__file__))
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""),
               LANEFLOW_LINALG_BATCHED_MAX_N=max_n)
    p = subprocess.run([sys.executable, "-c", script, str(int(rng.integers(2**31)))], capture_output=True,
                       text=True, env=env, timeout=300, cwd=str(tmp_path), check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().endswith("checked; 0 failed"), p.stdout[-3000:]
    used = int(p.stdout.split("batched calls:")[1].split()[0])
    assert (used > 20) if max_n != "0" else used == 0, p.stdout[-500:]
