"""Reductions, arg-reductions, softmax and logsumexp against numpy: every dtype, axis forms, keepdims,
0-d and size-0 inputs."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import laneflow as lf
from conftest import random_array
from opcheck import DTYPES, FLOATS, HALF, INTS, assert_close, assert_same, eps, expected_dtype, name, up

# (shape, axis): all axes, one axis (positive and negative), several, none, and empty inputs.
AXES = [((), None), ((), ()), ((7,), None), ((7,), 0), ((7,), -1), ((3, 4, 5), None), ((3, 4, 5), 1),
        ((3, 4, 5), -1), ((3, 4, 5), (0, 2)), ((3, 4, 5), (-1, 0)), ((3, 4, 5), ()), ((3, 4, 5), [2, 1, 0]),
        ((0, 4), 0), ((0, 4), 1), ((0, 4), None), ((2, 0, 3), (0, 2))]

REDUCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min, "mean": np.mean,
          "var": np.var, "std": np.std, "any": np.any, "all": np.all}
EXACT = {"max", "min", "any", "all"}


def _axes(shape, axis) -> tuple:
    if axis is None:
        return tuple(range(len(shape)))
    return tuple(a % len(shape) for a in (axis if isinstance(axis, (tuple, list)) else (axis,)))


def _tolerance(op: str, x: np.ndarray, axis, out_dtype) -> dict:
    """Error bounds tied to eps: the final rounding in the result dtype, plus the accumulation error of
    n terms in the accumulator dtype (float32 for the half types)."""
    n = math.prod(x.shape[a] for a in _axes(x.shape, axis)) if x.ndim else 1
    acc = eps(lf.float32) if out_dtype in HALF else eps(out_dtype)
    big = float(np.max(np.abs(up(x).astype(np.float64)))) if x.size else 0.0
    if op == "prod":
        return {"rtol": 2 * eps(out_dtype) + 2 * (n + 1) * acc, "atol": 2 * eps(out_dtype)}
    if op in ("var", "std"):
        return {"rtol": 2 * eps(out_dtype) + 8 * (n + 1) * acc, "atol": 8 * (n + 1) * acc * big * big + eps(out_dtype)}
    scale = 1 if op == "mean" else n
    return {"rtol": 2 * eps(out_dtype), "atol": 2 * (scale + 1) * acc * big + eps(out_dtype) * 2}


def _numpy(op, x, axis, keepdims, **kw):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return REDUCE[op](up(x), axis=tuple(axis) if isinstance(axis, list) else axis, keepdims=keepdims, **kw)


@pytest.mark.parametrize("keepdims", [False, True], ids=["", "keepdims"])
@pytest.mark.parametrize("dtype", DTYPES, ids=name)
@pytest.mark.parametrize("op", list(REDUCE))
def test_reduction_matches_numpy_for_every_axis_form(device, rng, op, dtype, keepdims):
    out = expected_dtype(lambda a: REDUCE[op](a), np.dtype(dtype))
    for shape, axis in AXES:
        x = random_array(rng, shape, dtype)
        empty_axis = any(shape[a] == 0 for a in _axes(shape, axis))
        with lf.stream(device):
            if op in ("max", "min") and empty_axis:
                with pytest.raises(ValueError, match=op):  # numpy: zero-size array ... has no identity
                    getattr(lf, op)(lf.array(x), axis, keepdims)
                continue
            got = getattr(lf, op)(lf.array(x), axis=axis, keepdims=keepdims)
        want = _numpy(op, x, axis, keepdims)
        if op in EXACT or out.kind in "biu":
            assert_same(got, want, out)
        else:
            assert_close(got, want, out, **_tolerance(op, x, axis, out))


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
@pytest.mark.parametrize("op", ["sum", "mean", "max", "any"])
def test_reductions_are_also_array_methods(device, rng, op, dtype):
    x = random_array(rng, (3, 4), dtype)
    with lf.stream(device):
        got = getattr(lf.array(x), op)(axis=0, keepdims=True)
    want = _numpy(op, x, 0, True)
    out = expected_dtype(lambda a: REDUCE[op](a), np.dtype(dtype))
    if op in EXACT or out.kind in "biu":
        assert_same(got, want, out)
    else:
        assert_close(got, want, out, **_tolerance(op, x, 0, out))


@pytest.mark.parametrize("ddof", [1, 2])
@pytest.mark.parametrize("dtype", [lf.int32, lf.float16, lf.bfloat16, lf.float32, lf.float64], ids=name)
@pytest.mark.parametrize("op", ["var", "std"])
def test_var_and_std_with_ddof(device, rng, op, dtype, ddof):
    x = random_array(rng, (4, 6), dtype)
    for axis in (None, 0, -1):
        with lf.stream(device):
            got = getattr(lf, op)(lf.array(x), axis, False, ddof)
            method = getattr(lf.array(x), op)(axis=axis, ddof=ddof)
        want = _numpy(op, x, axis, False, ddof=ddof)
        out = expected_dtype(np.var, np.dtype(dtype))
        assert_close(got, want, out, **_tolerance(op, x, axis, out))
        assert_close(method, want, out, **_tolerance(op, x, axis, out))


def test_var_with_ddof_equal_to_the_count_gives_inf_or_nan_like_numpy(device, rng):
    x = random_array(rng, (3,), lf.float64)
    with lf.stream(device):
        got = lf.var(lf.array(x), ddof=3)
        same = lf.var(lf.array(np.ones(3)), ddof=3)
    assert_same(got, _numpy("var", x, None, False, ddof=3))
    assert_same(same, _numpy("var", np.ones(3), None, False, ddof=3))


# -- accumulation dtypes -------------------------------------------------------------------------------


def test_sum_of_int8_accumulates_in_int64(device):
    x = np.full(1000, 100, np.int8)
    with lf.stream(device):
        got = lf.sum(lf.array(x))
    assert_same(got, np.array(100_000, np.int64))


@pytest.mark.parametrize("dtype", [lf.bool_, lf.int8, lf.int32], ids=name)
def test_sum_and_prod_of_small_ints_and_bools_give_int64_like_numpy(device, rng, dtype):
    x = random_array(rng, (50,), dtype)
    with lf.stream(device):
        s, p = lf.sum(lf.array(x)), lf.prod(lf.array(x[:8]))
    assert_same(s, np.sum(x))
    assert_same(p, np.prod(x[:8]))
    assert s.dtype == p.dtype == lf.int64


def test_sum_and_prod_of_uint8_give_int64_as_documented(device):
    # numpy gives uint64, which laneflow does not have; laneflow accumulates in int64 (laneflow/dtypes.py).
    x = np.full(1000, 200, np.uint8)
    with lf.stream(device):
        s, p = lf.sum(lf.array(x)), lf.prod(lf.array(x[:3]))
    assert_same(s, np.array(200_000, np.int64))
    assert_same(p, np.array(8_000_000, np.int64))


@pytest.mark.parametrize("dtype", HALF, ids=name)
def test_sum_of_float16_and_bfloat16_accumulates_in_float32(device, dtype):
    # In a half-precision accumulator the sum stalls (at 2048 for float16, 256 for bfloat16).
    x = np.ones(3000, dtype)
    with lf.stream(device):
        s, m = lf.sum(lf.array(x)), lf.mean(lf.array(x))
    assert_same(s, np.array(3000.0).astype(dtype))
    assert_same(m, np.array(1.0).astype(dtype))


@pytest.mark.parametrize("dtype", INTS + [lf.bool_], ids=name)
def test_mean_var_std_of_integers_give_float64(device, rng, dtype):
    x = random_array(rng, (5, 6), dtype)
    for op in ("mean", "var", "std"):
        with lf.stream(device):
            got = getattr(lf, op)(lf.array(x), axis=1)
        assert_close(got, _numpy(op, x, 1, False), lf.float64)


@pytest.mark.parametrize("dtype", FLOATS, ids=name)
def test_max_and_min_propagate_nan(device, rng, dtype):
    x = random_array(rng, (3, 5), dtype)
    x[1, 2] = np.nan
    for op in ("max", "min"):
        with lf.stream(device):
            got = getattr(lf, op)(lf.array(x), axis=1)
        assert_same(got, _numpy(op, x, 1, False), dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=name)
def test_sum_and_mean_propagate_nan_and_inf(device, rng, dtype):
    x = random_array(rng, (3, 4), dtype)
    x[0, 1], x[1, 3], x[2, 0], x[2, 2] = np.nan, np.inf, np.inf, -np.inf
    for op in ("sum", "mean", "prod"):
        with lf.stream(device):
            got = getattr(lf, op)(lf.array(x), axis=1)
        assert_close(got, _numpy(op, x, 1, False), dtype, **_tolerance(op, x, 1, dtype))


# -- argmax / argmin ---------------------------------------------------------------------------------

ARG_AXES = [((), None), ((7,), None), ((7,), 0), ((3, 4, 5), None), ((3, 4, 5), 1), ((3, 4, 5), -1),
            ((3, 4, 5), 0), ((4, 0), 0)]


@pytest.mark.parametrize("keepdims", [False, True], ids=["", "keepdims"])
@pytest.mark.parametrize("dtype", DTYPES, ids=name)
@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_argmax_argmin_return_the_first_extreme_index(device, rng, op, dtype, keepdims):
    for shape, axis in ARG_AXES:
        x = random_array(rng, shape, dtype)
        if x.size > 3 and np.dtype(dtype) != lf.bool_:
            x.flat[1] = x.flat[-2] = (x.max() if op == "argmax" else x.min())  # ties: the first one wins
        with lf.stream(device):
            got = getattr(lf, op)(lf.array(x), axis=axis, keepdims=keepdims)
        assert_same(got, getattr(np, op)(up(x), axis=axis, keepdims=keepdims), lf.int64)


@pytest.mark.parametrize("dtype", FLOATS, ids=name)
def test_argmax_and_argmin_find_the_first_nan_like_numpy(device, rng, dtype):
    x = random_array(rng, (3, 6), dtype)
    x[0, 4] = x[0, 2] = x[2, 5] = np.nan
    for op in ("argmax", "argmin"):
        with lf.stream(device):
            got = getattr(lf, op)(lf.array(x), axis=1)
            flat = getattr(lf, op)(lf.array(x))
        assert_same(got, getattr(np, op)(up(x), axis=1))
        assert_same(flat, getattr(np, op)(up(x)))


# -- softmax and logsumexp ---------------------------------------------------------------------------


def _softmax64(x, axis):
    x = up(x).astype(np.float64)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True, initial=-np.inf))
    return e / np.sum(e, axis=axis, keepdims=True)


def _logsumexp64(x, axis, keepdims):
    x = up(x).astype(np.float64)
    m = np.max(x, axis=axis, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0)
    r = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return r if keepdims else np.squeeze(r, axis=axis)


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_softmax_sums_to_one_and_matches_the_definition(device, rng, dtype):
    out = expected_dtype(np.exp, np.dtype(dtype))
    for shape, axis in [((7,), -1), ((3, 4, 5), -1), ((3, 4, 5), 0), ((3, 4, 5), (0, 2)), ((3, 4, 5), None),
                        ((2, 0), -1), ((3, 0), 0), ((), None),
                        # rows of the one-warp kernel (padded, up to 2048) and longer ones (block kernel)
                        ((4, 33), -1), ((3, 1000), 1), ((2, 2048), -1), ((2, 1500), -1), ((2, 3000), -1)]:
        x = random_array(rng, shape, dtype)
        with lf.stream(device):
            got = lf.softmax(lf.array(x), axis=axis) if axis != -1 else lf.softmax(lf.array(x))
        assert_close(got, _softmax64(x, axis), out, ulps=8)


@pytest.mark.parametrize("keepdims", [False, True], ids=["", "keepdims"])
@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_logsumexp_matches_the_definition(device, rng, dtype, keepdims):
    out = expected_dtype(np.exp, np.dtype(dtype))
    for shape, axis in [((7,), None), ((3, 4, 5), 1), ((3, 4, 5), -1), ((3, 4, 5), (0, 2)), ((), None),
                        ((2, 0), 0), ((2, 0), 1), ((0,), None), ((4, 33), 1), ((2, 1500), -1), ((2, 3000), -1)]:
        x = random_array(rng, shape, dtype)
        with lf.stream(device):
            got = lf.logsumexp(lf.array(x), axis=axis, keepdims=keepdims)
        with np.errstate(divide="ignore"):
            want = _logsumexp64(x, axis, keepdims)
        assert_close(got, want, out, ulps=8)


@pytest.mark.parametrize("dtype", FLOATS, ids=name)
def test_softmax_and_logsumexp_are_stable_for_large_and_infinite_inputs(device, dtype):
    big = 60000.0 if dtype == lf.float16 else 1e30 if dtype != lf.float64 else 1e300
    x = np.array([[big, big, -np.inf], [-np.inf, -np.inf, -np.inf]], dtype)
    with lf.stream(device):
        s = lf.softmax(lf.array(x[:1]), axis=1)
        lse = lf.logsumexp(lf.array(x), axis=1)
    assert_close(s, np.array([[0.5, 0.5, 0.0]]), dtype)
    assert_close(lse, np.array([float(x[0, 0]) + math.log(2), -np.inf]), dtype)
