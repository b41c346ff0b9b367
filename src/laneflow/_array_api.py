"""laneflow as a Python array API namespace: the dtype functions (``finfo``, ``iinfo``, ``isdtype``,
``can_cast``) and ``__array_namespace_info__``. The ops themselves live in ``ops/``; the standard's
names that differ from numpy's (``concat``, ``permute_dims``, ``pow``...) are bound in ``__init__``.

Which standard version laneflow meets, and what it leaves out, is written in ``docs/array_api.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from . import dtypes as dt

#: The versions of the array API standard laneflow meets, oldest first
#: (docs/array_api.md); ``Array.__array_namespace__(api_version=)`` accepts these.
API_VERSIONS: tuple[str, ...] = ("2021.12", "2022.12", "2023.12", "2024.12")

#: The newest of them (the standard's name).
__array_api_version__ = API_VERSIONS[-1]

#: The standard's dtype kinds (``isdtype``), over laneflow's dtypes.
KINDS: dict[str, tuple] = {
    "bool": (dt.bool_,),
    "signed integer": tuple(d for d in dt.INT_DTYPES if d.kind == "i"),
    "unsigned integer": tuple(d for d in dt.INT_DTYPES if d.kind == "u"),
    "integral": dt.INT_DTYPES,
    "real floating": dt.FLOAT_DTYPES,
    "complex floating": dt.COMPLEX_DTYPES,
    "numeric": dt.INT_DTYPES + dt.FLOAT_DTYPES + dt.COMPLEX_DTYPES,
}


@dataclass(frozen=True)
class finfo_object:  # noqa: N801 - the standard's name for what finfo returns
    """Machine limits of a floating dtype (the standard's ``finfo_object``)."""

    bits: int
    eps: float
    max: float
    min: float
    smallest_normal: float
    dtype: np.dtype


@dataclass(frozen=True)
class iinfo_object:  # noqa: N801
    """Limits of an integer dtype (the standard's ``iinfo_object``)."""

    bits: int
    max: int
    min: int
    dtype: np.dtype


def _dtype_of(type: Any, op: str) -> np.dtype:  # noqa: A002 - the standard's parameter name
    d = getattr(type, "dtype", type)
    try:
        return dt.dtype(d)
    except TypeError as e:
        raise TypeError(f"{op}: {e}") from None


def finfo(type: Any, /) -> finfo_object:  # noqa: A002
    """Machine limits of a floating dtype (or of an array's dtype), as Python floats. A complex dtype
    gives its component's limits (complex64: float32's), with ``dtype`` that real dtype, as the
    standard says.

    >>> lf.finfo(lf.float32).eps
    1.1920928955078125e-07
    """
    d = dt.real_dtype(_dtype_of(type, "finfo"))
    if not dt.is_floating(d):
        raise TypeError(f"finfo: {d} is not a floating dtype; use lf.iinfo for integers")
    f = ml_dtypes.finfo(d) if d == dt.bfloat16 else np.finfo(d)
    return finfo_object(int(f.bits), float(f.eps), float(f.max), float(f.min), float(f.smallest_normal), d)


def iinfo(type: Any, /) -> iinfo_object:  # noqa: A002
    """Limits of an integer dtype (or of an array's dtype), as Python ints."""
    d = _dtype_of(type, "iinfo")
    if not dt.is_integer(d):
        raise TypeError(f"iinfo: {d} is not an integer dtype; use lf.finfo for floating dtypes")
    i = np.iinfo(d)
    return iinfo_object(int(i.bits), int(i.max), int(i.min), d)


def isdtype(dtype: Any, kind: Any) -> bool:
    """Whether ``dtype`` is of ``kind``: a dtype, a kind name ("bool", "signed integer", "unsigned
    integer", "integral", "real floating", "complex floating", "numeric") or a tuple of those."""
    d = _dtype_of(dtype, "isdtype")
    if isinstance(kind, tuple):
        return any(isdtype(d, k) for k in kind)
    if isinstance(kind, str):
        if kind not in KINDS:
            raise ValueError(f"isdtype: unknown kind {kind!r}; kinds: {', '.join(KINDS)}")
        return d in KINDS[kind]
    return d == _dtype_of(kind, "isdtype")


def can_cast(from_: Any, to: Any, /) -> bool:
    """Whether ``from_`` (a dtype or an array) converts to ``to`` without a loss: within a kind, the
    standard's type promotion gives ``to``; across kinds, numpy's "safe" rule."""
    a, b = _dtype_of(from_, "can_cast"), _dtype_of(to, "can_cast")
    if a == b:
        return True
    kinds = [next(k for k in ("bool", "integral", "real floating", "complex floating") if d in KINDS[k])
             for d in (a, b)]
    if kinds[0] != kinds[1]:  # across kinds: numpy's "safe" rule (bool to anything, small ints to floats)
        return kinds[0] == "bool" or bool(np.can_cast(a, b, "safe"))
    try:
        return dt.result_type(a, b) == b
    except (TypeError, np.exceptions.DTypePromotionError):
        return False


class Info:
    """What ``lf.__array_namespace_info__()`` returns: the namespace's capabilities, devices and dtypes."""

    def capabilities(self) -> dict:
        """Boolean-mask indexing and other data-dependent shapes run eagerly (refused in lf.compile)."""
        return {"boolean indexing": True, "data-dependent shapes": True, "max dimensions": 8}

    def default_device(self) -> Any:
        from .defaults import default_device

        return default_device()

    def devices(self) -> list:
        from .defaults import gpu_available
        from .device import cpu, gpu

        return [cpu, gpu] if gpu_available() else [cpu]

    def default_dtypes(self, *, device: Any = None) -> dict:
        return {"real floating": dt.float64, "complex floating": dt.complex128, "integral": dt.int64, "indexing": dt.int64}

    def dtypes(self, *, device: Any = None, kind: Any = None) -> dict:
        """The standard's dtypes laneflow has (of ``kind``, as :func:`isdtype` takes it), by name;
        float16 and bfloat16 are laneflow's own extras."""
        return {str(d) if d != dt.bool_ else "bool": d for d in dt.DTYPES
                if d not in (dt.float16, dt.bfloat16) and (kind is None or isdtype(d, kind))}


def __array_namespace_info__() -> Info:
    """The standard's inspection object (``capabilities()``, ``devices()``, ``dtypes()``...)."""
    return Info()
