"""lf.matmul and ``@`` against numpy: 1-D and batched operands with broadcasting, empty dimensions, every
dtype, mixed dtypes, and float32 accumulation for the half types."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import laneflow as lf
from conftest import random_array
from opcheck import DTYPES, HALF, assert_close, assert_same, eps, expected_dtype, is_float, name, up

SHAPES = [((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)), ((2, 3), (3, 4)), ((5, 2, 3), (3, 4)),
          ((2, 1, 2, 3), (5, 3, 4)), ((4,), (2, 4, 3)), ((2, 5, 1), (2, 1, 6)), ((2, 0), (0, 3)),
          ((0, 3), (3, 2)), ((2, 3), (3, 0)), ((1, 1), (1, 1)), ((3, 2, 4), (4,))]


def _check(got, a, b, dtype):
    want = np.matmul(up(a).astype(np.float64) if is_float(a.dtype) else a,
                     up(b).astype(np.float64) if is_float(b.dtype) else b)
    if dtype.kind in "biu":
        with np.errstate(all="ignore"):
            assert_same(got, np.matmul(a.astype(dtype), b.astype(dtype)), dtype)
        return
    k = a.shape[-1]
    acc = eps(lf.float32) if dtype in HALF else eps(dtype)
    scale = float(np.abs(up(a)).max(initial=0)) * float(np.abs(up(b)).max(initial=0))
    assert_close(got, want, dtype, rtol=2 * eps(dtype), atol=2 * (k + 1) * acc * scale + eps(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_matmul_matches_numpy_for_vectors_matrices_and_batches(device, rng, dtype):
    for sa, sb in SHAPES:
        a, b = random_array(rng, sa, dtype), random_array(rng, sb, dtype)
        with lf.stream(device):
            got, op = lf.matmul(lf.array(a), lf.array(b)), lf.array(a) @ lf.array(b)
        _check(got, a, b, np.dtype(dtype))
        _check(op, a, b, np.dtype(dtype))


@pytest.mark.parametrize("da,db", [p for p in itertools.product(DTYPES, DTYPES) if p[0] != p[1]],
                         ids=lambda d: name(d))
def test_matmul_of_mixed_dtypes_promotes_like_numpy(device, rng, da, db):
    a, b = random_array(rng, (2, 3), da), random_array(rng, (3, 4), db)
    with lf.stream(device):
        got = lf.matmul(lf.array(a), lf.array(b))
    dtype = expected_dtype(np.matmul, np.dtype(da), np.dtype(db))
    _check(got, a, b, dtype)


def test_matmul_of_int8_with_uint8_accumulates_in_int32(device):
    # numpy computes in int16 and wraps at 2**15; laneflow has no int16 (laneflow/dtypes.py)
    a, b = np.full((1, 4), 100, np.int8), np.full((4, 1), 200, np.uint8)
    with lf.stream(device):
        got = lf.array(a) @ lf.array(b)
    assert_same(got, np.array([[80_000]], np.int32))


@pytest.mark.parametrize("dtype", HALF, ids=name)
def test_half_precision_matmul_accumulates_in_float32(device, dtype):
    # a half-precision accumulator would stall long before 3000 (2048 for float16, 256 for bfloat16)
    a, b = np.ones((2, 3000), dtype), np.ones((3000, 1), dtype)
    with lf.stream(device):
        got = lf.array(a) @ lf.array(b)
    assert_same(got, np.full((2, 1), 3000.0).astype(dtype), dtype)


@pytest.mark.parametrize("dtype", [lf.int64, lf.float32, lf.float64], ids=name)
def test_matmul_with_empty_inner_dimension_gives_zeros(device, dtype):
    with lf.stream(device):
        got = lf.matmul(lf.zeros((3, 0), dtype), lf.ones((0, 2), dtype))
    assert_same(got, np.zeros((3, 2), dtype))


def test_matmul_accepts_host_data_on_either_side(device, rng):
    a = random_array(rng, (2, 3), lf.float64)
    b = random_array(rng, (3, 2), lf.float64)
    with lf.stream(device):
        x = lf.array(a)
        r1, r2 = lf.matmul(x, b.tolist()), lf.matmul(b, x)
    _check(r1, a, b, np.dtype(np.float64))
    _check(r2, b, a, np.dtype(np.float64))
