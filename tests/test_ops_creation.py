"""Array creation against numpy (array, asarray, zeros/ones/full and their _like forms, arange, linspace,
eye) and lf.random (reproducible by key, independent split keys, distribution moments)."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf
from conftest import random_array
from opcheck import DTYPES, FLOATS, assert_close, assert_same, eps, name


# -- lf.array / lf.asarray ---------------------------------------------------------------------------


@pytest.mark.parametrize("obj,dtype", [
    ([1, 2, 3], lf.int64), ([1.0, 2.5], lf.float64), ([True, False], lf.bool_), ([[1, 2.5], [3, 4]], lf.float64),
    ([[True, 2], [3, 4]], lf.int64), (3, lf.int64), (2.5, lf.float64), (False, lf.bool_), ([], lf.float64),
    ([[], []], lf.float64), (np.float32(1.5), lf.float32), (np.int8(-3), lf.int8),
], ids=repr)
def test_array_from_python_data_infers_numpys_default_dtype(device, obj, dtype):
    with lf.stream(device):
        got = lf.array(obj)
    assert_same(got, np.array(obj), dtype)
    assert got.device == device


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_array_from_numpy_keeps_dtype_and_copies_the_data(device, rng, dtype):
    for shape in [(), (0,), (3,), (2, 3, 4)]:
        x = np.array(random_array(rng, shape, dtype))
        with lf.stream(device):
            a = lf.array(x)
        expect = x.copy()
        x[...] = np.ones((), dtype)  # later changes to the source do not show
        assert_same(a, expect)


@pytest.mark.parametrize("src", [np.int16, np.uint16, np.uint64], ids=lambda d: np.dtype(d).name)
def test_array_from_numpy_dtypes_laneflow_lacks_widens_them(device, src):
    # Documented in laneflow/dtypes.py: int16 and uint16 become int32, uint64 becomes int64.
    x = np.array([1, 7, 100], src)
    with lf.stream(device):
        a = lf.array(x)
    assert_same(a, x, lf.int64 if np.dtype(src) == np.uint64 else lf.int32)


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_array_with_dtype_converts_like_numpy(device, rng, dtype):
    data = [[1.5, -2.0, 0.0], [3.25, 100.0, 7.0]] if np.dtype(dtype).kind != "u" else [[1.5, 2.0, 0.0], [3.25, 100.0, 7.0]]
    with lf.stream(device):
        a, b = lf.array(data, dtype=dtype), lf.array(np.array(data), dtype=dtype)
    assert_same(a, np.array(data).astype(dtype))
    assert_same(b, np.array(data).astype(dtype))


def test_array_of_an_array_copies_and_casts(device, rng):
    x = random_array(rng, (3,), lf.float32)
    with lf.stream(device):
        a = lf.array(x)
        same, cast = lf.array(a), lf.array(a, dtype=lf.float16)
        a[0] = 100.0
    assert_same(same, x)
    assert_same(cast, x.astype(np.float16))


def test_asarray_returns_the_same_array_when_nothing_changes(device, rng):
    with lf.stream(device):
        a = lf.array(random_array(rng, (3,), lf.int32))
        assert lf.asarray(a) is a
        assert lf.asarray(a, dtype=lf.int32) is a
        b = lf.asarray(a, dtype=lf.float32)
        c = lf.asarray([1, 2])
    assert b is not a
    assert_same(b, np.asarray(a).astype(np.float32))
    assert_same(c, np.array([1, 2]))


def test_array_device_argument_places_it(device, rng):
    x = random_array(rng, (3,), lf.float64)
    a, b = lf.array(x, device=device), lf.array(x, device=str(device))
    assert a.device == b.device == device
    assert_same(a, x)


# -- zeros / ones / full ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_zeros_ones_full_of_every_dtype(device, dtype):
    for shape in [(), (0,), (3,), (2, 3), 4]:
        with lf.stream(device):
            z, o, f = lf.zeros(shape, dtype), lf.ones(shape, dtype=dtype), lf.full(shape, 7, dtype)
        assert_same(z, np.zeros(shape, dtype))
        assert_same(o, np.ones(shape, dtype))
        assert_same(f, np.full(shape, 7, dtype))


def test_zeros_and_ones_default_to_float64_like_numpy(device):
    with lf.stream(device):
        z, o = lf.zeros((2, 2)), lf.ones(3)
    assert_same(z, np.zeros((2, 2)))
    assert_same(o, np.ones(3))


@pytest.mark.parametrize("value", [1.5, 7, True, np.float32(2.5), np.int8(-4), np.float16(0.25)], ids=repr)
def test_full_infers_the_dtype_from_the_fill_value_like_numpy(device, value):
    with lf.stream(device):
        got = lf.full((2, 3), value)
    assert_same(got, np.full((2, 3), value))


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_like_constructors_copy_shape_and_dtype(device, rng, dtype):
    x = random_array(rng, (2, 3), dtype)
    with lf.stream(device):
        a = lf.array(x)
        z, o, f = lf.zeros_like(a), lf.ones_like(a), lf.full_like(a, 1)
        zf, of = lf.zeros_like(a, dtype=lf.float32), lf.full_like(x, 2, dtype=lf.int8)
    assert_same(z, np.zeros_like(x))
    assert_same(o, np.ones_like(x))
    assert_same(f, np.full_like(x, 1))
    assert_same(zf, np.zeros((2, 3), np.float32))
    assert_same(of, np.full((2, 3), 2, np.int8))


# -- arange / linspace / eye -------------------------------------------------------------------------


@pytest.mark.parametrize("args,kw", [
    ((5,), {}), ((2, 10, 3), {}), ((10, 2, -2), {}), ((0, 0), {}), ((5, 2), {}), ((-3, 3), {}),
    ((5,), {"dtype": lf.float32}), ((0, 10, 2), {"dtype": lf.int8}), ((1.5,), {}), ((0, 1, 0.1), {}),
    ((1, -1, -0.25), {}), ((0.5, 4), {}), ((0, 5), {"dtype": lf.bfloat16}), ((3,), {"dtype": lf.float16}),
    ((0, 300, 7), {"dtype": lf.uint8}),
], ids=repr)
def test_arange_matches_numpy(device, args, kw):
    with lf.stream(device):
        got = lf.arange(*args, **kw)
    want = np.arange(*args, **kw)
    if want.dtype.kind in "iu" or "dtype" in kw:
        assert_same(got, want)
    else:
        assert_close(got, want, ulps=2)


@pytest.mark.parametrize("args,kw", [
    ((0, 1, 5), {}), ((0, 1, 5), {"endpoint": False}), ((-3, 7, 1), {}), ((2, 2, 0), {}), ((1, -1, 9), {}),
    ((0, 10, 5), {"dtype": lf.float32}), ((0, 1, 3), {"dtype": lf.bfloat16}), ((0, 1, 4), {"dtype": lf.float16}),
    ((0, 10, 4), {"dtype": lf.int32}), ((-5, 0, 4), {"dtype": lf.int32}), ((-7, 7, 6), {"dtype": lf.int64}),
], ids=repr)
def test_linspace_matches_numpy(device, args, kw):
    with lf.stream(device):
        got = lf.linspace(*args, **kw)
    want = np.linspace(*args, **kw)  # numpy >= 2: integer dtypes round towards -inf
    if want.dtype.kind in "iu":
        assert_same(got, want)
    else:
        assert_close(got, want, ulps=2)


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_eye_matches_numpy(device, dtype):
    for args in [(3,), (3, 4), (4, 3, 1), (3, None, -1), (3, 3, 5), (0,), (2, 0), (4, 4, -3)]:
        with lf.stream(device):
            got = lf.eye(*args, dtype=dtype)
        assert_same(got, np.eye(*args, dtype=dtype))


def test_eye_defaults_to_float64(device):
    with lf.stream(device):
        got = lf.eye(2)
    assert_same(got, np.eye(2))


# -- lf.random ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dist", ["normal", "uniform"])
@pytest.mark.parametrize("dtype", FLOATS, ids=name)
def test_random_is_reproducible_by_key(device, rng, dist, dtype):
    seed = int(rng.integers(0, 2**63))
    f = getattr(lf.random, dist)
    with lf.stream(device):
        a = f((5, 7), dtype=dtype, key=lf.random.key(seed))
        b = f((5, 7), dtype=dtype, key=lf.random.key(seed))
        c = f((5, 7), dtype=dtype, key=lf.random.key(seed + 1))
    assert a.dtype == dtype and a.shape == (5, 7)
    assert np.array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(a), np.asarray(c))


def test_random_split_keys_differ_from_each_other_and_the_parent(device, rng):
    with lf.stream(device):
        key = lf.random.key(int(rng.integers(0, 2**32)))
        keys = lf.random.split(key, 4)
        k1, k2 = lf.random.split(key)
        again = lf.random.split(key, 4)
        draws = [lf.random.normal((64,), key=keys[i]) for i in range(4)]
        parent = lf.random.normal((64,), key=key)
        from_unpacked = lf.random.normal((64,), key=k1)
    assert keys.shape == (4, 2)
    rows = {tuple(r) for r in np.asarray(keys).tolist()}
    assert len(rows) == 4 and tuple(np.asarray(key).tolist()) not in rows
    assert np.array_equal(np.asarray(keys), np.asarray(again))  # split is deterministic too
    assert not np.array_equal(np.asarray(k1), np.asarray(k2))
    vals = [np.asarray(d) for d in draws + [parent]]
    for i in range(len(vals)):
        for j in range(i + 1, len(vals)):
            assert not np.array_equal(vals[i], vals[j])
    assert np.isfinite(np.asarray(from_unpacked)).all()


@pytest.mark.parametrize("dtype", FLOATS, ids=name)
def test_normal_has_roughly_the_requested_mean_and_std(device, rng, dtype):
    n = 200_000
    loc, scale = float(rng.uniform(-3, 3)), float(rng.uniform(0.5, 2))
    with lf.stream(device):
        x = np.asarray(lf.random.normal((n,), dtype=dtype, loc=loc, scale=scale,
                                        key=lf.random.key(int(rng.integers(0, 2**32)))))
    x = x.astype(np.float64)
    assert np.isfinite(x).all()
    # standard errors: scale/sqrt(n) for the mean, about scale/sqrt(2n) for the std; plus dtype rounding
    slack = 6 * scale / np.sqrt(n) + 4 * eps(dtype) * (abs(loc) + scale)
    assert abs(x.mean() - loc) < slack
    assert abs(x.std() - scale) < slack
    assert abs(np.mean(((x - loc) / scale) ** 3)) < 0.05  # symmetric
    assert abs(np.mean(((x - loc) / scale) ** 4) - 3) < 0.1  # normal kurtosis


@pytest.mark.parametrize("dtype", FLOATS, ids=name)
def test_uniform_is_in_low_high_with_roughly_uniform_moments(device, rng, dtype):
    n = 200_000
    for low, high in [(0.0, 1.0), (-3.0, 5.0), (2.0, 2.5)]:
        with lf.stream(device):
            x = np.asarray(lf.random.uniform((n,), dtype=dtype, low=low, high=high,
                                             key=lf.random.key(int(rng.integers(0, 2**32)))))
        x = x.astype(np.float64)
        assert low <= x.min() and x.max() < high, f"samples outside [{low}, {high}): {x.min()}, {x.max()}"
        width = high - low
        slack = 6 * width / np.sqrt(12 * n) + 2 * eps(dtype) * max(abs(low), abs(high))
        assert abs(x.mean() - (low + high) / 2) < slack
        assert abs(x.var() - width ** 2 / 12) < 0.02 * width ** 2 / 12 + 4 * eps(dtype) * width ** 2
        # Flat histogram, where the dtype resolves a bin into at least 32 values: on a coarser grid,
        # rounding to nearest gives the first and last value half a step less and more weight.
        ulp = eps(dtype) * 2.0 ** np.floor(np.log2(max(abs(low), abs(high))))
        if ulp <= width / 8 / 32:
            counts = np.histogram(x, bins=8, range=(low, high))[0]
            assert counts.min() > 0.95 * n / 8 and counts.max() < 1.05 * n / 8, counts


@pytest.mark.parametrize("dist", ["normal", "uniform"])
def test_random_defaults_and_shapes(device, dist):
    f = getattr(lf.random, dist)
    with lf.stream(device):
        scalar, empty, grid = f(key=lf.random.key(1)), f((0, 3), key=lf.random.key(1)), f(4, key=lf.random.key(1))
    assert scalar.shape == () and scalar.dtype == lf.float32  # float32 by default (documented)
    assert empty.shape == (0, 3) and np.asarray(empty).shape == (0, 3)
    assert grid.shape == (4,) and np.isfinite(np.asarray(grid)).all()


def test_random_without_a_key_draws_fresh_numbers_and_seed_replays_them(device):
    with lf.stream(device):
        lf.random.seed(1234)
        a, b = lf.random.normal((8,)), lf.random.normal((8,))
        lf.random.seed(1234)
        c = lf.random.normal((8,))
    assert not np.array_equal(np.asarray(a), np.asarray(b))
    assert np.array_equal(np.asarray(a), np.asarray(c))


@pytest.mark.parametrize("dtype", [lf.float16, lf.bfloat16, lf.float32, lf.int32, lf.int8], ids=name)
def test_arange_with_a_fractional_step_converts_each_exact_value_once(device, dtype):
    # Documented deviation: numpy repeats the difference of its first two converted values instead.
    for start, stop, step in [(0, 3, 0.1), (-1, 1, 0.5), (2.5, -2, -0.75)]:
        with lf.stream(device):
            got = lf.arange(start, stop, step, dtype=dtype)
        n = len(np.arange(start, stop, step))
        exact = start + step * np.arange(n, dtype=np.float64)
        assert_same(got, exact.astype(dtype))
