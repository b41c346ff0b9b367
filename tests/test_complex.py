"""complex64 and complex128 end to end, against numpy on random inputs: elementwise ops, promotion,
reductions, matmul, vecdot, linalg, casts, the array API's dtype functions, interop, and the ops the
standard leaves undefined for complex values (refused with TypeError naming the op)."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf

COMPLEX = ["complex64", "complex128"]


def _tol(dtype) -> dict:
    return {"rtol": 2e-5, "atol": 2e-5} if np.dtype(dtype) == np.complex64 else {"rtol": 1e-12, "atol": 1e-12}


def _random(rng, shape, dtype, scale: float = 2.0):
    return (rng.uniform(-scale, scale, shape) + 1j * rng.uniform(-scale, scale, shape)).astype(dtype)


def _assert_close(got, want, dtype, **kw):
    got = np.asarray(got)
    assert got.dtype == np.asarray(want).dtype, (got.dtype, np.asarray(want).dtype)
    np.testing.assert_allclose(got, want, **{**_tol(dtype), **kw})


UNARY = ["negative", "positive", "square", "reciprocal", "sqrt", "exp", "expm1", "log", "log1p", "log2", "log10",
         "sin", "cos", "tan", "sinh", "cosh", "tanh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "sign"]
_NUMPY = {"asin": "arcsin", "acos": "arccos", "atan": "arctan", "asinh": "arcsinh", "acosh": "arccosh",
          "atanh": "arctanh"}


@pytest.mark.parametrize("dtype", COMPLEX)
@pytest.mark.parametrize("fn", UNARY)
def test_unary_complex_ops_match_numpy(device, rng, fn, dtype):
    x = _random(rng, (5, 7), dtype)
    got = getattr(lf, fn)(lf.array(x, device=device))
    assert got.dtype == np.dtype(dtype)
    with np.errstate(all="ignore"):
        want = getattr(np, _NUMPY.get(fn, fn))(x)
    _assert_close(got, want, dtype, rtol=1e-4 if dtype == "complex64" else 1e-10)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_abs_real_imag_conj_give_the_parts(device, rng, dtype):
    x = _random(rng, (4, 6), dtype)
    a = lf.array(x, device=device)
    real = np.float32 if dtype == "complex64" else np.float64
    for got, want in ((lf.abs(a), np.abs(x)), (lf.real(a), x.real), (lf.imag(a), x.imag), (lf.conj(a), np.conj(x))):
        _assert_close(got, want, dtype)
    assert lf.abs(a).dtype == real and lf.real(a).dtype == real and lf.imag(a).dtype == real


@pytest.mark.parametrize("dtype", COMPLEX)
@pytest.mark.parametrize("op", ["add", "subtract", "multiply", "divide", "power", "equal", "not_equal"])
def test_binary_complex_ops_match_numpy(device, rng, op, dtype):
    x, y = _random(rng, (3, 5), dtype), _random(rng, (5,), dtype)  # y broadcasts over x's rows
    y[0] = x[0, 0]  # one equal pair
    got = getattr(lf, op)(lf.array(x, device=device), lf.array(y, device=device))
    with np.errstate(all="ignore"):
        want = getattr(np, op)(x, y)
    if want.dtype == np.bool_:
        np.testing.assert_array_equal(np.asarray(got), want)
    else:
        _assert_close(got, want, dtype, rtol=1e-4 if dtype == "complex64" else 1e-10)


def test_promotion_follows_the_standard_with_weak_python_complex(device, rng):
    f32 = lf.array(rng.uniform(-1, 1, 4).astype(np.float32), device=device)
    f64 = lf.array(rng.uniform(-1, 1, 4), device=device)
    c64 = lf.array(_random(rng, 4, np.complex64), device=device)
    assert (f32 + c64).dtype == lf.complex64
    assert (f64 + c64).dtype == lf.complex128
    assert (f32 + 1j).dtype == lf.complex64           # a Python complex is weak (NEP 50)
    assert (c64 * 2.5).dtype == lf.complex64
    assert lf.result_type(lf.float64, lf.complex64) == lf.complex128
    got = f32 * (0.5 - 2j)
    want = np.asarray(f32) * np.complex64(0.5 - 2j)
    _assert_close(got, want, "complex64")


@pytest.mark.parametrize("dtype", COMPLEX)
def test_sum_prod_mean_and_cumulative_sum_of_complex(device, rng, dtype):
    x = _random(rng, (6, 33), dtype, scale=1.0)
    a = lf.array(x, device=device)
    for axis in (None, 0, 1, (0, 1)):
        _assert_close(lf.sum(a, axis=axis), np.sum(x, axis=axis), dtype, rtol=1e-4 if dtype == "complex64" else 1e-10)
        _assert_close(lf.mean(a, axis=axis), np.mean(x, axis=axis), dtype, rtol=1e-4 if dtype == "complex64" else 1e-10)
    _assert_close(lf.prod(a[:, :5], axis=1), np.prod(x[:, :5], axis=1), dtype, rtol=1e-4 if dtype == "complex64" else 1e-10)
    _assert_close(lf.cumulative_sum(a, axis=1), np.cumsum(x, axis=1), dtype, rtol=1e-4 if dtype == "complex64" else 1e-10)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_complex_matmul_and_vecdot_conjugating_its_first_argument(device, rng, dtype):
    a, b = _random(rng, (2, 5, 7), dtype), _random(rng, (7, 3), dtype)
    _assert_close(lf.array(a, device=device) @ lf.array(b, device=device), a @ b, dtype, rtol=1e-4 if dtype == "complex64" else 1e-10)
    u, v = _random(rng, (4, 9), dtype), _random(rng, (4, 9), dtype)
    got = lf.vecdot(lf.array(u, device=device), lf.array(v, device=device))
    _assert_close(got, np.sum(np.conj(u) * v, axis=-1), dtype, rtol=1e-4 if dtype == "complex64" else 1e-10)
    assert not np.allclose(np.asarray(got), np.sum(u * v, axis=-1))  # the conjugate matters


@pytest.mark.parametrize("dtype", COMPLEX)
def test_complex_slogdet_and_det(device, rng, dtype):
    x = _random(rng, (3, 4, 4), dtype)
    sign, logabs = lf.linalg.slogdet(lf.array(x, device=device))
    ws, wl = np.linalg.slogdet(x)
    assert np.asarray(logabs).dtype == wl.dtype
    _assert_close(sign, ws, dtype, rtol=1e-4 if dtype == "complex64" else 1e-9)
    np.testing.assert_allclose(np.asarray(logabs), wl, rtol=1e-4 if dtype == "complex64" else 1e-9)
    _assert_close(lf.linalg.det(lf.array(x, device=device)), np.linalg.det(x), dtype,
                  rtol=1e-4 if dtype == "complex64" else 1e-9)


def _hermitian_pd(rng, n, dtype):
    m = _random(rng, (n, n), dtype)
    return (m @ np.conj(m.T) + n * np.eye(n)).astype(dtype)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_complex_linalg_matches_numpy(device, rng, dtype):
    a = _hermitian_pd(rng, 5, dtype)
    b = _random(rng, (5, 2), dtype)
    x = lf.array(a, device=device)
    tol = {"rtol": 1e-3, "atol": 1e-4} if dtype == "complex64" else {"rtol": 1e-9, "atol": 1e-10}
    _assert_close(lf.linalg.cholesky(x), np.linalg.cholesky(a), dtype, **tol)
    _assert_close(lf.linalg.solve(x, lf.array(b, device=device)), np.linalg.solve(a, b), dtype, **tol)
    _assert_close(lf.linalg.inv(x), np.linalg.inv(a), dtype, **tol)
    w = lf.linalg.eigvalsh(x)
    assert w.dtype == (lf.float32 if dtype == "complex64" else lf.float64)
    np.testing.assert_allclose(np.asarray(w), np.linalg.eigvalsh(a), **tol)
    s = lf.linalg.svdvals(x)
    np.testing.assert_allclose(np.asarray(s), np.linalg.svd(a, compute_uv=False), **tol)
    q, r = lf.linalg.qr(x)
    _assert_close(np.asarray(q) @ np.asarray(r), a, dtype, **tol)
    _assert_close(np.triu(np.asarray(r)), np.asarray(r), dtype)
    w, v = lf.linalg.eigh(x)
    v = np.asarray(v)
    _assert_close(a @ v, v * np.asarray(w)[None, :], dtype, **tol)  # A v = v diag(w): complex vectors
    _assert_close(lf.linalg.pinv(x), np.linalg.pinv(a), dtype, **tol)
    for m in (_random(rng, (3, 6), dtype), _random(rng, (6, 3), dtype)):  # wide and tall
        u, s, vh = lf.linalg.svd(lf.array(m, device=device), full_matrices=False)
        _assert_close(np.asarray(u) * np.asarray(s)[None, :] @ np.asarray(vh), m, dtype, **tol)


@pytest.mark.parametrize("make", [
    lambda a: lf.max(a), lambda a: lf.min(a, axis=0), lambda a: lf.argmax(a), lambda a: lf.argmin(a),
    lambda a: lf.sort(a), lambda a: lf.argsort(a), lambda a: lf.maximum(a, a), lambda a: lf.less(a, a),
    lambda a: a > 0, lambda a: lf.floor(a), lambda a: lf.clip(a, 0, 1), lambda a: lf.var(a),
    lambda a: lf.softmax(a), lambda a: lf.logsumexp(a), lambda a: lf.searchsorted(a, a), lambda a: lf.erf(a),
    lambda a: lf.nn.gelu(a), lambda a: lf.maximum(lf.real(a), 1j),
], ids=["max", "min", "argmax", "argmin", "sort", "argsort", "maximum", "less", "greater", "floor", "clip", "var",
        "softmax", "logsumexp", "searchsorted", "erf", "gelu", "maximum-python-complex"])
def test_ops_the_standard_leaves_undefined_for_complex_raise_type_error(device, make):
    a = lf.array(np.array([1 + 2j, 3 - 1j], np.complex64), device=device)
    with pytest.raises(TypeError, match=r"complex"):
        make(a)


def test_astype_converts_real_to_complex_and_refuses_complex_to_real(device, rng):
    f = rng.uniform(-3, 3, 5).astype(np.float32)
    c = lf.astype(lf.array(f, device=device), lf.complex128)
    assert c.dtype == lf.complex128
    np.testing.assert_array_equal(np.asarray(c), f.astype(np.complex128))
    with pytest.raises(TypeError, match=r"astype: a complex array .* lf\.real\(x\)"):
        lf.astype(c, lf.float64)
    np.testing.assert_array_equal(np.asarray(lf.astype(c, lf.bool)), f != 0)  # nonzero is True
    np.testing.assert_array_equal(np.asarray(lf.astype(c, lf.complex64)), f.astype(np.complex64))


def test_dtype_functions_know_the_complex_dtypes():
    assert lf.isdtype(lf.complex64, "complex floating") and lf.isdtype(lf.complex128, "numeric")
    assert not lf.isdtype(lf.complex64, "real floating")
    assert lf.finfo(lf.complex64).dtype == lf.float32 and lf.finfo(lf.complex64).eps == np.finfo(np.float32).eps
    assert lf.finfo(lf.complex128).bits == 64
    assert lf.can_cast(lf.float32, lf.complex64) and not lf.can_cast(lf.float64, lf.complex64)
    assert not lf.can_cast(lf.complex64, lf.float64)
    info = lf.__array_namespace_info__()
    assert info.dtypes(kind="complex floating") == {"complex64": lf.complex64, "complex128": lf.complex128}
    assert info.default_dtypes()["complex floating"] == lf.complex128
    assert lf.dtype(complex) == lf.complex128 and lf.dtype("complex64") == lf.complex64


def test_numpy_and_dlpack_interop_keep_complex_values(device, rng):
    x = _random(rng, (3, 4), np.complex64)
    a = lf.array(x, device=device)
    np.testing.assert_array_equal(np.asarray(a), x)
    assert np.asarray(a).dtype == np.complex64
    back = lf.from_dlpack(lf.array(x, device=device) * 1)  # laneflow -> laneflow
    np.testing.assert_array_equal(np.asarray(back), x)
    if device.type == "cpu":
        np.testing.assert_array_equal(np.from_dlpack(a), x)
        y = lf.from_dlpack(x.astype(np.complex128))  # numpy -> laneflow
        assert y.dtype == lf.complex128
        np.testing.assert_array_equal(np.asarray(y), x.astype(np.complex128))


def test_linspace_with_complex_bounds_or_dtype(device):
    np.testing.assert_allclose(np.asarray(lf.linspace(0, 2, 5, dtype=lf.complex64, device=device)),
                               np.linspace(0, 2, 5).astype(np.complex64))
    if device.type == "gpu":  # complex bounds: no CUDA kernel, refused by name
        with pytest.raises(lf.LaneflowError, match=r"linspace: .*complex bounds"):
            lf.eval(lf.linspace(0, 1 + 2j, 5, device=device))
        return
    z = lf.linspace(1j, 1 + 2j, 5, endpoint=False, device=device)
    assert z.dtype == lf.complex128
    np.testing.assert_allclose(np.asarray(z), np.linspace(1j, 1 + 2j, 5, endpoint=False))


def test_complex_fills_and_setitem(device):
    z = lf.full((2, 3), 1 - 2j, device=device)
    assert z.dtype == lf.complex128
    z[0, 1] = 3j
    want = np.full((2, 3), 1 - 2j)
    want[0, 1] = 3j
    np.testing.assert_array_equal(np.asarray(z), want)
    with pytest.raises(TypeError, match=r"setitem: cannot store"):
        r = lf.zeros(3, dtype=lf.float32, device=device)
        r[0] = 1j


def test_compiled_complex_function_matches_numpy(device, rng):
    """lf.compile with complex arrays, a complex 0-d argument that changes per call and a Python complex."""
    f = lf.compile(lambda a, s: (lf.exp(a * (1 - 1j)) @ lf.conj(a.T)) * s + lf.sum(a, axis=1, keepdims=True))
    x = _random(rng, (4, 4), np.complex64, scale=1.0)
    a = lf.array(x, device=device)
    for s in (0.5 + 1j, -2j, 3.0 + 0j):
        want = (np.exp(x * np.complex64(1 - 1j)) @ np.conj(x.T)) * np.complex64(s) + x.sum(axis=1, keepdims=True)
        _assert_close(f(a, lf.array(np.complex64(s), device=device)), want, "complex64", rtol=1e-4, atol=1e-4)


def _bits(z):
    z = np.asarray(z)
    return [(float(v.real), bool(np.signbit(v.real)), float(v.imag), bool(np.signbit(v.imag))) for v in z.ravel()]


@pytest.mark.parametrize("dtype", COMPLEX)
def test_the_standards_special_cases_numpy_misses_for_tanh_and_expm1(device, dtype):
    """tanh(+-inf + iy), y finite: +-1 + 0j with the zero signed as y (numpy signs it by sin(2y));
    expm1 at infinities and NaN: the cases of exp, less one (numpy gives NaN)."""
    inf, nan = np.inf, np.nan
    z = np.array([complex(inf, 2.0), complex(-inf, -2.0), complex(inf, -0.5), complex(-inf, 3.0)], dtype)
    got = lf.tanh(lf.array(z, device=device))
    want = np.array([complex(1, 0), complex(-1, -0.0), complex(1, -0.0), complex(-1, 0)], dtype)
    want.imag[[1, 2]] = -0.0
    assert _bits(got) == _bits(want)
    z = np.array([complex(inf, 0), complex(-inf, inf), complex(-inf, nan), complex(nan, 0)], dtype)
    got = np.asarray(lf.expm1(lf.array(z, device=device)))
    assert got[0] == inf and got[0].imag == 0 and got[1] == -1 and got[2] == -1
    assert np.isnan(got[3].real) and got[3].imag == 0
