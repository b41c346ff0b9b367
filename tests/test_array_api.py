"""laneflow as an array API namespace: the functions and keywords the standard adds, against numpy on
random inputs, on every backend (the conformance suite itself runs through tools/array_api_suite.py)."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf


def _put(device, a):
    return lf.asarray(a, device=device)


def test_the_namespace_is_laneflow_and_names_its_version():
    x = lf.asarray([1.0])
    assert x.__array_namespace__() is lf
    assert lf.__array_api_version__ == "2024.12"
    with pytest.raises(ValueError, match="2099.12"):
        x.__array_namespace__(api_version="2099.12")
    assert lf.bool is lf.bool_ and lf.pow is lf.power
    info = lf.__array_namespace_info__()
    assert info.capabilities()["data-dependent shapes"] and "int64" in info.dtypes(kind="integral")


def test_finfo_iinfo_isdtype_can_cast():
    assert lf.finfo(lf.float32).eps == float(np.finfo(np.float32).eps)
    assert lf.finfo(lf.bfloat16).bits == 16 and lf.iinfo(lf.uint8).max == 255
    with pytest.raises(TypeError, match="finfo"):
        lf.finfo(lf.int32)
    assert lf.isdtype(lf.int8, "signed integer") and not lf.isdtype(lf.uint8, ("signed integer", "real floating"))
    assert lf.isdtype(lf.float32, lf.float32) and lf.isdtype(lf.bool, "bool")
    assert lf.can_cast(lf.int8, lf.int32) and not lf.can_cast(lf.int64, lf.int32)
    assert lf.can_cast(lf.float32, lf.float64) and not lf.can_cast(lf.float64, lf.float32)


def test_asarray_copy_gives_a_new_object_that_in_place_operators_leave_the_original_alone(device):
    x = _put(device, np.arange(4.0))
    y = lf.asarray(x, copy=True)
    y += 1
    assert np.asarray(x).tolist() == [0.0, 1.0, 2.0, 3.0] and np.asarray(y).tolist() == [1.0, 2.0, 3.0, 4.0]
    assert lf.asarray(x, copy=False) is x
    with pytest.raises(ValueError, match="copy=False"):
        lf.asarray([1, 2], copy=False)


@pytest.mark.parametrize("op,npop", [("__and__", np.bitwise_and), ("__or__", np.bitwise_or),
                                     ("__xor__", np.bitwise_xor), ("__lshift__", np.left_shift),
                                     ("__rshift__", np.right_shift)])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64])
def test_bitwise_operators_on_integers_match_numpy(device, rng, op, npop, dtype):
    a = rng.integers(-100 if np.dtype(dtype).kind == "i" else 0, 100, size=(3, 5)).astype(dtype)
    b = rng.integers(0, 12, size=(5,)).astype(dtype)  # shifts past the bit width included for int8/uint8
    got = getattr(_put(device, a), op)(_put(device, b))
    np.testing.assert_array_equal(np.asarray(got), npop(a, b))
    np.testing.assert_array_equal(np.asarray(~_put(device, a)), np.invert(a))


def test_bitwise_operators_on_bool_are_logical(device):
    a, b = np.array([True, False, True]), np.array([True, True, False])
    x, y = _put(device, a), _put(device, b)
    for got, want in ((x & y, a & b), (x | y, a | b), (x ^ y, a ^ b), (~x, ~a)):
        np.testing.assert_array_equal(np.asarray(got), want)


def test_special_values_of_the_new_elementwise_functions(device):
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 2.5, -3.5, 1.0], np.float64)
    a = _put(device, x)
    for fn, ref in ((lf.isinf, np.isinf), (lf.signbit, np.signbit), (lf.round, np.round), (lf.ceil, np.ceil),
                    (lf.trunc, np.trunc), (lf.expm1, np.expm1), (lf.log2, np.log2)):
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(np.asarray(fn(a)), ref(x))
    np.testing.assert_array_equal(np.asarray(lf.copysign(_put(device, np.ones(8)), a)), np.copysign(1.0, x))
    np.testing.assert_array_equal(np.asarray(lf.round(_put(device, np.array([1, -2], np.int8)))), [1, -2])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.uint8, np.float16])
@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_and_argsort_are_stable_and_match_numpy(device, rng, dtype, axis, descending):
    a = rng.integers(0, 5, size=(6, 9)).astype(dtype)  # many ties
    if np.dtype(dtype).kind == "f":
        a[1, 2] = a[4, 0] = np.nan
    x = _put(device, a)
    got_i = np.asarray(lf.argsort(x, axis=axis, descending=descending))
    if descending:
        n = a.shape[axis]
        want_i = (n - 1) - np.flip(np.argsort(np.flip(a, axis), axis=axis, kind="stable"), axis)
    else:
        want_i = np.argsort(a, axis=axis, kind="stable")
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_array_equal(np.asarray(lf.sort(x, axis=axis, descending=descending)),
                                  np.take_along_axis(a, want_i, axis))


@pytest.mark.parametrize("side", ["left", "right"])
def test_searchsorted_matches_numpy(device, rng, side):
    s = np.sort(rng.integers(0, 10, size=20)).astype(np.float32)
    q = rng.integers(-1, 12, size=(3, 4)).astype(np.float32)
    got = lf.searchsorted(_put(device, s), _put(device, q), side=side)
    np.testing.assert_array_equal(np.asarray(got), np.searchsorted(s, q, side=side))


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.bool_])
@pytest.mark.parametrize("axis", [0, 1])
def test_cumulative_sum_and_prod_match_numpy(device, rng, dtype, axis):
    a = rng.integers(0, 3, size=(4, 5)).astype(dtype)
    x = _put(device, a)
    got = lf.cumulative_sum(x, axis=axis, include_initial=True)
    want = np.concatenate([np.zeros_like(np.sum(a, axis=axis, keepdims=True)), np.cumsum(a, axis=axis)], axis)
    assert got.dtype == np.sum(a).dtype or dtype == np.float32
    np.testing.assert_allclose(np.asarray(got), want)
    np.testing.assert_allclose(np.asarray(lf.cumulative_prod(x, axis=axis)), np.cumprod(a, axis=axis), rtol=1e-6)


def test_statistics_keywords(device, rng):
    a = rng.standard_normal((4, 6))
    x = _put(device, a)
    np.testing.assert_allclose(np.asarray(lf.var(x, axis=1, correction=1)), np.var(a, axis=1, ddof=1))
    np.testing.assert_allclose(np.asarray(lf.std(x, correction=0.5)), np.std(a, ddof=0.5))
    i8 = _put(device, np.array([100, 100, 100], np.int8))
    assert lf.sum(i8, dtype=lf.int8).dtype == lf.int8 and int(lf.sum(i8, dtype=lf.int8)) == np.int8(300 - 256)
    assert lf.prod(x, dtype=lf.float32).dtype == lf.float32


def test_manipulation_functions_match_numpy(device, rng):
    a = rng.standard_normal((2, 3, 4))
    x = _put(device, a)
    cases = [
        (lf.flip(x, axis=1), np.flip(a, 1)), (lf.flip(x), np.flip(a)),
        (lf.roll(x, 2, axis=2), np.roll(a, 2, 2)), (lf.roll(x, -5), np.roll(a, -5)),
        (lf.roll(x, (1, 1), axis=(0, 2)), np.roll(a, (1, 1), (0, 2))),
        (lf.tile(x, (2, 1, 1, 2)), np.tile(a, (2, 1, 1, 2))), (lf.repeat(x, 2, axis=1), np.repeat(a, 2, 1)),
        (lf.repeat(x, [1, 0, 2], axis=1), np.repeat(a, [1, 0, 2], 1)), (lf.repeat(x, 3), np.repeat(a, 3)),
        (lf.moveaxis(x, 0, -1), np.moveaxis(a, 0, -1)), (lf.moveaxis(x, (0, 1), (2, 0)), np.moveaxis(a, (0, 1), (2, 0))),
        (lf.permute_dims(x, (2, 0, 1)), a.transpose(2, 0, 1)), (lf.matrix_transpose(x), a.swapaxes(-1, -2)),
        (lf.concat([x, x], axis=-1), np.concatenate([a, a], -1)), (lf.tril(x, k=1), np.tril(a, 1)),
        (lf.triu(x, k=-1), np.triu(a, -1)), (lf.unstack(x, axis=1)[2], a[:, 2]),
    ]
    for got, want in cases:
        np.testing.assert_array_equal(np.asarray(got), want)
    gx, gy = lf.meshgrid(_put(device, np.arange(3)), _put(device, np.arange(2)))
    wx, wy = np.meshgrid(np.arange(3), np.arange(2))
    np.testing.assert_array_equal(np.asarray(gx), wx)
    np.testing.assert_array_equal(np.asarray(gy), wy)


def test_data_dependent_ops_run_eagerly(device):
    a = np.array([[3.0, np.nan, 1.0], [1.0, np.nan, 3.0]])
    x = _put(device, a)
    u = lf.unique_all(x)
    assert np.asarray(u.values)[:2].tolist() == [1.0, 3.0] and np.isnan(np.asarray(u.values)[2:]).all()
    assert np.asarray(u.counts).tolist() == [2, 2, 1, 1] and u.inverse_indices.shape == a.shape
    np.testing.assert_array_equal(np.asarray(u.values)[np.asarray(u.inverse_indices)], a)
    for got, want in zip(lf.nonzero(x > 2), np.nonzero(a > 2)):
        np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.asarray(x[x > 0]), a[a > 0])
    y = lf.asarray(x, copy=True)
    y[y > 2] = 0.0
    np.testing.assert_array_equal(np.asarray(y), np.where(a > 2, 0.0, a))


def test_data_dependent_ops_are_refused_inside_compile_naming_the_op():
    for op, fn in (("nonzero", lambda x: lf.nonzero(x)[0]), ("unique_values", lf.unique_values),
                   ("getitem", lambda x: x[x > 0])):
        with pytest.raises(lf.CompileError, match=op):
            lf.compile(fn)(lf.asarray([1.0, -1.0]))


def test_linalg_extension_matches_numpy(device, rng):
    a = rng.standard_normal((3, 4, 4))
    x = _put(device, a)
    la = lf.linalg
    np.testing.assert_allclose(np.asarray(la.det(x)), np.linalg.det(a), rtol=1e-10)
    s = la.slogdet(x)
    ws, wl = np.linalg.slogdet(a)
    np.testing.assert_array_equal(np.asarray(s.sign), ws)
    np.testing.assert_allclose(np.asarray(s.logabsdet), wl, rtol=1e-10)
    assert float(la.det(_put(device, np.ones((3, 3))))) == 0.0
    np.testing.assert_allclose(np.asarray(la.trace(x, offset=1)), np.trace(a, 1, -2, -1))
    np.testing.assert_allclose(np.asarray(la.diagonal(x, offset=-1)), np.diagonal(a, -1, -2, -1))
    for ord in ("fro", "nuc", 1, -1, 2, -2, np.inf, -np.inf):
        np.testing.assert_allclose(np.asarray(la.matrix_norm(x, ord=ord)), np.linalg.norm(a, ord, (-2, -1)),
                                   rtol=1e-10)
    for ord in (2, 1, 3.5, np.inf, -np.inf, 0):
        np.testing.assert_allclose(np.asarray(la.vector_norm(x, axis=-1, ord=ord)), np.linalg.norm(a, ord, -1),
                                   rtol=1e-10)
    np.testing.assert_allclose(np.asarray(la.pinv(x)), np.linalg.pinv(a), atol=1e-10)
    np.testing.assert_array_equal(np.asarray(la.matrix_rank(x)), np.linalg.matrix_rank(a))
    np.testing.assert_allclose(np.asarray(la.matrix_power(x, 3)), np.linalg.matrix_power(a, 3), rtol=1e-10)
    np.testing.assert_allclose(np.asarray(la.cross(x[..., :3], x[..., 1:])), np.cross(a[..., :3], a[..., 1:]))
    np.testing.assert_allclose(np.asarray(lf.vecdot(x, x)), np.sum(a * a, -1))
    np.testing.assert_allclose(np.asarray(lf.tensordot(x, x, axes=([1, 2], [2, 1]))),
                               np.tensordot(a, a, axes=([1, 2], [2, 1])))
    np.testing.assert_allclose(np.asarray(la.outer(x[0, 0], x[0, 1])), np.outer(a[0, 0], a[0, 1]))
    q, r = la.qr(x)
    assert la.qr(x).Q.shape == (3, 4, 4) and isinstance(la.svd(x), la.SVDResult)
    np.testing.assert_allclose(np.asarray(q @ r), a, atol=1e-12)
    np.testing.assert_allclose(np.asarray(la.eigvalsh(x + x.mT)), np.linalg.eigvalsh(a + a.swapaxes(-1, -2)),
                               atol=1e-12)


def test_sign_of_signed_zeros_and_nan_is_numpys(device):
    """sign(-0) is +0 (numpy and the standard's special case), sign(NaN) is NaN, on every backend."""
    xn = np.array([-0.0, 0.0, np.nan, -2.5, 3.0], np.float64)
    with lf.stream(device):
        got = np.asarray(lf.sign(lf.array(xn)))
    want = np.sign(xn)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
