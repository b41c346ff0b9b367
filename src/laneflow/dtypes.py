"""laneflow dtypes: numpy dtype objects, with bfloat16 from ml_dtypes.

Promotion follows numpy 2 (NEP 50: Python scalars are "weak" and take the array's dtype where the
kind allows). numpy has no rule for bfloat16, so laneflow defines one and writes it down here:
bfloat16 promotes exactly as float16 does, and bfloat16 with float16 gives float32 (the JAX rule).
complex64 and complex128 promote as numpy and the array API agree (float64 with complex64 gives
complex128; a Python complex is weak).

laneflow has no int16, uint16 or uint64. Where numpy's rules would give one of them, laneflow uses the
nearest wider dtype it has, and computes in it:

- int8 with uint8 gives int32 (numpy: int16), in arithmetic, comparisons, ``where``, ``concatenate``
  and ``matmul`` alike (the operands are cast to int32 first, so results never wrap at 16 bits);
- ``sum`` and ``prod`` of unsigned integers accumulate in int64 (numpy: uint64; PyTorch also gives
  int64), as they do for signed integers and bool.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

bool_ = np.dtype(np.bool_)
int8 = np.dtype(np.int8)
uint8 = np.dtype(np.uint8)
int32 = np.dtype(np.int32)
uint32 = np.dtype(np.uint32)
int64 = np.dtype(np.int64)
float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
complex64 = np.dtype(np.complex64)
complex128 = np.dtype(np.complex128)

DTYPES: tuple[np.dtype, ...] = (bool_, int8, uint8, int32, uint32, int64, float16, bfloat16, float32, float64,
                                complex64, complex128)
FLOAT_DTYPES = (float16, bfloat16, float32, float64)
INT_DTYPES = (int8, uint8, int32, uint32, int64)
COMPLEX_DTYPES = (complex64, complex128)
#: each complex dtype's component (real) dtype, and back: abs, real, imag and finfo read it here
REAL_OF = {complex64: float32, complex128: float64}

_BY_NAME = {str(d): d for d in DTYPES}
_BY_NAME.update({"bool": bool_, "bfloat16": bfloat16, "float": float64, "int": int64, "complex": complex128})


def dtype(obj: Any) -> np.dtype:
    """Normalise a dtype-like (``lf.float32``, ``"float32"``, ``np.float32``, ``float``) to a laneflow dtype.

    Raises TypeError for dtypes laneflow does not support (strings, objects, uint16...).
    """
    if isinstance(obj, np.dtype) and obj in _SUPPORTED:
        return obj
    if isinstance(obj, str) and obj in _BY_NAME:
        return _BY_NAME[obj]
    if obj is bool:
        return bool_
    if obj is int:
        return int64
    if obj is float:
        return float64
    if obj is complex:
        return complex128
    try:
        d = np.dtype(obj)
    except TypeError:
        d = None
    if d is not None and d in _SUPPORTED:
        return d
    # Hashability of arbitrary objects is not guaranteed, so report with repr.
    names = ", ".join(str(x) for x in DTYPES)
    raise TypeError(f"laneflow does not support dtype {obj!r}; supported dtypes: {names}")


_SUPPORTED = frozenset(DTYPES)


def is_floating(d: np.dtype) -> bool:
    return d.kind == "f" or d == bfloat16


def is_integer(d: np.dtype) -> bool:
    return d.kind in "iu"


def is_complex(d: np.dtype) -> bool:
    return d.kind == "c"


def real_dtype(d: np.dtype) -> np.dtype:
    """The component dtype of a complex dtype (complex64 -> float32); any other dtype itself."""
    return REAL_OF.get(d, d)


def _numpy_view(dtypes: list[np.dtype]) -> tuple[list[np.dtype], bool]:
    """Replace bfloat16 by float16 so numpy's rules apply; report whether to map float16 back."""
    has_bf = any(d == bfloat16 for d in dtypes)
    if not has_bf:
        return dtypes, False
    if any(d == float16 for d in dtypes):
        return [float32 if d in (bfloat16, float16) else d for d in dtypes], False
    return [float16 if d == bfloat16 else d for d in dtypes], True


# numpy dtypes that promotion can produce but laneflow does not have -> the laneflow dtype used instead.
_WIDER = {np.dtype(np.int16): int32, np.dtype(np.uint16): int32, np.dtype(np.uint64): int64}


def wider(d: np.dtype) -> np.dtype | None:
    """The laneflow dtype that stands in for numpy dtype d, which laneflow lacks (int16 -> int32), or None."""
    return _WIDER.get(np.dtype(d))


def _map_back(d: np.dtype, had_bf: bool) -> np.dtype:
    d = _WIDER.get(d, d)
    return bfloat16 if had_bf and d == float16 else d


def operand_dtype(dtypes: list[np.dtype]) -> np.dtype | None:
    """The dtype to cast array operands to before an op when numpy would compute them in a dtype laneflow
    lacks (int8 with uint8: numpy computes in int16, laneflow in int32); None when no cast is needed."""
    if len(set(dtypes)) < 2:
        return None
    view, had_bf = _numpy_view(list(dtypes))
    try:
        common = np.result_type(*view)
    except (TypeError, np.exceptions.DTypePromotionError):
        return None
    return _WIDER.get(common)


def result_type(*args: Any) -> np.dtype:
    """numpy's ``result_type`` over laneflow dtypes, arrays and weak Python scalars.

    >>> result_type(lf.int8, 1.5)   # weak float scalar: default float
    dtype('float64')
    """
    dts: list[np.dtype] = []
    weak: list[Any] = []
    for a in args:
        d = getattr(a, "dtype", None)
        if d is not None and not isinstance(a, (np.generic,)):
            dts.append(dtype(d))
        elif isinstance(a, (bool, int, float, complex)) and not isinstance(a, np.generic):
            weak.append(a)
        elif isinstance(a, np.generic):
            dts.append(dtype(a.dtype))
        else:
            dts.append(dtype(a))
    view, had_bf = _numpy_view(dts)
    return _map_back(np.result_type(*view, *weak), had_bf)


_UFUNC_CACHE: dict[tuple, np.dtype] = {}


def ufunc_result(ufunc: np.ufunc, operands: tuple) -> np.dtype:
    """Output dtype of a numpy ufunc applied to operands (dtypes, or the types of weak Python scalars).

    Uses numpy's own loop resolution on empty arrays, so laneflow's output dtypes are numpy's.
    Raises numpy's TypeError (``UFuncTypeError``) when numpy has no loop for the inputs.
    """
    operands = tuple(o if isinstance(o, (np.dtype, type)) else type(o) for o in operands)
    key = (ufunc.__name__,) + operands
    hit = _UFUNC_CACHE.get(key)
    if hit is not None:
        return hit
    dts = [o for o in operands if isinstance(o, np.dtype)]
    common = operand_dtype(dts)
    if common is not None:  # the operands are cast to a dtype laneflow has first (see operand_dtype)
        operands = tuple(common if isinstance(o, np.dtype) else o for o in operands)
        dts = [common] * len(dts)
    view, had_bf = _numpy_view(dts)
    it = iter(view)
    args = [np.empty(0, next(it)) if isinstance(o, np.dtype) else o(1) for o in operands]
    with np.errstate(all="ignore"):
        out = ufunc(*args)
    res = _map_back(np.asarray(out).dtype, had_bf)
    _UFUNC_CACHE[key] = res
    return res


def finfo_eps(d: np.dtype) -> float:
    """Machine epsilon of a floating dtype (used by tests and tolerances)."""
    return float(ml_dtypes.finfo(d).eps) if d == bfloat16 else float(np.finfo(d).eps)


def inside_range(dtype: np.dtype, low: float, high: float) -> tuple:
    """The smallest value of dtype >= low and the largest < high (just low when the range is empty)."""
    lo, hi = np.array(low, dtype), np.array(high, dtype)
    if float(lo) < low:
        lo = np.nextafter(lo, np.array(np.inf, dtype))
    if float(hi) >= high:
        hi = np.nextafter(hi, np.array(-np.inf, dtype))
    return lo, max(hi, lo)
