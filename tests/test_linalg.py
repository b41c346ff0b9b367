"""lf.linalg against numpy on fresh random matrices, with batches, on every device."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf

TOL = {np.float32: 2e-4, np.float64: 1e-10}
SHAPES = [(4, 4), (3, 5, 5), (2, 3, 6, 6)]


def spd(rng, shape, dtype):
    a = rng.standard_normal(shape)
    n = shape[-1]
    return (a @ np.swapaxes(a, -1, -2) + n * np.eye(n)).astype(dtype)


def close(got, want, dtype):
    np.testing.assert_allclose(np.asarray(got), want, rtol=TOL[dtype], atol=TOL[dtype] * 10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES)
def test_cholesky_matches_numpy(device, rng, dtype, shape):
    a = spd(rng, shape, dtype)
    with lf.stream(device):
        L = lf.linalg.cholesky(lf.array(a))
        U = lf.linalg.cholesky(lf.array(a), upper=True)
    assert L.dtype == dtype and L.shape == shape
    close(L, np.linalg.cholesky(a), dtype)
    close(U, np.linalg.cholesky(a, upper=True), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES)
def test_inv_and_solve_match_numpy(device, rng, dtype, shape):
    a = spd(rng, shape, dtype)
    b = rng.standard_normal(shape[:-1] + (3,)).astype(dtype)
    v = rng.standard_normal(shape[-1]).astype(dtype)
    with lf.stream(device):
        A = lf.array(a)
        x = lf.linalg.solve(A, lf.array(b))
        xv = lf.linalg.solve(lf.array(a[(0,) * (len(shape) - 2)]), lf.array(v))
        ai = lf.linalg.inv(A)
    close(x, np.linalg.solve(a, b), dtype)
    close(xv, np.linalg.solve(a[(0,) * (len(shape) - 2)], v), dtype)
    close(ai, np.linalg.inv(a), dtype)


def test_solve_broadcasts_batch_dimensions(device, rng):
    a = spd(rng, (4, 4), np.float64)
    b = rng.standard_normal((5, 4, 2))
    with lf.stream(device):
        x = lf.linalg.solve(lf.array(a), lf.array(b))
    assert x.shape == (5, 4, 2)
    close(x, np.linalg.solve(np.broadcast_to(a, (5, 4, 4)), b), np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4)])
def test_qr_reconstructs_and_r_is_upper_triangular(device, rng, dtype, shape):
    a = rng.standard_normal(shape).astype(dtype)
    with lf.stream(device):
        q, r = lf.linalg.qr(lf.array(a))
    qn, rn = np.asarray(q), np.asarray(r)
    k = min(shape[-2:])
    assert qn.shape == shape[:-1] + (k,) and rn.shape == shape[:-2] + (k, shape[-1])
    close(qn @ rn, a, dtype)
    np.testing.assert_allclose(np.swapaxes(qn, -1, -2) @ qn, np.broadcast_to(np.eye(k), qn.shape[:-2] + (k, k)),
                               atol=TOL[dtype] * 10)
    assert np.all(np.abs(np.tril(rn, -1)) <= TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_eigh_matches_numpy(device, rng, dtype):
    a = spd(rng, (3, 6, 6), dtype)
    with lf.stream(device):
        w, v = lf.linalg.eigh(lf.array(a))
    wn, vn = np.asarray(w), np.asarray(v)
    close(wn, np.linalg.eigh(a)[0], dtype)
    close(vn @ (wn[..., None] * np.swapaxes(vn, -1, -2)), a, dtype)


@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize("shape", [(6, 4), (4, 6), (2, 5, 5)])
def test_svd_matches_numpy(device, rng, full, shape):
    a = rng.standard_normal(shape)
    with lf.stream(device):
        u, s, vh = lf.linalg.svd(lf.array(a), full_matrices=full)
        s_only = lf.linalg.svd(lf.array(a), compute_uv=False)
    un, sn, vhn = np.linalg.svd(a, full_matrices=full)
    assert u.shape == un.shape and s.shape == sn.shape and vh.shape == vhn.shape
    close(s, sn, np.float64)
    close(s_only, sn, np.float64)
    k = sn.shape[-1]
    close(np.asarray(u)[..., :, :k] * np.asarray(s)[..., None, :] @ np.asarray(vh)[..., :k, :], a, np.float64)


def test_integer_input_computes_in_float64(device):
    with lf.stream(device):
        x = lf.linalg.inv(lf.array([[2, 0], [0, 4]]))
    assert x.dtype == lf.float64 and x.tolist() == [[0.5, 0.0], [0.0, 0.25]]


def test_one_output_of_a_factorization_schedules_all_of_them(device, rng):
    a = rng.standard_normal((4, 4))
    with lf.stream(device):
        A = lf.array(a)
        lf.eval(A)                     # the upload is a command of its own on the GPU
        q, r = lf.linalg.qr(A)
        lf.reset_stats()
        lf.eval(q)
        assert r._data.buffer is not None and lf.stats()["commands"] == 1
    close(np.asarray(q) @ np.asarray(r), a, np.float64)


def test_not_positive_definite_raises_linalg_error_at_eval(device):
    with lf.stream(device):
        L = lf.linalg.cholesky(lf.array(-np.eye(3)))
        with pytest.raises(lf.LinAlgError, match="cholesky"):
            lf.eval(L)
        with pytest.raises(lf.LinAlgError, match="solve"):
            lf.eval(lf.linalg.solve(lf.zeros((3, 3)), lf.ones(3)))
        assert lf.linalg.inv(lf.eye(2) * 2).tolist() == [[0.5, 0.0], [0.0, 0.5]]


@pytest.mark.parametrize("call, exc, pattern", [
    (lambda: lf.linalg.cholesky(lf.ones((2, 3))), ValueError, "cholesky: last two dimensions must be square"),
    (lambda: lf.linalg.inv(lf.ones(3)), ValueError, "inv: expected an array of at least 2 dimensions"),
    (lambda: lf.linalg.solve(lf.eye(3), lf.ones(4)), ValueError, "solve: b must have 3 rows"),
    (lambda: lf.linalg.eigh(lf.eye(3), UPLO="X"), ValueError, "eigh: UPLO"),
    (lambda: lf.linalg.qr(lf.ones((2, 2), lf.float16)), TypeError, "qr: float16 is not supported"),
    (lambda: lf.linalg.svd(lf.ones(3)), ValueError, "svd: expected an array of at least 2"),
])
def test_invalid_linalg_calls_name_the_op(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


@pytest.mark.parametrize("op", ["cholesky", "inv", "solve", "qr", "eigh", "svd"])
def test_a_batch_is_spread_over_lanes_with_the_same_values(device, rng, op, monkeypatch):
    """On a stream with several lanes a batch becomes one command per chunk, on different lanes; each
    matrix goes through the same routine, so the values equal the one-lane result. (On the GPU a batch of
    small matrices is one batched call instead, test_linalg_batched.py: turned off here.)"""
    monkeypatch.setenv("LANEFLOW_LINALG_BATCHED_MAX_N", "0")
    a = rng.standard_normal((6, 16, 16))
    a = a @ np.swapaxes(a, -1, -2) + 16 * np.eye(16)
    b = rng.standard_normal((6, 16, 3))
    fn = {"cholesky": lambda: lf.linalg.cholesky(lf.array(a)), "inv": lambda: lf.linalg.inv(lf.array(a)),
          "solve": lambda: lf.linalg.solve(lf.array(a), lf.array(b)), "qr": lambda: lf.linalg.qr(lf.array(a)),
          "eigh": lambda: lf.linalg.eigh(lf.array(a)), "svd": lambda: lf.linalg.svd(lf.array(a))}[op]

    def call(s):
        with lf.stream(s):
            return fn()
    one, four = lf.new_stream(device, lanes=1), lf.new_stream(device, lanes=4)
    ref = call(one)
    lf.eval(ref)
    lf.reset_stats()
    got = call(four)
    lf.eval(got)
    per_lane = lf.stats()["per_lane"]
    used = [name for name, n in per_lane.items() if f"/s{four.id}." in name and n > 0]
    assert len(used) >= 2, per_lane
    ref, got = (ref, got) if isinstance(ref, tuple) else ((ref,), (got,))
    for r, g in zip(ref, got):
        if device.type == "cpu":
            np.testing.assert_array_equal(np.asarray(g), np.asarray(r))
        else:
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-12, atol=1e-12)
    one.close()
    four.close()


def test_a_split_batch_runs_on_the_stream_given_not_the_current_one(rng):
    a = rng.standard_normal((4, 5, 5))
    a = a @ np.swapaxes(a, -1, -2) + 5 * np.eye(5)
    target, current = lf.new_stream(lf.cpu, lanes=3), lf.new_stream(lf.cpu, lanes=1)
    with lf.stream(current):
        x = lf.array(a, stream=target)
        lf.eval(x)
        lf.reset_stats()
        c = lf.linalg.cholesky(x, stream=target)
        lf.eval(c)
    names = [n for n, k in lf.stats()["per_lane"].items() if k]
    assert names and all(f"/s{target.id}." in n for n in names), names
    np.testing.assert_array_equal(np.asarray(c), np.linalg.cholesky(a))
    target.close()
    current.close()


_NONFINITE_SCRIPT = r"""
import sys, numpy as np, laneflow as lf
dev = lf.gpu if sys.argv[1] == "gpu" else lf.cpu
bad = {"inf": np.diag([np.inf, 1.0, 1.0]), "nan": np.full((3, 3), np.nan)}
for kind in sys.argv[2:]:
    a = bad[kind]
    for op in ("svd", "eigh", "qr", "inv", "solve", "cholesky"):
        x = lf.array(a, device=dev)
        try:
            r = lf.linalg.solve(x, lf.ones((3,), device=dev)) if op == "solve" else getattr(lf.linalg, op)(x)
            lf.eval(*(r if isinstance(r, tuple) else (r,)))
            print(op, kind, "returned")
        except lf.LinAlgError as e:
            assert op in str(e), e
            print(op, kind, "LinAlgError")
    assert float(lf.sum(lf.array(np.ones(4), device=dev))) == 4.0  # still usable
print("done")
"""


@pytest.mark.parametrize("kind", ["inf", "nan"])
def test_svd_and_eigh_of_non_finite_input_raise_and_nothing_hangs(device, tmp_path, kind):
    """OpenBLAS's SVD of diag([inf, 1, 1]) never returns: laneflow checks first. Every routine runs
    on inf and NaN in a subprocess with a timeout, so a hang fails here instead of freezing CI."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _NONFINITE_SCRIPT, device.type, kind], capture_output=True, text=True,
                       timeout=120, cwd=str(tmp_path))
    assert r.returncode == 0 and "done" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    for op in ("svd", "eigh"):  # on every backend (the GPU's check is a scan read at the host wait)
        assert f"{op} {kind} LinAlgError" in r.stdout, r.stdout


@pytest.mark.parametrize("shape", [(7, 3), (2, 5, 2), (4, 4), (3, 6), (3, 0)])
def test_complete_qr_gives_a_square_orthonormal_q_and_an_m_row_r(device, rng, shape):
    """``mode="complete"``: Q (..., M, M) orthonormal, R (..., M, N) upper triangular, Q @ R = A; its first
    min(M, N) columns span what the reduced Q spans (numpy's shapes; signs are the library's)."""
    an = rng.standard_normal(shape)
    *bt, m, n = shape
    with lf.stream(device):
        q, r = lf.linalg.qr(lf.array(an), mode="complete")
        qn, rn = np.asarray(q), np.asarray(r)
    assert qn.shape == tuple(bt) + (m, m) and rn.shape == tuple(bt) + (m, n)
    eye = np.broadcast_to(np.eye(m), qn.shape)
    np.testing.assert_allclose(np.swapaxes(qn, -1, -2) @ qn, eye, atol=1e-10)
    np.testing.assert_allclose(qn @ rn, an, atol=1e-10)
    np.testing.assert_array_equal(np.tril(rn, -1), 0.0)
    with pytest.raises(ValueError, match="qr: mode must be"):
        lf.linalg.qr(lf.array(an), mode="r")
