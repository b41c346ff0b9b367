"""Dtypes and promotion: numpy 2 rules (NEP 50 weak Python scalars), laneflow's written bfloat16 rule
(it promotes like float16; with float16 it gives float32) and the wider stand-ins for numpy dtypes
laneflow lacks (int8 with uint8 gives int32, not int16). See laneflow/dtypes.py."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

import laneflow as lf
from opcheck import DTYPES, name

ALL = DTYPES + [lf.uint32]
BF = lf.bfloat16

# bfloat16's row of the table, written out by hand (what float16 gives, except with float16 itself).
BFLOAT16_ROW = {
    lf.bool_: BF, lf.int8: BF, lf.uint8: BF, lf.int32: lf.float64, lf.uint32: lf.float64, lf.int64: lf.float64,
    lf.float16: lf.float32, BF: BF, lf.float32: lf.float32, lf.float64: lf.float64,
}


def _expected(a, b) -> np.dtype:
    if a == BF:
        return BFLOAT16_ROW[b]
    if b == BF:
        return BFLOAT16_ROW[a]
    r = np.result_type(a, b)
    return np.dtype(np.int32) if r == np.int16 else r


@pytest.mark.parametrize("a,b", list(itertools.product(ALL, ALL)), ids=lambda d: name(d))
def test_promotion_table_and_ops_follow_it(device, a, b):
    want = _expected(a, b)
    assert lf.result_type(a, b) == want
    assert lf.result_type(b, a) == want
    with lf.stream(device):
        x, y = lf.ones((2,), a), lf.ones((2,), b)
        s, w, c = x + y, lf.where(lf.array([True, False]), x, y), lf.concatenate([x, y])
    for r in (s, w, c):
        assert r.dtype == want
    assert np.asarray(s).dtype == want and np.asarray(c).dtype == want


@pytest.mark.parametrize("dtypes,want", [
    ((lf.int8, lf.uint8), lf.int32),  # numpy: int16, which laneflow lacks
    ((lf.uint8, lf.int32), lf.int32), ((lf.int32, lf.uint32), lf.int64), ((lf.int64, lf.uint32), lf.int64),
    ((lf.int32, lf.float16), lf.float64), ((lf.int8, lf.float16), lf.float16), ((lf.bool_, lf.int8), lf.int8),
    ((BF, lf.float16), lf.float32), ((BF, lf.float16, lf.int8), lf.float32), ((BF, lf.int8, lf.bool_), BF),
    ((lf.uint8, lf.int8, lf.bool_), lf.int32),
], ids=lambda v: "-".join(map(name, v)) if isinstance(v, tuple) else name(v))
def test_hand_written_promotions_of_two_and_three_dtypes(device, dtypes, want):
    assert lf.result_type(*dtypes) == want
    with lf.stream(device):
        parts = [lf.ones((1,), d) for d in dtypes]
        total = parts[0]
        for p in parts[1:]:
            total = total + p
        cat = lf.concatenate(parts)
    assert total.dtype == cat.dtype == want
    assert np.asarray(total).tolist() == [len(dtypes)] if want != lf.bool_ else True


# (array dtype, Python scalar) -> result: the scalar takes the array's dtype where its kind allows.
WEAK = [
    (lf.int8, 1, lf.int8), (lf.int8, 1.5, lf.float64), (lf.uint8, True, lf.uint8), (lf.bool_, 1, lf.int64),
    (lf.bool_, 1.5, lf.float64), (lf.bool_, True, lf.bool_), (lf.float16, 1.5, lf.float16), (lf.float16, 7, lf.float16),
    (BF, 1, BF), (BF, 2.5, BF), (lf.float32, 1, lf.float32), (lf.float32, 1e300, lf.float32),
    (lf.int64, 1.0, lf.float64), (lf.int32, 2**40, lf.int32), (lf.uint32, 3, lf.uint32), (lf.float64, True, lf.float64),
]


@pytest.mark.parametrize("dtype,scalar,want", WEAK, ids=repr)
def test_python_scalars_are_weak(device, dtype, scalar, want):
    assert lf.result_type(dtype, scalar) == want
    assert lf.result_type(scalar, dtype) == want
    if isinstance(scalar, int) and not isinstance(scalar, bool) and np.dtype(dtype).kind in "iu" \
            and scalar > np.iinfo(dtype).max:
        return  # the dtype is int32, but the value does not fit: lf.add refuses it (test_errors)
    with lf.stream(device):
        r = lf.ones((3,), dtype) + scalar
    assert r.dtype == want and np.asarray(r).dtype == want


def test_numpy_scalars_are_strong(device):
    assert lf.result_type(lf.int8, np.int32(1)) == lf.int32
    assert lf.result_type(lf.float16, np.float32(1)) == lf.float32
    assert lf.result_type(BF, np.float64(1)) == lf.float64
    with lf.stream(device):
        r = lf.ones((2,), lf.int8) * np.float32(2)
    assert r.dtype == lf.float32


@pytest.mark.parametrize("spec,want", [
    ("float32", lf.float32), (np.float32, lf.float32), (float, lf.float64), (int, lf.int64), (bool, lf.bool_),
    ("bool", lf.bool_), ("bfloat16", BF), (ml_dtypes.bfloat16, BF), (lf.float16, lf.float16), ("uint8", lf.uint8),
    (np.dtype("int64"), lf.int64), ("float", lf.float64), ("int", lf.int64),
], ids=repr)
def test_dtype_accepts_names_types_and_dtypes(device, spec, want):
    assert lf.dtype(spec) == want
    with lf.stream(device):
        assert lf.zeros((1,), spec).dtype == want


@pytest.mark.parametrize("spec", [np.clongdouble, str, "str", object, np.int16, "int16", np.uint64,
                                  "float128", "nonsense"], ids=repr)
def test_unsupported_dtypes_raise_type_error_naming_them(device, spec):
    with pytest.raises(TypeError, match="dtype"):
        lf.dtype(spec)
    with lf.stream(device):
        with pytest.raises(TypeError, match="zeros|full"):
            lf.zeros((2,), spec)


def test_bfloat16_is_ml_dtypes_bfloat16_and_the_dtype_objects_are_numpy_dtypes(device):
    assert lf.bfloat16 == np.dtype(ml_dtypes.bfloat16)
    for d in ALL:
        assert isinstance(d, np.dtype)
        with lf.stream(device):
            assert np.asarray(lf.ones((1,), d)).dtype == d
    assert [str(d) for d in DTYPES] == ["bool", "int8", "uint8", "int32", "uint32", "int64", "float16", "bfloat16",
                                        "float32", "float64"]
