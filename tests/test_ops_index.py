"""Indexing against numpy: basic and integer-array ``x[i]``, slice assignment ``x[i] = v``, and take."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf
from conftest import random_array
from opcheck import DTYPES, INTS, assert_same, name

E = Ellipsis
# Basic indices on a (4, 5, 6) array: ints, negative ints, slices with steps (also negative and
# past the end), None, Ellipsis, and mixtures.
BASIC = [1, -1, (1, 2), (-1, -2, 0), slice(1, None), slice(None, -1), slice(None, None, 2), slice(None, None, -1),
         slice(3, 1, -1), slice(1, 100), slice(5, 2), (slice(None), slice(1, 3)), (E, 0), None, (slice(None), None, 1),
         (E, None), (0, E, 1), (), E, (slice(None, None, -2), 2, slice(4, 0, -3)), (None, 1, None, E, None)]
# Integer-array (advanced) indices, from lists or numpy arrays: numpy's rules for where the
# broadcast index dimensions go (in place when adjacent, in front when separated).
ADVANCED = [[0, 2], [-1, 0, -4], np.array([[0, 1], [2, 0]]), ([0, 1], [1, 2]), (slice(None), [0, 2]),
            ([0, 1], slice(None), [1, 0]), (slice(1, None), [0, 0, 1]), [], (1, [4, 0], slice(None, None, 2)),
            (np.array([[0], [3]]), np.array([1, 2, 3])), (E, [5, 0]), (None, [1, 2], 0)]


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_basic_indexing_matches_numpy(device, rng, dtype):
    x = random_array(rng, (4, 5, 6), dtype)
    for index in BASIC:
        with lf.stream(device):
            got = lf.array(x)[index]
        assert_same(got, x[index])


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_integer_array_indexing_matches_numpy(device, rng, dtype):
    x = random_array(rng, (4, 5, 6), dtype)
    for index in ADVANCED:
        with lf.stream(device):
            got = lf.array(x)[index]
        assert_same(got, x[index])


@pytest.mark.parametrize("idx_dtype", INTS, ids=name)
def test_laneflow_integer_arrays_index_like_numpy_ones(device, rng, idx_dtype):
    x = random_array(rng, (5, 3), lf.float32)
    idx = np.array([4, 0, 2, 2], idx_dtype)
    with lf.stream(device):
        a, i = lf.array(x), lf.array(idx)
        rows, cols, both = a[i], a[:, lf.array(np.array([2, 0], idx_dtype))], a[i, lf.array(np.array([0, 1, 2, 1], idx_dtype))]
    assert_same(rows, x[idx])
    assert_same(cols, x[:, np.array([2, 0])])
    assert_same(both, x[idx, [0, 1, 2, 1]])


def test_negative_laneflow_index_arrays_count_from_the_end(device, rng):
    x = random_array(rng, (5,), lf.int32)
    with lf.stream(device):
        got = lf.array(x)[lf.array([-1, -5, 0])]
    assert_same(got, x[[-1, -5, 0]])


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_numpy_boolean_masks_select_like_numpy(device, rng, dtype):
    x = random_array(rng, (4, 5), dtype)
    full = rng.random((4, 5)) < 0.5
    rows = np.array([True, False, True, True])
    with lf.stream(device):
        a = lf.array(x)
        g1, g2, g3 = a[full], a[rows], a[:, np.zeros(5, bool)]
    assert_same(g1, x[full])
    assert_same(g2, x[rows])
    assert_same(g3, x[:, np.zeros(5, bool)])


def test_indexing_a_0d_array_with_an_empty_tuple_or_ellipsis(device, rng):
    x = random_array(rng, (), lf.float64)
    with lf.stream(device):
        a = lf.array(x)
        e, el, n = a[()], a[...], a[None]
    assert_same(e, x[()])
    assert_same(el, x[...])
    assert_same(n, x[None])


def test_indexing_a_size_0_array(device):
    x = np.zeros((0, 3), np.float32)
    with lf.stream(device):
        a = lf.array(x)
        s, t = a[:, 1], a[[]]
    assert_same(s, x[:, 1])
    assert_same(t, x[[]])


# -- slice assignment --------------------------------------------------------------------------------

SETITEM = [
    (1, "scalar"), (-1, "row"), ((slice(1, 3),), "row"), ((slice(None), 0), "column"), ([0, 2], "scalar"),
    ((E, 1), "scalar"), ((slice(None, None, -2), slice(1, 4)), "block"), (([0, 3], [4, 1]), "pair"),
    ((slice(None), [3, 0]), "sub"), ((), "all"), (E, "scalar"), ((0, 0), "scalar"),
]


def _value(rng, kind, x, index, dtype):
    target = x[index].shape
    if kind == "scalar":
        v = random_array(rng, (), dtype)
        return v.item()
    if kind == "row":
        return random_array(rng, target[-1:], dtype)
    if kind == "column":
        return random_array(rng, (1,) + target, dtype)  # leading size-1 dims are dropped, as in numpy
    return random_array(rng, target, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_setitem_matches_numpy_assignment(device, rng, dtype):
    for index, kind in SETITEM:
        x = random_array(rng, (4, 5), dtype)
        v = _value(rng, kind, x, index, dtype)
        for as_array in (False, True):
            with lf.stream(device):
                a = lf.array(x)
                a[index] = lf.array(v) if as_array and isinstance(v, np.ndarray) else v
            want = x.copy()
            want[index] = v
            assert_same(a, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_setitem_casts_the_value_to_the_array_dtype(device, rng, dtype):
    x = random_array(rng, (3, 4), dtype)
    for v in (np.array([1.75, -0.5, 2.25, 0.0]), np.array([1, 0, 1, 1], np.int8), np.array([True, False, True, True])):
        if np.dtype(dtype).kind == "u" and (v < 0).any():
            v = np.abs(v)
        with lf.stream(device):
            a = lf.array(x)
            a[1] = lf.array(v)
            b = lf.array(x)
            b[2] = v
        want = x.copy()
        with np.errstate(all="ignore"):
            want[1] = v
        want2 = x.copy()
        want2[2] = v
        assert_same(a, want)
        assert_same(b, want2)


def test_setitem_with_a_numpy_boolean_mask(device, rng):
    x = random_array(rng, (4, 5), lf.float32)
    mask = x > 0
    with lf.stream(device):
        a = lf.array(x)
        a[mask] = 0.0
    want = x.copy()
    want[mask] = 0.0
    assert_same(a, want)


def test_setitem_with_laneflow_index_arrays(device, rng):
    x = random_array(rng, (6, 3), lf.int64)
    idx = np.array([5, 1, -2], np.int32)
    v = random_array(rng, (3, 3), lf.int64)
    with lf.stream(device):
        a = lf.array(x)
        a[lf.array(idx)] = lf.array(v)
    want = x.copy()
    want[idx] = v
    assert_same(a, want)


def test_setitem_into_an_empty_selection_changes_nothing(device, rng):
    x = random_array(rng, (3, 4), lf.float64)
    with lf.stream(device):
        a = lf.array(x)
        a[2:1] = 7.0
        a[[]] = 7.0
    assert_same(a, x)


# -- take ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_take_matches_numpy(device, rng, dtype):
    x = random_array(rng, (4, 5, 3), dtype)
    for indices, axis in [([0, 3, 1], 0), ([-1, 2], 1), (np.array([[2, 0], [1, 1]]), -1), ([7, 0, 59], None),
                          (np.array(2), 0), ([], 1), (np.array([[-60]]), None)]:
        with lf.stream(device):
            got = lf.take(lf.array(x), indices, axis=axis)
        assert_same(got, np.take(x, indices, axis=axis))


@pytest.mark.parametrize("idx_dtype", INTS, ids=name)
def test_take_with_laneflow_indices_of_any_integer_dtype(device, rng, idx_dtype):
    x = random_array(rng, (6, 2), lf.float32)
    idx = np.array([5, 0, 3, 3], idx_dtype)
    with lf.stream(device):
        got = lf.take(lf.array(x), lf.array(idx), axis=0)
    assert_same(got, np.take(x, idx, axis=0))
