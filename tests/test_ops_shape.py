"""Shape ops and dtype casts against numpy: exact, for every dtype (the element size matters to kernels)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import laneflow as lf
from conftest import random_array
from opcheck import DTYPES, assert_same, expected_dtype, is_float, name


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_reshape_keeps_row_major_order(device, rng, dtype):
    cases = [((2, 3, 4), (4, 6)), ((2, 3, 4), (-1,)), ((2, 3, 4), (3, -1, 2)), ((2, 3, 4), (2, 3, 4)),
             ((), (1, 1)), ((1,), ()), ((6,), 6), ((0, 3), (3, 0)), ((0, 3), (-1, 3)), ((5,), (5, 1, 1))]
    for shape, new in cases:
        x = random_array(rng, shape, dtype)
        with lf.stream(device):
            got = lf.reshape(lf.array(x), new)
        assert_same(got, x.reshape(new))


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_reshape_method_takes_a_tuple_or_separate_ints(device, rng, dtype):
    x = random_array(rng, (2, 6), dtype)
    with lf.stream(device):
        a, b, c = lf.array(x).reshape(3, 4), lf.array(x).reshape((4, -1)), lf.array(x).reshape(-1)
    assert_same(a, x.reshape(3, 4))
    assert_same(b, x.reshape(4, -1))
    assert_same(c, x.reshape(-1))


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_transpose_permutes_axes(device, rng, dtype):
    cases = [((2, 3, 4), None), ((2, 3, 4), (1, 0, 2)), ((2, 3, 4), (-1, 0, 1)), ((2, 3, 4), (0, 1, 2)),
             ((3,), None), ((), None), ((0, 2), None), ((1, 2, 0, 3), (3, 2, 1, 0))]
    for shape, axes in cases:
        x = random_array(rng, shape, dtype)
        with lf.stream(device):
            got = lf.transpose(lf.array(x), axes)
        assert_same(got, np.transpose(x, axes))


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_transpose_method_and_T(device, rng, dtype):
    x = random_array(rng, (2, 3, 4), dtype)
    with lf.stream(device):
        a = lf.array(x)
        t, t1, t2, t3 = a.T, a.transpose(), a.transpose(2, 0, 1), a.transpose((1, 2, 0))
    assert_same(t, x.T)
    assert_same(t1, x.transpose())
    assert_same(t2, x.transpose(2, 0, 1))
    assert_same(t3, x.transpose((1, 2, 0)))


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_swapaxes_exchanges_two_axes(device, rng, dtype):
    x = random_array(rng, (2, 3, 4), dtype)
    for a, b in [(0, 2), (-1, 0), (1, 1), (2, -2)]:
        with lf.stream(device):
            got, method = lf.swapaxes(lf.array(x), a, b), lf.array(x).swapaxes(a, b)
        assert_same(got, np.swapaxes(x, a, b))
        assert_same(method, np.swapaxes(x, a, b))


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_expand_dims_inserts_size_one_axes(device, rng, dtype):
    for shape, axis in [((3, 4), 0), ((3, 4), -1), ((3, 4), 1), ((3, 4), (0, 2)), ((3, 4), (-1, 0)),
                        ((), 0), ((0,), 1)]:
        x = random_array(rng, shape, dtype)
        with lf.stream(device):
            got = lf.expand_dims(lf.array(x), axis)
        assert_same(got, np.expand_dims(x, axis))


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_squeeze_removes_size_one_axes(device, rng, dtype):
    for shape, axis in [((1, 3, 1, 4), None), ((1, 3, 1, 4), 0), ((1, 3, 1, 4), -2), ((1, 3, 1, 4), (0, 2)),
                        ((1, 1), None), ((), None), ((1, 0), 0), ((3,), None)]:
        x = random_array(rng, shape, dtype)
        with lf.stream(device):
            got, method = lf.squeeze(lf.array(x), axis), lf.array(x).squeeze(axis)
        assert_same(got, np.squeeze(x, axis))
        assert_same(method, np.squeeze(x, axis))


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_broadcast_to_repeats_along_new_and_size_one_axes(device, rng, dtype):
    for shape, target in [((3,), (2, 3)), ((), (2, 2)), ((3, 1), (2, 3, 4)), ((1, 0), (2, 0)), ((2, 3), (2, 3)),
                          ((1,), (0,)), ((4,), 4)]:
        x = random_array(rng, shape, dtype)
        with lf.stream(device):
            got = lf.broadcast_to(lf.array(x), target)
        assert_same(got, np.broadcast_to(x, target))


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_flatten_merges_axes(device, rng, dtype):
    x = random_array(rng, (2, 3, 4), dtype)
    with lf.stream(device):
        a = lf.array(x)
        full, method, mid, head = lf.flatten(a), a.flatten(), lf.flatten(a, 1, 2), lf.flatten(a, 0, -2)
        scalar = lf.flatten(lf.array(x[0, 0, 0]))
    assert_same(full, x.flatten())
    assert_same(method, x.flatten())
    assert_same(mid, x.reshape(2, 12))
    assert_same(head, x.reshape(6, 4))
    assert_same(scalar, x[0, 0, 0].flatten())


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_concatenate_joins_along_an_axis(device, rng, dtype):
    for shapes, axis in [([(2, 3), (4, 3), (1, 3)], 0), ([(2, 3), (2, 1)], 1), ([(2, 3), (2, 2)], -1),
                         ([(2, 3), (0, 3)], 0), ([(5,)], 0), ([(2, 3), (3, 2)], None), ([(2, 2, 2), (2, 1, 2)], 1)]:
        xs = [random_array(rng, s, dtype) for s in shapes]
        with lf.stream(device):
            got = lf.concatenate([lf.array(x) for x in xs], axis=axis)
            as_tuple = lf.concatenate(tuple(lf.array(x) for x in xs), axis=axis)
        assert_same(got, np.concatenate(xs, axis=axis))
        assert_same(as_tuple, np.concatenate(xs, axis=axis))


@pytest.mark.parametrize("da,db", [(lf.int8, lf.float32), (lf.bool_, lf.int32), (lf.int8, lf.uint8),
                                   (lf.bfloat16, lf.float16), (lf.bfloat16, lf.int8), (lf.uint8, lf.int64),
                                   (lf.float16, lf.float64)], ids=lambda d: name(d))
def test_concatenate_and_stack_promote_mixed_dtypes(device, rng, da, db):
    a, b = random_array(rng, (2, 3), da), random_array(rng, (2, 3), db)
    dtype = expected_dtype(lambda p, q: np.concatenate([p, q]), np.dtype(da), np.dtype(db))
    wide = [x.astype(np.float64) if is_float(x.dtype) else x.astype(np.int64) for x in (a, b)]
    with lf.stream(device):
        cat = lf.concatenate([lf.array(a), lf.array(b)], axis=1)
        st = lf.stack([lf.array(a), lf.array(b)])
    assert_same(cat, np.concatenate(wide, axis=1), dtype)
    assert_same(st, np.stack(wide), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_stack_joins_along_a_new_axis(device, rng, dtype):
    for shape, n, axis in [((2, 3), 3, 0), ((2, 3), 2, -1), ((2, 3), 2, 1), ((), 4, 0), ((0, 2), 2, 1), ((3,), 1, 0)]:
        xs = [random_array(rng, shape, dtype) for _ in range(n)]
        with lf.stream(device):
            got = lf.stack([lf.array(x) for x in xs], axis=axis)
        assert_same(got, np.stack(xs, axis=axis))


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_split_into_sections_or_at_indices(device, rng, dtype):
    x = random_array(rng, (6, 4), dtype)
    for spec, axis in [(3, 0), (2, 1), (2, -1), ([1, 4], 0), ([0, 6], 0), ([2, 10], 0), ([3, 1], 0), (1, 0),
                       ([], 1)]:
        with lf.stream(device):
            parts = lf.split(lf.array(x), spec, axis=axis)
        want = np.split(x, spec, axis=axis)
        assert isinstance(parts, list) and len(parts) == len(want)
        for got, w in zip(parts, want):
            assert_same(got, w)


def _castable(rng, src, dst) -> np.ndarray:
    """Values of dtype src that convert to dst exactly as numpy defines it (no NaN or out-of-range
    float-to-int conversions, which are undefined behaviour in C)."""
    x = random_array(rng, (3, 5), src)
    if is_float(src) and np.dtype(dst).kind == "u":
        x = np.abs(x)
    if is_float(src):
        x.flat[:3] = np.array([0.0, -1.5 if np.dtype(dst).kind != "u" else 1.5, 1.75]).astype(src)
    return x


@pytest.mark.parametrize("src,dst", list(itertools.product(DTYPES, DTYPES)), ids=lambda d: name(d))
def test_astype_converts_like_numpy(device, rng, src, dst):
    x = _castable(rng, src, dst)
    with lf.stream(device):
        a = lf.array(x)
        got, method = lf.astype(a, dst), a.astype(dst)
    with np.errstate(all="ignore"):
        want = x.astype(dst)
    assert_same(got, want, dst)
    assert_same(method, want, dst)


def test_astype_accepts_dtype_names_and_python_types(device, rng):
    x = random_array(rng, (4,), lf.float32)
    with lf.stream(device):
        a = lf.array(x)
        by_name, by_type, by_np, bf = a.astype("int32"), a.astype(float), a.astype(np.int8), a.astype("bfloat16")
    assert_same(by_name, x.astype(np.int32))
    assert_same(by_type, x.astype(np.float64))
    assert_same(by_np, x.astype(np.int8))
    assert_same(bf, x.astype(lf.bfloat16))


def test_astype_rounds_float_to_bfloat16_to_nearest_even(device):
    # 1 + 2^-8 is halfway between bfloat16 neighbours 1 and 1 + 2^-7: ties go to the even one (1).
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -9, -(1 + 2 ** -8)], np.float32)
    with lf.stream(device):
        got = lf.astype(lf.array(x), lf.bfloat16)
    assert_same(got, np.array([1.0, 1 + 2 ** -6, 1.0, -1.0]), lf.bfloat16)
