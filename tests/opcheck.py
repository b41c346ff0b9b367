"""Helpers for the op tests: the dtype lists, numpy references and comparisons tied to a dtype's eps.

Conventions:

- ``got`` is an ``lf.Array``; its dtype and shape are checked from metadata first (no evaluation),
  then its values through ``np.asarray``.
- For float16 and bfloat16 the numpy reference is computed in float32 from the same (exactly
  representable) inputs, and compared with a tolerance of a few units of the half type's eps.
- The expected dtype comes from numpy, with laneflow's written rules (laneflow/dtypes.py): bfloat16
  promotes exactly as float16 does, bfloat16 with float16 gives float32, and where numpy would give a
  dtype laneflow lacks, the nearest wider one (int16 -> int32, uint64 -> int64).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

import laneflow as lf

DTYPES = [lf.bool_, lf.int8, lf.uint8, lf.int32, lf.uint32, lf.int64, lf.float16, lf.bfloat16, lf.float32, lf.float64]
INTS = [lf.int8, lf.uint8, lf.int32, lf.uint32, lf.int64]
FLOATS = [lf.float16, lf.bfloat16, lf.float32, lf.float64]
HALF = (lf.float16, lf.bfloat16)
NUMERIC = INTS + FLOATS


def name(d) -> str:
    return str(np.dtype(d))


def is_float(d) -> bool:
    return np.dtype(d) in FLOATS


def eps(d) -> float:
    d = np.dtype(d)
    return float(ml_dtypes.finfo(d).eps) if d == lf.bfloat16 else float(np.finfo(d).eps)


def up(a):
    """The array numpy computes references from: half types widened to float32 (exactly)."""
    a = np.asarray(a)
    return a.astype(np.float32) if a.dtype in HALF else a


def expected_dtype(fn, *operands) -> np.dtype:
    """The dtype numpy's ``fn`` gives for operands (dtypes or weak Python scalars), with the bfloat16 rule."""
    dts = [o for o in operands if isinstance(o, np.dtype)]
    has_bf = any(d == lf.bfloat16 for d in dts)
    has_f16 = any(d == lf.float16 for d in dts)

    def view(o):
        if not isinstance(o, np.dtype):
            return type(o)(1)
        if o == lf.bfloat16:
            o = np.dtype(np.float32) if has_f16 else np.dtype(np.float16)
        elif o == lf.float16 and has_bf:
            o = np.dtype(np.float32)
        return np.ones(1, o)

    with np.errstate(all="ignore"):
        r = np.asarray(fn(*(view(o) for o in operands))).dtype
    r = WIDER.get(r, r)
    return np.dtype(lf.bfloat16) if has_bf and not has_f16 and r == np.float16 else r


#: numpy dtypes laneflow does not have -> what laneflow gives instead (documented in laneflow/dtypes.py).
WIDER = {np.dtype(np.int16): np.dtype(np.int32), np.dtype(np.uint64): np.dtype(np.int64)}


def _values(got, dtype, shape) -> np.ndarray:
    assert isinstance(got, lf.Array), f"expected an lf.Array, got {type(got).__name__}"
    assert got.dtype == dtype, f"dtype {got.dtype}, expected {dtype}"
    assert got.shape == tuple(shape), f"shape {got.shape}, expected {tuple(shape)}"
    host = np.asarray(got)
    assert host.dtype == dtype and host.shape == tuple(shape), "host copy disagrees with the metadata"
    return host


def assert_same(got, want, dtype=None) -> None:
    """Exact equality of dtype, shape and values (NaN equals NaN)."""
    want = np.asarray(want)
    dtype = np.dtype(dtype if dtype is not None else want.dtype)
    host = _values(got, dtype, want.shape)
    if dtype.kind in "biu" and want.dtype.kind in "biu":
        np.testing.assert_array_equal(host, want.astype(dtype))
    else:
        np.testing.assert_array_equal(host.astype(np.float64), want.astype(np.float64))


def assert_close(got, want, dtype=None, *, ulps: float = 4, rtol: float | None = None,
                 atol=None) -> None:
    """Values within ``rtol`` (default ``ulps`` eps of dtype) relative and ``atol`` (default the same,
    absolute) of ``want``; ``atol`` may be an array (an error bound per element). inf and NaN must match."""
    want = np.asarray(want)
    dtype = np.dtype(dtype if dtype is not None else want.dtype)
    host = _values(got, dtype, want.shape)
    if dtype.kind in "biu":
        np.testing.assert_array_equal(host, want.astype(dtype))
        return
    e = eps(dtype)
    rtol = ulps * e if rtol is None else rtol
    atol = ulps * e if atol is None else atol
    g = host.astype(np.float64)
    w = want.astype(np.float64)
    if dtype in HALF:
        # The reference is float32; what the half type can hold at all also bounds the result.
        big = float(ml_dtypes.finfo(dtype).max)
        w = np.where(np.abs(w) > big * (1 + e / 2), np.copysign(np.inf, w), w)
    nan_g, nan_w = np.isnan(g), np.isnan(w)
    assert (nan_g == nan_w).all(), f"NaN positions differ:\n got {g}\nwant {w}"
    inf_w = np.isinf(w)
    assert (g[inf_w] == w[inf_w]).all(), f"infinities differ:\n got {g}\nwant {w}"
    fin = ~(nan_w | inf_w)
    with np.errstate(invalid="ignore"):
        err = np.abs(g - w)
    bound = np.broadcast_to(atol + rtol * np.abs(w), w.shape)
    bad = fin & ~(err <= bound)
    if bad.any():
        k = np.flatnonzero(bad)[:5]
        raise AssertionError(
            f"{int(bad.sum())} of {w.size} values differ beyond rtol={rtol:.3g}, atol={np.max(atol):.3g} "
            f"({dtype}); first at flat indices {k.tolist()}: got {g.ravel()[k].tolist()}, "
            f"want {w.ravel()[k].tolist()}")


def numpy_error(fn, *args) -> type | None:
    """The exception type numpy raises for fn on these arguments (no loop for the dtypes: TypeError;
    a Python int out of range for the array dtype: OverflowError), or None."""
    try:
        with np.errstate(all="ignore"):
            fn(*args)
    except np.exceptions.DTypePromotionError:
        return TypeError
    except (TypeError, OverflowError) as e:
        return type(e) if type(e) is OverflowError else TypeError
    return None


def vec_math(f):
    """A float64 numpy version of a scalar math function (math.erf has no numpy ufunc)."""
    v = np.vectorize(f, otypes=[np.float64])
    return lambda x: v(np.asarray(x, np.float64))


erf64 = vec_math(math.erf)
