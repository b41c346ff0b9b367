"""What version 2024.12 of the array API standard added (``take_along_axis``, ``diff``, ``count_nonzero``,
``nextafter``, Python scalars on either side of binary functions), against numpy on every backend."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf
from laneflow._array_api import API_VERSIONS


def _put(device, a):
    return lf.asarray(a, device=device)


def test_every_version_of_the_one_list_is_accepted_and_the_newest_is_declared():
    x = lf.asarray([1.0])
    assert lf.__array_api_version__ == API_VERSIONS[-1] == "2024.12"
    for v in API_VERSIONS:
        assert x.__array_namespace__(api_version=v) is lf
    with pytest.raises(ValueError, match="2025.12"):
        x.__array_namespace__(api_version="2025.12")


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.bool_])
def test_take_along_axis_matches_numpy(device, rng, axis, dtype):
    a = (rng.standard_normal((3, 4, 5)) * 4).astype(dtype)
    n = a.shape[axis]
    idx = rng.integers(-n, n, size=a.shape[:axis % 3] + (7,) + a.shape[axis % 3 + 1:])
    got = lf.take_along_axis(_put(device, a), _put(device, idx), axis=axis)
    np.testing.assert_array_equal(np.asarray(got), np.take_along_axis(a, idx, axis))
    assert got.dtype == a.dtype


def test_take_along_axis_broadcasts_the_other_axes_and_undoes_argsort(device, rng):
    a = rng.standard_normal((4, 6))
    x = _put(device, a)
    np.testing.assert_array_equal(np.asarray(lf.take_along_axis(x, lf.argsort(x, axis=1), axis=1)), np.sort(a, 1))
    idx = np.array([[5, 0, 2]])  # one row of indices for every row of x
    np.testing.assert_array_equal(np.asarray(lf.take_along_axis(x, _put(device, idx))),
                                  np.take_along_axis(a, np.broadcast_to(idx, (4, 3)), 1))


def test_take_along_axis_refuses_bad_arguments_naming_them():
    x = lf.asarray(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"take_along_axis: .*rank.*\(2, 3\).*\(3,\)"):
        lf.take_along_axis(x, lf.asarray([0, 1, 2]))
    with pytest.raises(IndexError, match="take_along_axis: .*integer dtype.*float"):
        lf.take_along_axis(x, lf.asarray([[0.0]]))
    with pytest.raises(ValueError, match=r"take_along_axis: .*\(2, 3\).*\(4, 1\).*broadcast"):
        lf.take_along_axis(x, lf.asarray(np.zeros((4, 1), np.int64)))
    with pytest.raises(lf.ExecutionError, match="out of bounds|out of range"):
        lf.eval(lf.take_along_axis(x, lf.asarray([[3]])))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7])
@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.uint8, np.bool_])
def test_diff_matches_numpy(device, rng, n, dtype):
    a = rng.integers(0, 9, size=(3, 5)).astype(dtype)
    for axis in (0, 1, -1):
        np.testing.assert_array_equal(np.asarray(lf.diff(_put(device, a), axis=axis, n=n)), np.diff(a, n, axis))


def test_diff_joins_prepend_and_append_first(device, rng):
    a = rng.standard_normal((3, 4))
    pre, app = rng.standard_normal((3, 2)), rng.standard_normal((3, 1))
    got = lf.diff(_put(device, a), n=2, prepend=_put(device, pre), append=_put(device, app))
    np.testing.assert_allclose(np.asarray(got), np.diff(a, 2, -1, prepend=pre, append=app))
    got = lf.diff(_put(device, a), axis=0, prepend=_put(device, np.float64(1.5)))
    np.testing.assert_allclose(np.asarray(got), np.diff(a, axis=0, prepend=1.5))
    with pytest.raises(ValueError, match=r"diff: append must have the shape of x except along axis 1.*\(2, 1\)"):
        lf.diff(_put(device, a), append=_put(device, np.zeros((2, 1))))
    with pytest.raises(ValueError, match="diff: n must be non-negative"):
        lf.diff(_put(device, a), n=-1)
    with pytest.raises(ValueError, match="diff: .*at least one dimension"):
        lf.diff(_put(device, np.float64(1.0)))


@pytest.mark.parametrize("axis", [None, 0, (0, 2), -1])
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.uint8])
def test_count_nonzero_matches_numpy(device, rng, axis, keepdims, dtype):
    a = rng.integers(0, 3, size=(2, 3, 4)).astype(dtype)
    if dtype == np.float32:
        a[0, 0, 0], a[1, 1, 1] = -0.0, np.nan  # -0 is zero; NaN is not
    got = lf.count_nonzero(_put(device, a), axis=axis, keepdims=keepdims)
    want = np.count_nonzero(a, axis=axis, keepdims=keepdims)
    assert got.dtype == lf.int64 and got.shape == np.shape(want)
    np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, lf.bfloat16])
def test_nextafter_matches_numpy_bit_for_bit(device, rng, dtype):
    special = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-45, 65504.0]
    a = np.concatenate([np.array(special), rng.standard_normal(20) * 100]).astype(dtype)
    b = np.concatenate([np.array([-0.0, 0.0, 2.0, -2.0, 0.0, 0.0, 1.0, np.inf, np.inf]),
                        rng.standard_normal(20) * 100]).astype(dtype)
    got = np.asarray(lf.nextafter(_put(device, a), _put(device, b)))
    with np.errstate(over="ignore"):
        want = np.nextafter(a, b)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}"))
    up = np.asarray(lf.nextafter(_put(device, a[:4]), 2.0))  # a Python float keeps x1's dtype
    np.testing.assert_array_equal(up.view(f"u{up.itemsize}"), np.nextafter(a[:4], np.array(2.0, dtype)).view(f"u{up.itemsize}"))


@pytest.mark.parametrize("fn", ["add", "subtract", "multiply", "divide", "maximum", "atan2", "copysign", "hypot",
                                "nextafter", "less", "equal", "logaddexp", "remainder"])
def test_python_scalars_on_either_side_of_binary_functions(device, fn):
    a = np.array([0.5, -2.0, 3.0], np.float32)
    x = _put(device, a)
    f, ref = getattr(lf, fn), getattr(np, {"atan2": "arctan2"}.get(fn, fn))
    for got, want in ((f(x, 1.5), ref(a, np.float32(1.5))), (f(1.5, x), ref(np.float32(1.5), a)),
                      (f(2, x), ref(np.float32(2), a))):
        assert got.dtype == want.dtype, fn
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    i = _put(device, np.array([1, 2, 3], np.int8))
    assert lf.add(3, i).dtype == lf.int8 and np.asarray(lf.bitwise_and(6, i)).tolist() == [0, 2, 2]
