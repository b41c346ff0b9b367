"""Elementwise math with numpy broadcasting and numpy (NEP 50) dtype promotion."""

from __future__ import annotations

import sys
import warnings
from typing import Any

import numpy as np

from .. import dtypes as dt
from ..array import Array
from ..defaults import current_stream
from ..errors import PrecisionWarning
from .core import _binary as _cbinary, broadcast_shapes, cast, describe, node, operand, shared, stream_of, to_stream
from . import table
from .primitives import Elementwise, Scalar

_PY_SCALARS = (bool, int, float, complex)
_FLOATS = frozenset(dt.FLOAT_DTYPES)
#: (op, ufunc, forced result, operand dtypes/scalar types) -> (result dtype, common operand dtype)
_SIGNATURES: dict = {}


def _is_weak(x: Any) -> bool:
    return isinstance(x, _PY_SCALARS) and not isinstance(x, np.generic)


def _infer(name: str, ufunc: np.ufunc, operands: list, datas: list) -> np.dtype:
    try:
        return dt.ufunc_result(ufunc, tuple(operands))
    except (TypeError, np.exceptions.DTypePromotionError) as e:
        kinds = ", ".join(str(o) if isinstance(o, np.dtype) else f"python {o.__name__}" for o in operands)
        raise TypeError(f"{name}: not defined for dtypes ({kinds}); cast with .astype() first ({e})") from None


_HALF = frozenset((dt.float16, dt.bfloat16))
_warned_upcast = False


def _is_numpy_float64_scalar(x: Any) -> bool:
    return x.__class__ is np.float64 or (x.__class__ is np.ndarray and x.ndim == 0 and x.dtype == np.float64)


def _warn_float64_upcast(name: str, value: Any, datas: list) -> None:
    """Once per process: a numpy float64 scalar made a half-precision GPU computation float64. numpy 2
    promotes so (a numpy scalar is not weak, NEP 50), and laneflow keeps numpy's result; but on a GPU
    it is almost always the ``x * (1 / np.sqrt(d))`` trap, at a fraction of the half-precision speed."""
    global _warned_upcast
    half = next((d.dtype for d in datas if d.dtype in _HALF), None)
    if half is None or _warned_upcast:
        return
    _warned_upcast = True
    warnings.warn(
        f"{name}: the numpy float64 scalar {float(value)!r} makes this {half} computation float64 on the GPU "
        "(numpy 2 promotion: numpy scalars are not weak, Python floats are); pass float(value) to keep "
        f"{half}, or .astype() the result. Shown once per process.", PrecisionWarning, stacklevel=_user_stacklevel())


def _user_stacklevel() -> int:
    """The ``stacklevel`` of ``warnings.warn`` called here that names the first frame outside laneflow."""
    root = __file__.rsplit("ops", 1)[0]
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(root):
        frame, level = frame.f_back, level + 1
    return level


def _check_scalar_fits(name: str, value: Any, dtype: np.dtype) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and dtype.kind in "iu":
        info = np.iinfo(dtype)
        if not info.min <= value <= info.max:
            raise OverflowError(f"{name}: Python integer {value} is out of bounds for {dtype}")


def apply(name: str, args: tuple, stream: Any, fn: str | None = None, infer_with: np.ufunc | None = None,
          result: np.dtype | None = None, check=None) -> Array:
    """Build an elementwise node. ``infer_with`` is the numpy ufunc whose loop resolution gives the dtype;
    ``check(dtype)``, when given, may refuse the arguments once the result dtype is known."""
    st = stream_of(stream, name)
    datas, operands, sig = [], [], []
    device = st.device
    np64 = None  # a numpy float64 scalar operand on a GPU, until the warning was shown
    for a in args:
        if isinstance(a, Array):
            d = a._data
            if d.device is not device and d.device != device:
                d = to_stream(d, st, name)
        elif _is_weak(a):
            operands.append(Scalar(a))
            sig.append(type(a))
            continue
        else:
            if _is_numpy_float64_scalar(a) and device.type == "gpu" and not _warned_upcast:
                np64 = a
            d = operand(a, st, name)
        operands.append(len(datas))
        datas.append(d)
        sig.append(d.dtype)
    if not datas:  # all Python scalars: make the first one an array, as numpy does
        d = operand(np.asarray(args[0]), st, name)
        operands[0], sig[0] = 0, d.dtype
        datas.append(d)
    shapes = [d.shape for d in datas]
    try:
        shape = broadcast_shapes(shapes)
    except ValueError:
        raise ValueError(f"{name}: shapes {', '.join(str(s) for s in shapes)} cannot be broadcast together") from None
    ufunc = infer_with or getattr(np, fn or name)
    key = (name, ufunc, result, tuple(sig))
    hit = _SIGNATURES.get(key)
    if hit is None:
        row = table.ELEMENTWISE.get(fn or name)
        if row is not None and row.real_only and (any(d.dtype.kind == "c" for d in datas) or any(
                isinstance(o, Scalar) and isinstance(o.value, complex) for o in operands)):
            scalars = [f"a Python {type(o.value).__name__}" for o in operands if isinstance(o, Scalar)]
            raise TypeError(f"{name}: defined for real values only, not for complex ones (the array API); got "
                            f"{', '.join([describe(*datas)] + scalars)}; apply it to lf.real(x), lf.imag(x) or lf.abs(x)")
        common = dt.operand_dtype([d.dtype for d in datas]) if result is None else None
        dtype = result if result is not None else _infer(name, ufunc, sig, datas)
        hit = _SIGNATURES[key] = (dtype, common)
    dtype, common = hit
    if np64 is not None and dtype == dt.float64:
        _warn_float64_upcast(name, np64, datas)
    if common is not None:  # e.g. int8 with uint8: computed in int32, which laneflow has (numpy: int16)
        datas = [cast(d, common, st) for d in datas]
    if dtype.kind in "iu":
        for o in operands:
            if isinstance(o, Scalar):
                _check_scalar_fits(name, o.value, dtype)
    if check is not None:
        check(dtype)
    ops = tuple(operands)
    prim = (shared(Elementwise, name, fn or name, ops) if all(o.__class__ is int for o in ops)
            else Elementwise(name, fn or name, ops))
    return node(prim, datas, shape, dtype, st)


def _broadcast_pair(a: tuple, b: tuple) -> tuple | None:
    """The broadcast shape of two shapes, or None when they do not broadcast (the general path says so)."""
    try:
        return broadcast_shapes([a, b])
    except ValueError:
        return None


#: Primitives are immutable, so the fast paths share one per (op, operands): a chain like
#: ``x = x + 1.0`` then allocates one graph node per op instead of three objects more, which keeps
#: Python's cyclic garbage collector from running full passes over long lazy graphs.
_PRIM_CACHE_MAX = 64


def _with_scalar(cache: dict, name: str, value: Any, at: int, arrays: int = 1) -> Elementwise:
    """The primitive of ``name`` with a Python scalar operand at position ``at`` among ``arrays``
    array inputs: one per value and position in ``cache``, never for 0 (0.0 and -0.0 are equal keys)
    nor NaN."""
    key = (value.__class__, value, at)
    prim = cache.get(key)
    if prim is None:
        operands: list = list(range(arrays))
        operands.insert(at, Scalar(value))
        prim = Elementwise(name, name, tuple(operands))
        if value and value == value and len(cache) < _PRIM_CACHE_MAX:
            cache[key] = prim
    return prim


def _binary(row: table.Elementwise):
    name = row.name
    ufunc = row.ufunc
    both = Elementwise(name, name, (0, 1))
    with_scalar: dict = {}  # (type, value, position) -> prim
    # the result dtype of a signature seen before that needs no common dtype (from _SIGNATURES, by the
    # operands' dtypes or scalar types alone: one small key a call): array op array, array op scalar,
    # scalar op array (three dicts: a dtype equals a Python type, np.dtype("float64") == float)
    seen_aa: dict = {}
    seen_as: dict = {}
    seen_sa: dict = {}

    def out_dtype(seen: dict, sig: tuple):
        out = seen.get(sig)
        if out is not None:
            return out
        hit = _SIGNATURES.get((name, ufunc, None, sig))
        if hit is None or hit[1] is not None:
            return None
        seen[sig] = hit[0]
        return hit[0]

    state = (both, with_scalar, seen_aa, seen_as, seen_sa, _FLOATS)  # (what the C call reads)
    fast = _cbinary

    def op(a: Any, b: Any, /, *, stream: Any = None) -> Array:
        if stream is None and fast[0] is not None:  # the common case below in one C call (ops/ctape.c)
            r = fast[0](state, a, b)
            if r is not None:
                return r
        if stream is None and a.__class__ is Array:
            # The common case without the general machinery: an array with a float scalar, or with
            # an array of its shape, on the current stream's device, a signature seen before.
            st = current_stream()
            d = a._data
            if d.device is st.device or d.device == st.device:
                bc = b.__class__
                if bc is float or (bc is int and d.dtype in _FLOATS):  # an int fits any float dtype
                    sig = (d.dtype, bc)
                    out = out_dtype(seen_as, sig)
                    if out is not None:
                        return node(_with_scalar(with_scalar, name, b, 1), (d,), d.shape, out, st)
                elif bc is Array:
                    e = b._data
                    if e.device is d.device or e.device == d.device:
                        sig = (d.dtype, e.dtype)
                        out = out_dtype(seen_aa, sig)
                        if out is not None:
                            shape = d.shape if e.shape == d.shape else _broadcast_pair(d.shape, e.shape)
                            if shape is not None:
                                return node(both, (d, e), shape, out, st)
        elif stream is None and b.__class__ is Array and (a.__class__ is float or a.__class__ is int):
            st = current_stream()  # a scalar first (``0.5 * x``): as above
            e = b._data
            if (e.device is st.device or e.device == st.device) and (a.__class__ is float or e.dtype in _FLOATS):
                sig = (a.__class__, e.dtype)
                out = out_dtype(seen_sa, sig)
                if out is not None:
                    return node(_with_scalar(with_scalar, name, a, 0), (e,), e.shape, out, st)
        return apply(name, (a, b), stream, fn=name, infer_with=ufunc)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = row.doc or f"Elementwise ``{name}`` with broadcasting (numpy's ``np.{row.numpy}``)."
    op._cstate = state  # (what the C call reads: the operators call it at once, ops/ctape.py's shortcut)
    return op


def unary(row: table.Elementwise):
    name = row.name
    ufunc = row.ufunc
    prim = Elementwise(name, name, (0,))

    def op(x: Any, /, *, stream: Any = None) -> Array:
        if stream is None and x.__class__ is Array:  # as in _binary: a signature seen before
            st = current_stream()
            d = x._data
            if d.device is st.device or d.device == st.device:
                hit = _SIGNATURES.get((name, ufunc, None, (d.dtype,)))
                if hit is not None and hit[1] is None:
                    return node(prim, (d,), d.shape, hit[0], st)
        return apply(name, (x,), stream, fn=name, infer_with=ufunc)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = row.doc or f"Elementwise ``{name}`` (numpy's ``np.{row.numpy or row.like}``)."
    return op


#: The public elementwise ops made from the op table (``ops/table.py``), by name.
GENERATED: dict = {row.name: (unary if row.arity == 1 else _binary)(row)
                   for row in table.ELEMENTWISE.values() if row.public}
globals().update(GENERATED)
__all__ = [*GENERATED, "power", "where", "clip", "round", "real", "imag", "conj"]


def power(a: Any, b: Any, /, *, stream: Any = None) -> Array:
    """Elementwise ``a ** b`` with broadcasting (numpy's ``np.power``).

    Integer results need non-negative exponents, as in numpy: a negative Python int exponent is
    refused here (ValueError); a negative value in an integer exponent array fails when the op runs
    (lf.ExecutionError at the eval that needs it).
    """
    def check(dtype: np.dtype) -> None:
        if dtype.kind in "iu" and _is_weak(b) and not isinstance(b, bool) and b < 0:
            raise ValueError(f"power: integers to negative integer powers are not allowed ({dtype} ** {b}); "
                             "use a float base or exponent, e.g. x.astype(lf.float32) ** -1")

    return apply("power", (a, b), stream, fn="power", infer_with=np.power, check=check)


def where(condition: Any, x: Any, y: Any, /, *, stream: Any = None) -> Array:
    """``x`` where ``condition`` is true, else ``y`` (broadcast together; dtype of ``x`` and ``y`` promoted)."""
    if stream is None and condition.__class__ is Array and x.__class__ is Array and y.__class__ in (float, int):
        # the common ``where(mask, scores, -1e9)``: a float array and a Python number, a signature seen before
        st = current_stream()
        c, d = condition._data, x._data
        if (c.device is st.device and d.device is st.device and d.dtype in _FLOATS):
            hit = _SIGNATURES.get(("where", np.where, d.dtype, (c.dtype, d.dtype, y.__class__)))
            shape = d.shape if c.shape == d.shape else _broadcast_pair(c.shape, d.shape)
            if hit is not None and hit[1] is None and shape is not None:
                return node(_with_scalar(_WHERE, "where", y, 2, 2), (c, d), shape, hit[0], st)
    weak = [v if _is_weak(v) else None for v in (x, y)]
    st = stream_of(stream, "where")
    dts = [w if w is not None else operand(v, st, "where").dtype for w, v in zip(weak, (x, y))]
    try:
        res = dt.result_type(*dts)
    except (TypeError, np.exceptions.DTypePromotionError) as e:
        raise TypeError(f"where: no common dtype for x and y ({e})") from None
    return apply("where", (condition, x, y), st, fn="where", result=res)


_WHERE: dict = {}  # where's primitives with a scalar ``y`` (``_with_scalar``)


def clip(x: Any, /, min: Any = None, max: Any = None, *, stream: Any = None) -> Array:  # noqa: A002
    """Limit values to [min, max] (either may be None; both None: ``x`` unchanged)."""
    a_min, a_max = min, max
    if a_min is None and a_max is None:
        return Array._wrap(operand(x, stream_of(stream, "clip"), "clip"))
    r = x
    try:
        if a_min is not None:
            r = GENERATED["maximum"](r, a_min, stream=stream)
        if a_max is not None:
            r = GENERATED["minimum"](r, a_max, stream=stream)
    except (TypeError, ValueError) as e:  # the error names clip, the op the user called
        raise type(e)(f"clip: {e}") from None
    return r


def round(x: Any, /, *, stream: Any = None) -> Array:  # noqa: A001 - the array API's name
    """Round to the nearest integer, halves to even (numpy's ``np.round`` with no decimals); integer
    and bool inputs are returned as they are, in their dtype."""
    if isinstance(x, Array) and x.dtype.kind in "iub":
        return Array._wrap(x._data)
    return apply("round", (x,), stream, fn="rint", infer_with=np.rint)


def _part(op: str, x: Any, stream: Any) -> Array:
    """``op`` (real, imag, conj) of a complex array, or None for a real one (the caller's answer)."""
    if not isinstance(x, Array):
        raise TypeError(f"{op}: expected an lf.Array, got {type(x).__name__}")
    if x.dtype == dt.bool_:
        raise TypeError(f"{op}: not defined for bool arrays (the array API: numeric dtypes); got {x.shape} bool")
    if not dt.is_complex(x.dtype):
        return None
    return apply(op, (x,), stream, fn=op, infer_with=table.ELEMENTWISE[op].ufunc)


def real(x: Any, /, *, stream: Any = None) -> Array:
    """The real part (complex64 gives float32); ``x`` itself for real dtypes."""
    r = _part("real", x, stream)
    return Array._wrap(x._data) if r is None else r


def conj(x: Any, /, *, stream: Any = None) -> Array:
    """The complex conjugate; ``x`` itself for real dtypes."""
    r = _part("conj", x, stream)
    return Array._wrap(x._data) if r is None else r


def imag(x: Any, /, *, stream: Any = None) -> Array:
    """The imaginary part (complex64 gives float32); zeros of ``x``'s shape and dtype for real dtypes."""
    from .creation import zeros_like

    r = _part("imag", x, stream)
    return zeros_like(x) if r is None else r
