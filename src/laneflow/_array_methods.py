"""The method-style API of ``lf.Array``: operators, in-place operators and methods such as
``.reshape`` and ``.sum``, attached to the class by the layer that has the ops (JAX attaches its array
methods the same way). ``array.py`` stays below the ops: it holds the value and host access only.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from . import _ops_namespace as ops
from ._array_api import API_VERSIONS as _API_VERSIONS
from .array import Array
from .ops.tape import taped


#: the ops without their tape wrapper (``ops/tape.py``): the methods below that call one op are taped
#: themselves (:data:`TAPED`), so a replayed ``x + y`` or ``x.reshape(...)`` is one call, not two
raw = SimpleNamespace(**{k: getattr(v, "__wrapped__", v) for k, v in vars(ops).items() if callable(v)})


class _Methods:
    """The methods, defined as a class body (so they read as methods); copied onto ``Array``."""

    # -- conversions and shape ------------------------------------------------------------------
    def astype(self, dtype: Any, *, stream: Any = None) -> "Array":
        return raw.astype(self, dtype, stream=stream)

    def reshape(self, *shape: Any, stream: Any = None) -> "Array":
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = shape[0]
        return raw.reshape(self, shape, stream=stream)

    def transpose(self, *axes: Any, stream: Any = None) -> "Array":
        if len(axes) == 1 and (axes[0] is None or not isinstance(axes[0], (int, np.integer))):
            axes = axes[0]
        return raw.transpose(self, axes if axes != () else None, stream=stream)

    @property
    def T(self) -> "Array":
        return raw.transpose(self)

    def flatten(self, *, stream: Any = None) -> "Array":
        return raw.flatten(self, stream=stream)

    def squeeze(self, axis: Any = None, *, stream: Any = None) -> "Array":
        return raw.squeeze(self, axis, stream=stream)

    def swapaxes(self, a: int, b: int, *, stream: Any = None) -> "Array":
        return raw.swapaxes(self, a, b, stream=stream)

    def __getitem__(self, index: Any) -> "Array":
        return raw.getitem(self, index)

    def __setitem__(self, index: Any, value: Any) -> None:
        self._rebind(ops.setitem(self, index, value)._data)

    # -- reductions -----------------------------------------------------------------------------
    def sum(self, axis=None, keepdims=False, *, stream=None): return raw.sum(self, axis, keepdims, stream=stream)  # noqa: E704
    def mean(self, axis=None, keepdims=False, *, stream=None): return raw.mean(self, axis, keepdims, stream=stream)  # noqa: E704
    def max(self, axis=None, keepdims=False, *, stream=None): return raw.max(self, axis, keepdims, stream=stream)  # noqa: E704
    def min(self, axis=None, keepdims=False, *, stream=None): return raw.min(self, axis, keepdims, stream=stream)  # noqa: E704
    def prod(self, axis=None, keepdims=False, *, stream=None): return raw.prod(self, axis, keepdims, stream=stream)  # noqa: E704
    def any(self, axis=None, keepdims=False, *, stream=None): return raw.any(self, axis, keepdims, stream=stream)  # noqa: E704
    def all(self, axis=None, keepdims=False, *, stream=None): return raw.all(self, axis, keepdims, stream=stream)  # noqa: E704
    def argmax(self, axis=None, keepdims=False, *, stream=None): return raw.argmax(self, axis, keepdims, stream=stream)  # noqa: E704
    def argmin(self, axis=None, keepdims=False, *, stream=None): return raw.argmin(self, axis, keepdims, stream=stream)  # noqa: E704

    def var(self, axis=None, keepdims=False, ddof=0, *, stream=None):
        return raw.var(self, axis, keepdims, ddof, stream=stream)

    def std(self, axis=None, keepdims=False, ddof=0, *, stream=None):
        return raw.std(self, axis, keepdims, ddof, stream=stream)

    # -- operators ------------------------------------------------------------------------------
    def __neg__(self): return raw.negative(self)  # noqa: E704
    def __pos__(self): return Array._wrap(self._data)  # noqa: E704  (a new array, as numpy's +x)
    def __abs__(self): return raw.abs(self)  # noqa: E704
    def __invert__(self): return raw.bitwise_invert(self)  # noqa: E704
    def __eq__(self, o): return raw.equal(self, o)  # type: ignore[override]  # noqa: E704
    def __ne__(self, o): return raw.not_equal(self, o)  # type: ignore[override]  # noqa: E704
    def __lt__(self, o): return raw.less(self, o)  # noqa: E704
    def __le__(self, o): return raw.less_equal(self, o)  # noqa: E704
    def __gt__(self, o): return raw.greater(self, o)  # noqa: E704
    def __ge__(self, o): return raw.greater_equal(self, o)  # noqa: E704

    # In-place operators update this array object, as in numpy: every name bound to it sees the new
    # value (arrays computed from the old value do not change). The result must keep the shape, and
    # its dtype must cast back with numpy's "same_kind" rule (an int array += 1.5 is an error).
    def _inplace(self, op, o, name):
        r = op(self, o)
        if r.shape != self.shape:
            raise ValueError(f"{name}: the result of shape {r.shape} does not fit the array of shape {self.shape}")
        if r.dtype != self.dtype:
            if not np.can_cast(r.dtype, self.dtype, "same_kind") and not (
                    r.dtype.kind == self.dtype.kind == "f"):
                raise TypeError(f"{name}: cannot cast the {r.dtype} result back to the array's {self.dtype} "
                                "(numpy's same_kind rule); write x = x op y to get a new array instead")
            r = ops.astype(r, self.dtype)
        self._rebind(r._data)
        return self

    def __iadd__(self, o): return self._inplace(ops.add, o, "+=")  # noqa: E704
    def __isub__(self, o): return self._inplace(ops.subtract, o, "-=")  # noqa: E704
    def __imul__(self, o): return self._inplace(ops.multiply, o, "*=")  # noqa: E704
    def __itruediv__(self, o): return self._inplace(ops.divide, o, "/=")  # noqa: E704
    def __ifloordiv__(self, o): return self._inplace(ops.floor_divide, o, "//=")  # noqa: E704
    def __imod__(self, o): return self._inplace(ops.remainder, o, "%=")  # noqa: E704
    def __ipow__(self, o): return self._inplace(ops.power, o, "**=")  # noqa: E704
    def __imatmul__(self, o): return self._inplace(ops.matmul, o, "@=")  # noqa: E704
    def __iand__(self, o): return self._inplace(ops.bitwise_and, o, "&=")  # noqa: E704
    def __ior__(self, o): return self._inplace(ops.bitwise_or, o, "|=")  # noqa: E704
    def __ixor__(self, o): return self._inplace(ops.bitwise_xor, o, "^=")  # noqa: E704
    def __ilshift__(self, o): return self._inplace(ops.bitwise_left_shift, o, "<<=")  # noqa: E704
    def __irshift__(self, o): return self._inplace(ops.bitwise_right_shift, o, ">>=")  # noqa: E704

    # -- the array API standard's array object ----------------------------------------------------
    def __array_namespace__(self, /, *, api_version: str | None = None) -> Any:
        """The namespace of this array: ``laneflow`` (array API standard, ``lf.__array_api_version__``)."""
        import laneflow

        if api_version is not None and api_version not in _API_VERSIONS:
            raise ValueError(f"__array_namespace__: laneflow meets array API versions {', '.join(_API_VERSIONS)}, "
                             f"not {api_version!r}")
        return laneflow

    def to_device(self, device: Any, /, *, stream: Any = None) -> "Array":
        """This value on ``device`` (a copy when it lives elsewhere; ``stream``: the stream to copy on)."""
        return ops.asarray(self, device=device) if stream is None else ops.asarray(self, stream=stream)

    @property
    def mT(self) -> "Array":  # noqa: N802 - the standard's name
        """The last two axes swapped (a stack of matrices transposed)."""
        return raw.matrix_transpose(self)

    def __index__(self) -> int:
        if self.dtype.kind not in "iu" or self.ndim:
            raise TypeError(f"__index__: only 0-d integer arrays are indices, got {self.dtype} of shape {self.shape}")
        return int(self.item())

    def __complex__(self) -> complex:
        return complex(self.item())


#: the binary operators, by Python's name: ``x.__add__(o)`` is ``add(x, o)``, ``x.__radd__(o)`` is
#: ``add(o, x)``. The methods are made here, and where an op is a binary elementwise one with a C call
#: (``ops/elementwise.py``), its taped method takes the common call in C at once (:func:`_shortcuts`)
OPERATORS = {"add": "add", "sub": "subtract", "mul": "multiply", "truediv": "divide", "floordiv": "floor_divide",
             "mod": "remainder", "pow": "power", "matmul": "matmul", "and": "bitwise_and", "or": "bitwise_or",
             "xor": "bitwise_xor", "lshift": "bitwise_left_shift", "rshift": "bitwise_right_shift"}


def _operator(name: str, op: str, reflected: bool) -> Any:
    """The method ``__name__`` (``__rname__`` when ``reflected``: the array is the right operand)."""
    f = getattr(raw, op)
    if reflected:
        def method(self, o): return f(o, self)  # noqa: E704
    else:
        def method(self, o): return f(self, o)  # noqa: E704
    method.__name__ = f"__r{name}__" if reflected else f"__{name}__"
    method.__qualname__ = f"_Methods.{method.__name__}"
    names = {"co_name": method.__name__}  # (what tracebacks and profilers show; co_qualname from Python 3.11)
    if hasattr(method.__code__, "co_qualname"):
        names["co_qualname"] = method.__qualname__
    method.__code__ = method.__code__.replace(**names)
    method.__doc__ = (f"``lf.{op}(o, self)``: the operator with this array on the right." if reflected
                      else f"``lf.{op}(self, o)``.")
    return method


for _name, _op in OPERATORS.items():
    for _reflected in (False, True):
        _m = _operator(_name, _op, _reflected)
        setattr(_Methods, _m.__name__, _m)


#: the methods that are one pure op each: taped (``ops/tape.py``) as they are
TAPED = frozenset(name for name, value in vars(_Methods).items()
                  if (callable(value) or isinstance(value, property)) and name not in (
                      "__setitem__", "_inplace", "__pos__", "__array_namespace__", "to_device", "__index__",
                      "__complex__") and not (name.startswith("__i") and name != "__invert__"))


def _attach() -> None:
    for name, value in vars(_Methods).items():
        if name not in ("__module__", "__qualname__", "__dict__", "__weakref__", "__doc__"):
            if name in TAPED and isinstance(value, property):
                value = property(taped(value.fget))
            elif name in TAPED:
                value = taped(value)
                # pickle finds a function by its module and qualified name: this one is Array's
                value.__module__, value.__qualname__ = Array.__module__, f"Array.{name}"
            setattr(Array, name, value)
    Array._from_host = staticmethod(ops.array)  # what unpickling calls (array._unpickle)
    _shortcuts()


def _shortcuts() -> None:
    """A binary operator's common call (``x + y``, ``2.0 * x``) without its two Python frames: the taped
    method calls the op's C call itself, and runs as before where that declines (``ops/ctape.py``)."""
    from .ops import core, ctape

    for name, op in OPERATORS.items():
        for reflected in (False, True):
            ctape.shortcut(getattr(Array, f"__r{name}__" if reflected else f"__{name}__"), getattr(raw, op), reflected,
                           core._binary)


_attach()
