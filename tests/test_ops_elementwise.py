"""Elementwise ops against numpy: every dtype, broadcasting, 0-d and size-0 shapes, weak scalars."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import laneflow as lf
from laneflow.ops.table import ELEMENTWISE
from conftest import random_array
from opcheck import (
    DTYPES, FLOATS, INTS, assert_close, assert_same, erf64, expected_dtype, is_float, name,
    numpy_error, up,
)

# Every binary op of the op table, against its numpy ufunc (a new row is tested here by itself).
BINARY = {r.name: r.ufunc for r in ELEMENTWISE.values() if r.arity == 2 and r.numpy and not r.predicate}
COMPARE = {r.name: r.ufunc for r in ELEMENTWISE.values() if r.arity == 2 and r.predicate and r.numpy
           and not r.name.startswith("logical_")}
LOGICAL = {r.name: r.ufunc for r in ELEMENTWISE.values() if r.arity == 2 and r.name.startswith("logical_")}

# (shape of a, shape of b): scalars, vectors, broadcasting both ways, and size-0 results.
SHAPE_PAIRS = [((), ()), ((5,), ()), ((), (3,)), ((2, 3), (3,)), ((4, 1, 3), (2, 1)),
               ((0, 3), (1, 3)), ((2, 0), (2, 1)), ((3, 1), (1, 0))]
UNARY_SHAPES = [(), (0,), (7,), (3, 4, 5)]


def _nonzero(rng, x: np.ndarray) -> np.ndarray:
    """x with its zeros replaced, for divisors."""
    one = np.ones((), x.dtype)
    return np.where(x == 0, one, x).astype(x.dtype)


def _binary_inputs(rng, op: str, shape_a, shape_b, dtype):
    a = random_array(rng, shape_a, dtype)
    b = random_array(rng, shape_b, dtype)
    if op in ("divide", "floor_divide", "remainder"):
        b = _nonzero(rng, b)
    if op == "power" and not is_float(dtype):
        b = rng.integers(0, 4, size=shape_b).astype(dtype)  # integer powers: non-negative exponents
    return a, b


# -- binary arithmetic -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_arithmetic_matches_numpy_with_broadcasting(device, rng, op, dtype):
    fn, npfn = getattr(lf, op), BINARY[op]
    for sa, sb in SHAPE_PAIRS:
        a, b = _binary_inputs(rng, op, sa, sb, dtype)
        with lf.stream(device):
            if numpy_error(npfn, a, b):
                with pytest.raises(numpy_error(npfn, a, b), match=op):
                    fn(lf.array(a), lf.array(b))
                return
            got = fn(lf.array(a), lf.array(b))
        with np.errstate(all="ignore"):
            want = npfn(up(a), up(b))
        exact = op in ("maximum", "minimum")
        ulps = 8 if op == "power" else 4
        (assert_same if exact else assert_close)(got, want, expected_dtype(npfn, dtype, dtype),
                                                 **({} if exact else {"ulps": ulps}))


# Shapes that take the GPU's vector kernels (a row or a column of the output, rows a multiple of 4
# long) and neighbours that do not (odd widths, a row that is not the last dim).
VECTOR_CASES = [((8, 16), (16,)), ((8, 16), (8, 1)), ((2, 8, 12), (12,)), ((2, 8, 12), (2, 8, 1)),
                ((2, 8, 12), (8, 1)), ((6, 6), (6,)), ((5, 8), (1, 8)), ((64,), (64,)), ((3, 4), (1,))]


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
@pytest.mark.parametrize("op", ["add", "multiply", "subtract"])
def test_row_and_column_broadcasts_match_numpy_bit_for_bit(device, rng, op, dtype):
    if op == "subtract" and dtype == lf.bool_:
        pytest.skip("numpy refuses subtracting booleans (tested with the other errors)")
    fn, npfn = getattr(lf, op), BINARY[op]
    for sa, sb in VECTOR_CASES:
        a, b = random_array(rng, sa, dtype), random_array(rng, sb, dtype)
        with lf.stream(device):
            got, rev = fn(lf.array(a), lf.array(b)), fn(lf.array(b), lf.array(a))
        with np.errstate(all="ignore"):
            assert_same(got, npfn(a, b))
            assert_same(rev, npfn(b, a))


def test_views_at_odd_offsets_and_fused_row_column_expressions_match_numpy(device, rng):
    """A slice starting one element in (an unaligned pointer where slicing makes a view: the GPU takes
    its grid-stride kernel) and a fused ``(x - m) * s + b`` reading a column and a row."""
    x = random_array(rng, (17,), np.float32)
    y = random_array(rng, (16,), np.float32)
    m = random_array(rng, (8, 16), np.float32)
    col = m.max(axis=1, keepdims=True)
    bias = random_array(rng, (16,), np.float32)
    with lf.stream(device):
        got = lf.array(x)[1:] + lf.array(y)
        fused = (lf.array(m) - lf.array(col)) * 0.5 + lf.array(bias)
    assert_same(got, x[1:] + y)
    assert_same(fused, (m - col) * np.float32(0.5) + bias)


@pytest.mark.parametrize("da,db", list(itertools.product(DTYPES, DTYPES)), ids=lambda d: name(d))
def test_mixed_dtype_add_divide_maximum_promote_like_numpy(device, rng, da, db):
    a = random_array(rng, (3, 4), da)
    b = _nonzero(rng, random_array(rng, (4,), db))
    for op in ("add", "divide", "maximum"):
        npfn = BINARY[op]
        with lf.stream(device):
            got = getattr(lf, op)(lf.array(a), lf.array(b))
        with np.errstate(all="ignore"):
            want = npfn(up(a).astype(np.float64) if is_float(da) else a,
                        up(b).astype(np.float64) if is_float(db) else b)
        dtype = expected_dtype(npfn, np.dtype(da), np.dtype(db))
        if op == "maximum":
            assert_same(got, want, dtype)
        else:
            assert_close(got, want, dtype)


@pytest.mark.parametrize("dtype", INTS, ids=name)
def test_integer_division_by_zero_gives_zero_like_numpy(device, rng, dtype):
    a = random_array(rng, (6,), dtype)
    zero = np.zeros(6, dtype)
    with lf.stream(device):
        q = lf.floor_divide(lf.array(a), lf.array(zero))
        r = lf.remainder(lf.array(a), lf.array(zero))
    with np.errstate(all="ignore"):
        assert_same(q, np.floor_divide(a, zero))
        assert_same(r, np.remainder(a, zero))


@pytest.mark.parametrize("dtype", FLOATS, ids=name)
def test_float_division_by_zero_gives_inf_and_nan(device, dtype):
    a = np.array([1.0, -1.0, 0.0], dtype)
    with lf.stream(device):
        got = lf.array(a) / lf.array(np.zeros(3, dtype))
    assert_same(got, np.array([np.inf, -np.inf, np.nan]), dtype)


@pytest.mark.parametrize("dtype", INTS, ids=name)
def test_integer_floor_divide_and_remainder_round_towards_minus_infinity(device, dtype):
    a = np.array([7, 7, 0, 5], dtype) if dtype.kind == "u" else np.array([7, -7, 7, -7], dtype)
    b = np.array([2, 3, 4, 5], dtype) if dtype.kind == "u" else np.array([2, 2, -2, -2], dtype)
    with lf.stream(device):
        q, r = lf.floor_divide(lf.array(a), lf.array(b)), lf.remainder(lf.array(a), lf.array(b))
    assert_same(q, np.floor_divide(a, b))
    assert_same(r, np.remainder(a, b))


@pytest.mark.parametrize("dtype", [lf.int8, lf.uint8, lf.int32], ids=name)
def test_integer_add_and_multiply_wrap_around_like_numpy(device, dtype):
    info = np.iinfo(dtype)
    a = np.array([info.max, info.min, info.max], dtype)
    b = np.array([1, -1 if info.min < 0 else 0, 2], dtype)
    with lf.stream(device):
        s, p = lf.array(a) + lf.array(b), lf.array(a) * lf.array(b)
    with np.errstate(all="ignore"):
        assert_same(s, a + b)
        assert_same(p, a * b)


@pytest.mark.parametrize("dtype", FLOATS, ids=name)
def test_maximum_and_minimum_propagate_nan(device, rng, dtype):
    a = random_array(rng, (5,), dtype)
    a[[1, 3]] = np.nan
    b = random_array(rng, (5,), dtype)
    b[2] = np.nan
    with lf.stream(device):
        mx, mn = lf.maximum(lf.array(a), lf.array(b)), lf.minimum(lf.array(a), lf.array(b))
    assert_same(mx, np.maximum(up(a), up(b)), dtype)
    assert_same(mn, np.minimum(up(a), up(b)), dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=name)
def test_power_of_negative_base_to_fractional_exponent_is_nan(device, dtype):
    with lf.stream(device):
        got = lf.power(lf.array(np.array([-2.0, 4.0, -8.0], dtype)), lf.array(np.array([0.5, 0.5, 2.0], dtype)))
    assert_close(got, np.array([np.nan, 2.0, 64.0]), dtype)


# -- weak Python scalars and numpy operands ---------------------------------------------------------


SCALARS = [3, -2, 2.5, True]


@pytest.mark.parametrize("scalar", SCALARS, ids=repr)
@pytest.mark.parametrize("dtype", DTYPES, ids=name)
@pytest.mark.parametrize("op", ["add", "subtract", "multiply", "divide", "maximum", "power"])
def test_python_scalar_operands_are_weak_on_either_side(device, rng, op, dtype, scalar):
    npfn = BINARY[op]
    a = random_array(rng, (2, 3), dtype)
    int_like = np.dtype(dtype).kind in "biu"
    for left in (False, True):
        if op == "power" and int_like and not isinstance(scalar, float) and (left or scalar < 0):
            continue  # integer powers with negative exponents are an execution error (test_errors)
        operands = (scalar, np.dtype(dtype)) if left else (np.dtype(dtype), scalar)
        with lf.stream(device):
            x = lf.array(a)
            call = (lambda: getattr(lf, op)(scalar, x)) if left else (lambda: getattr(lf, op)(x, scalar))
            error = numpy_error(npfn, *((scalar, a) if left else (a, scalar)))
            if error is not None:  # no loop (TypeError) or a Python int out of range (OverflowError)
                with pytest.raises(error, match=op):
                    call()
                continue
            got = call()
        with np.errstate(all="ignore"):
            want = npfn(scalar, up(a)) if left else npfn(up(a), scalar)
        assert_close(got, want, expected_dtype(npfn, *operands), ulps=8)


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_numpy_scalars_and_arrays_are_strongly_typed_operands(device, rng, dtype):
    a = random_array(rng, (4,), dtype)
    for other in (np.float32(1.5), np.int32(3), np.uint8(7), np.array([1, 2, 3, 4], np.int32), np.array(2.0)):
        with lf.stream(device):
            got = lf.add(lf.array(a), other)
        want = (up(a).astype(np.float64) if is_float(dtype) else a.astype(np.int64)) + other
        assert_close(got, want, expected_dtype(np.add, np.dtype(dtype), np.dtype(other.dtype)))


def test_two_python_scalars_give_a_0d_array_of_the_default_dtype(device):
    with lf.stream(device):
        i, f, b = lf.add(2, 3), lf.multiply(2, 1.5), lf.logical_and(True, False)
    assert_same(i, np.array(5, np.int64))
    assert_same(f, np.array(3.0))
    assert_same(b, np.array(False))


# -- comparisons and logic ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
@pytest.mark.parametrize("op", list(COMPARE))
def test_comparisons_match_numpy_including_ties(device, rng, op, dtype):
    for sa, sb in SHAPE_PAIRS:
        a, b = random_array(rng, sa, dtype), random_array(rng, sb, dtype)
        if a.size and b.size and a.shape == b.shape:
            b.flat[::2] = a.flat[::2]  # ties
        with lf.stream(device):
            got = getattr(lf, op)(lf.array(a), lf.array(b))
        assert_same(got, COMPARE[op](up(a), up(b)), lf.bool_)


@pytest.mark.parametrize("da,db", list(itertools.product(DTYPES, DTYPES)), ids=lambda d: name(d))
def test_mixed_dtype_comparisons_compare_values_not_bits(device, rng, da, db):
    a = random_array(rng, (8,), da)
    b = random_array(rng, (8,), db)
    b[:3] = a[:3].astype(db)
    for op in ("less", "equal"):
        with lf.stream(device):
            got = getattr(lf, op)(lf.array(a), lf.array(b))
        want = COMPARE[op](up(a).astype(np.float64) if is_float(da) else a,
                           up(b).astype(np.float64) if is_float(db) else b)
        assert_same(got, want, lf.bool_)


@pytest.mark.parametrize("dtype", FLOATS, ids=name)
def test_comparisons_with_nan_are_false_except_not_equal(device, dtype):
    a = np.array([np.nan, 1.0, np.nan], dtype)
    b = np.array([np.nan, np.nan, 1.0], dtype)
    for op, npfn in COMPARE.items():
        with lf.stream(device):
            got = getattr(lf, op)(lf.array(a), lf.array(b))
        assert_same(got, npfn(up(a), up(b)))


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
@pytest.mark.parametrize("op", list(LOGICAL))
def test_logical_binary_ops_treat_nonzero_as_true(device, rng, op, dtype):
    for sa, sb in SHAPE_PAIRS:
        a, b = random_array(rng, sa, dtype), random_array(rng, sb, dtype)
        if a.size:
            a.flat[0] = 0
        with lf.stream(device):
            got = getattr(lf, op)(lf.array(a), lf.array(b))
        assert_same(got, LOGICAL[op](a, b))


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_logical_not_treats_nonzero_as_true(device, rng, dtype):
    for shape in UNARY_SHAPES:
        a = random_array(rng, shape, dtype)
        if a.size:
            a.flat[0] = 0
        with lf.stream(device):
            got = lf.logical_not(lf.array(a))
        assert_same(got, np.logical_not(a))


# -- unary math --------------------------------------------------------------------------------------


def _sigmoid64(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def _rsqrt64(x):
    with np.errstate(divide="ignore"):
        return 1.0 / np.sqrt(np.asarray(x, np.float64))


# op -> (numpy reference on float64, numpy ufunc that gives the dtype, domain of the inputs)
UNARY = {
    "negative": (np.negative, np.negative, "any"),
    "abs": (np.abs, np.abs, "any"),
    "sign": (np.sign, np.sign, "any"),
    "square": (np.square, np.square, "any"),
    "exp": (np.exp, np.exp, "any"),
    "log": (np.log, np.log, "positive"),
    "log1p": (np.log1p, np.log1p, "positive"),
    "sqrt": (np.sqrt, np.sqrt, "positive"),
    "rsqrt": (_rsqrt64, np.sqrt, "positive"),
    "sin": (np.sin, np.sin, "any"),
    "cos": (np.cos, np.cos, "any"),
    "tanh": (np.tanh, np.tanh, "any"),
    "sigmoid": (_sigmoid64, np.exp, "any"),
    "erf": (erf64, np.exp, "any"),
    # the array API's names (numpy's ufuncs under them)
    "acos": (np.arccos, np.arccos, "unit"), "asin": (np.arcsin, np.arcsin, "unit"),
    "atanh": (np.arctanh, np.arctanh, "unit"), "acosh": (np.arccosh, np.arccosh, "above_one"),
    "asinh": (np.arcsinh, np.arcsinh, "any"), "atan": (np.arctan, np.arctan, "any"),
    "cosh": (np.cosh, np.cosh, "unit"), "sinh": (np.sinh, np.sinh, "unit"), "tan": (np.tan, np.tan, "unit"),
    "expm1": (np.expm1, np.expm1, "any"), "log2": (np.log2, np.log2, "positive"),
    "log10": (np.log10, np.log10, "positive"), "ceil": (np.ceil, np.ceil, "any"),
    "floor": (np.floor, np.floor, "any"), "trunc": (np.trunc, np.trunc, "any"),
    "positive": (np.positive, np.positive, "any"), "reciprocal": (np.reciprocal, np.reciprocal, "positive"),
    "bitwise_invert": (np.invert, np.invert, "any"),
}
EXACT_UNARY = {"negative", "abs", "sign", "ceil", "floor", "trunc", "positive"}


def _unary_input(rng, shape, dtype, domain):
    a = random_array(rng, shape, dtype)
    if domain == "positive" and np.dtype(dtype) != lf.bool_:
        a = (np.abs(a.astype(np.float64)) + (0.125 if is_float(dtype) else 1)).astype(dtype)
    elif domain == "unit":  # inside (-1, 1): acos, asin, atanh (and no overflow for cosh, sinh, tan)
        a = rng.uniform(-0.9, 0.9, size=shape).astype(dtype)
    elif domain == "above_one":
        a = (np.abs(a.astype(np.float64)) + 1).astype(dtype)
    return a


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
@pytest.mark.parametrize("op", list(UNARY))
def test_unary_math_matches_numpy(device, rng, op, dtype):
    ref, dtype_from, domain = UNARY[op]
    for shape in UNARY_SHAPES:
        a = _unary_input(rng, shape, dtype, domain)
        with lf.stream(device):
            if numpy_error(dtype_from, a):
                with pytest.raises(TypeError, match=op):
                    getattr(lf, op)(lf.array(a))
                return
            got = getattr(lf, op)(lf.array(a))
        out = expected_dtype(dtype_from, np.dtype(dtype))
        if out.kind in "biu" or op in EXACT_UNARY:
            with np.errstate(all="ignore"):
                assert_same(got, ref(up(a)), out)
        else:
            with np.errstate(all="ignore"):
                want = ref(up(a).astype(np.float64))
            assert_close(got, want, out, ulps=4 if op == "square" else 8)


@pytest.mark.parametrize("dtype", FLOATS, ids=name)
def test_unary_math_outside_the_domain_gives_nan_and_inf_like_numpy(device, dtype):
    x = np.array([0.0, -1.0, np.inf, -np.inf, np.nan], dtype)
    for op in ("log", "log1p", "sqrt", "rsqrt", "exp", "tanh", "sigmoid", "erf", "sign", "abs"):
        ref = UNARY[op][0]
        with lf.stream(device):
            got = getattr(lf, op)(lf.array(x))
        with np.errstate(all="ignore"):
            want = ref(x.astype(np.float64))
        assert_close(got, want, dtype, ulps=8)


@pytest.mark.parametrize("dtype", FLOATS, ids=name)
def test_exp_overflows_to_inf_in_the_result_dtype(device, dtype):
    big = 12.0 if dtype == lf.float16 else (89.0 if dtype in (lf.bfloat16, lf.float32) else 710.0)
    with lf.stream(device):
        got = lf.exp(lf.array(np.array([big, -big * 10], dtype)))
    assert_same(got, np.array([np.inf, 0.0]), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_isnan_and_isfinite_find_nan_and_inf(device, rng, dtype):
    a = random_array(rng, (3, 4), dtype)
    if is_float(dtype):
        a[0, 0], a[1, 2], a[2, 3] = np.nan, np.inf, -np.inf
    with lf.stream(device):
        n, f = lf.isnan(lf.array(a)), lf.isfinite(lf.array(a))
    assert_same(n, np.isnan(up(a)))
    assert_same(f, np.isfinite(up(a)))


# -- where and clip ----------------------------------------------------------------------------------

WHERE_SHAPES = [((), (), ()), ((3,), (2, 3), ()), ((2, 1, 4), (3, 1), (4,)), ((0, 2), (2,), ()),
                ((2, 3), (2, 3), (2, 3))]


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_where_picks_x_or_y_with_three_way_broadcasting(device, rng, dtype):
    for sc, sx, sy in WHERE_SHAPES:
        c = random_array(rng, sc, lf.bool_)
        x, y = random_array(rng, sx, dtype), random_array(rng, sy, dtype)
        with lf.stream(device):
            got = lf.where(lf.array(c), lf.array(x), lf.array(y))
        assert_same(got, np.where(c, up(x), up(y)), dtype)


@pytest.mark.parametrize("dx,dy", [(lf.int8, lf.uint8), (lf.int32, lf.float32), (lf.bfloat16, lf.float16),
                                   (lf.bfloat16, lf.int8), (lf.bool_, lf.float16), (lf.uint8, lf.int64)],
                         ids=lambda d: name(d))
def test_where_promotes_x_and_y_like_numpy(device, rng, dx, dy):
    c = random_array(rng, (5,), lf.bool_)
    x, y = random_array(rng, (5,), dx), random_array(rng, (5,), dy)
    with lf.stream(device):
        got = lf.where(lf.array(c), lf.array(x), lf.array(y))
    want = np.where(c, up(x).astype(np.float64), up(y).astype(np.float64))
    assert_same(got, want, expected_dtype(lambda a, b: np.where(True, a, b), np.dtype(dx), np.dtype(dy)))


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_where_with_a_nonbool_condition_and_python_scalars(device, rng, dtype):
    cond = random_array(rng, (2, 3), dtype)  # nonzero counts as true, as in numpy
    x = random_array(rng, (2, 3), lf.int8)
    with lf.stream(device):
        got1 = lf.where(lf.array(cond), lf.array(x), 7)
        got2 = lf.where(lf.array(cond), 1.5, lf.array(x))
        got3 = lf.where(lf.array(cond), 1, 2)
    assert_same(got1, np.where(cond, x, 7))
    assert_same(got2, np.where(cond, 1.5, x))
    assert_same(got3, np.where(cond, 1, 2))


@pytest.mark.parametrize("dtype", [lf.int8, lf.uint8, lf.int64, lf.float16, lf.bfloat16, lf.float32, lf.float64],
                         ids=name)
def test_clip_limits_values_like_numpy(device, rng, dtype):
    a = random_array(rng, (4, 5), dtype)
    lo, hi = (5, 60) if dtype.kind == "u" else ((-1, 1) if is_float(dtype) else (-20, 20))
    lo_arr = random_array(rng, (5,), dtype)
    with lf.stream(device):
        x = lf.array(a)
        both, low_only, high_only = lf.clip(x, lo, hi), lf.clip(x, lo, None), lf.clip(x, None, hi)
        arr_bound = lf.clip(x, lf.array(lo_arr), hi)
        wide = lf.clip(x, 0.5, None)
    assert_same(both, np.clip(up(a), lo, hi), dtype)
    assert_same(low_only, np.maximum(up(a), lo), dtype)
    assert_same(high_only, np.minimum(up(a), hi), dtype)
    assert_same(arr_bound, np.minimum(np.maximum(up(a), up(lo_arr)), hi), dtype)
    assert_same(wide, np.maximum(up(a).astype(np.float64), 0.5), expected_dtype(np.maximum, np.dtype(dtype), 0.5))


def test_clip_with_min_above_max_gives_max_like_numpy(device, rng):
    a = random_array(rng, (6,), lf.float32)
    with lf.stream(device):
        got = lf.clip(lf.array(a), 1.0, -1.0)
    assert_same(got, np.clip(a, 1.0, -1.0))


@pytest.mark.parametrize("dtype", [lf.uint8, lf.int8, lf.int32], ids=name)
def test_comparing_with_python_ints_outside_the_dtype_compares_values(device, rng, dtype):
    # numpy 2 compares exactly, even where the Python int does not fit the array's dtype
    x = random_array(rng, (7,), dtype)
    for v in (-1, -129, 256, 2**40):
        for op, npfn in COMPARE.items():
            with lf.stream(device):
                got, rev = getattr(lf, op)(lf.array(x), v), getattr(lf, op)(v, lf.array(x))
            assert_same(got, npfn(x, v))
            assert_same(rev, npfn(v, x))


def test_comparing_with_ints_at_the_edge_of_the_dtype_range_in_either_order(device):
    # -128 fits int8 and -129 does not, though both have the same bit length: kernels must not be shared
    x8 = np.arange(-5, 5, dtype=np.int8)
    with lf.stream(device):
        x = lf.array(x8)
        for v in (-128, -129, 127, 128, -128):
            np.testing.assert_array_equal(np.asarray(x == v), x8 == v)
            np.testing.assert_array_equal(np.asarray(x > v), x8 > v)


def test_integer_power_with_a_negative_exponent_computed_on_the_device_raises(device):
    base = np.array([2, 3, 4], np.int32)
    with lf.stream(device):
        e = lf.array(np.array([1, 2, 3], np.int32)) - 2      # [-1, 0, 1], never read on the host
        y = lf.array(base) ** e
        with pytest.raises(lf.ExecutionError, match="negative integer powers"):
            lf.eval(y)
        ok = lf.array(base) ** (lf.array(np.array([1, 2, 3], np.int32)) - 1)
        np.testing.assert_array_equal(np.asarray(ok), base ** np.array([0, 1, 2], np.int32))


def test_ops_sharing_primitives_keep_each_scalar_its_sign_type_and_value(device):
    # the fast paths share one primitive per (op, scalar) (ops/elementwise.py); 0.0 and -0.0 are
    # equal keys, NaN never equals itself, and 1 and 1.0 hash alike: none may be confused
    with lf.stream(device):
        x = lf.array(np.array([-0.0, 1.5, -2.0], np.float32))
        for _ in range(2):  # the second round finds the cached primitives
            neg, pos = np.asarray(x + (-0.0)), np.asarray(x + 0.0)
            assert np.signbit(neg[0]) and not np.signbit(pos[0])
            assert np.isnan(np.asarray(x + float("nan"))).all()
            np.testing.assert_array_equal(np.asarray(x * 3), np.asarray(x) * np.float32(3))
            np.testing.assert_array_equal(np.asarray(x * 3.5), np.asarray(x) * np.float32(3.5))
            np.testing.assert_allclose(np.asarray(lf.exp(x) - lf.exp(x + 1.0)),
                                       np.exp(np.asarray(x)) - np.exp(np.asarray(x) + np.float32(1.0)), rtol=1e-6)


@pytest.mark.parametrize("dtype", FLOATS, ids=name)
def test_logaddexp_of_equal_infinities_large_values_and_nan_matches_numpy(device, dtype):
    big = float(np.finfo(np.float16).max) if dtype == lf.float16 else 1e30 if dtype != lf.float64 else 1e300
    a = np.array([np.inf, -np.inf, -np.inf, big, np.nan, 0.0], dtype)
    b = np.array([np.inf, -np.inf, 1.0, big, 1.0, 0.0], dtype)
    with lf.stream(device):
        got = lf.logaddexp(lf.array(a), lf.array(b))
    with np.errstate(all="ignore"):
        want = np.logaddexp(up(a), up(b))
    assert_close(got, want, dtype)
