"""``lf.Array``: a lazy value with numpy's names and MLX/JAX value semantics.

An Array is a name bound to an immutable value (:class:`~laneflow.graph.node.ArrayData`). Ops build
new values and return at once; the work runs at ``lf.eval`` or when the host needs the numbers.
``x[i] = v`` binds ``x`` to a new value: other arrays computed from the old value do not change,
while every name bound to this same Array object sees the new one (as in numpy).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .graph import compile as _compile
from .graph import schedule as _sched
from .graph.node import ArrayData


class Array:
    __slots__ = ("_data", "__weakref__")
    __array_priority__ = 100  # numpy defers binary operators to Array

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("use lf.array(...) to make an Array")

    @classmethod
    def _wrap(cls, data: ArrayData) -> "Array":
        a = object.__new__(cls)
        a._data = data
        data.arrays += 1
        if _compile.ACTIVE[0]:
            _compile.note_created(a)
        return a

    def _rebind(self, data: ArrayData) -> None:
        if _compile.ACTIVE[0]:
            _compile.check_rebind(self)
        data.arrays += 1
        old, self._data = self._data, data
        old.arrays -= 1

    def __del__(self) -> None:
        try:  # (an Array whose construction failed has no _data)
            self._data.arrays -= 1
        except AttributeError:
            pass

    # copy.copy and copy.deepcopy would otherwise fill the slot without counting the new binding,
    # letting the value be written in place while the copy still sees it. Values are immutable, so a
    # copy is a new Array bound to the same value.
    def __copy__(self) -> "Array":
        return Array._wrap(self._data)

    def __deepcopy__(self, memo: dict) -> "Array":
        return Array._wrap(self._data)

    # -- metadata (never triggers evaluation) --------------------------------------------------
    @property
    def shape(self) -> tuple:
        return self._data.shape

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    @property
    def ndim(self) -> int:
        return len(self._data.shape)

    @property
    def size(self) -> int:
        return self._data.size

    @property
    def nbytes(self) -> int:
        return self._data.nbytes

    @property
    def device(self):
        return self._data.device

    @property
    def stream(self):
        """The stream the value was (or will be) computed on."""
        return self._data.stream

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    # -- host access (evaluates) ----------------------------------------------------------------
    def _host(self) -> np.ndarray:
        # Under the scheduling lock, so another thread cannot reuse this buffer in place (x[i] = v)
        # between reading the binding and marking the buffer: the host may hold a view of it.
        with _sched.LOCK:
            d = self._data
            if d.buffer is None:
                _sched.schedule((d,))
            buf = d.buffer
            backend = d.stream.backend
            if backend.host_view:
                buf.exported = True  # the host holds a view: never reused in place from now on
            else:
                d.arrays += 1  # a binding of our own while we copy: no in-place reuse meanwhile
        try:
            _sched.wait(d)
            return backend.to_host(buf, d.shape, d.dtype)
        finally:
            if not backend.host_view:
                with _sched.LOCK:
                    d.arrays -= 1

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """The values for numpy: a read-only view (``copy=None``/``False``), or a private copy (``copy=True``)."""
        host = self._host()
        if copy:
            return np.array(host, dtype=dtype, copy=True)
        if copy is False and dtype is not None and np.dtype(dtype) != host.dtype:
            raise ValueError(f"__array__: converting a {host.dtype} array to {np.dtype(dtype)} needs a copy, "
                             "but copy=False was given; use np.asarray(x, dtype) instead")
        view = host.view()
        view.flags.writeable = False  # values are immutable: numpy must not write through
        return view if dtype is None else view.astype(dtype, copy=False)

    def item(self) -> Any:
        if self.size != 1:
            raise ValueError(f"item: only arrays of size 1 convert to a Python scalar, got shape {self.shape}")
        return self._host().reshape(()).item()

    def tolist(self) -> Any:
        return self._host().tolist()

    def __bool__(self) -> bool:
        if self.size != 1:
            raise ValueError(f"bool: the truth value of an array of shape {self.shape} is ambiguous; use .any() or .all()")
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    def __repr__(self) -> str:
        try:
            body = np.array2string(self._host(), separator=", ", prefix="array(")
        except Exception as e:  # noqa: BLE001 - repr must not raise
            body = f"<error: {e}>"
        return f"array({body}, dtype={self.dtype}, device={self.device})"

    def __str__(self) -> str:
        return str(self._host())

    def __reduce__(self):
        """Pickle the value (through the host) and its device; unpickling makes a new array there."""
        return (_unpickle, (np.array(self._host()), self.device))

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: bool | None = None) -> Any:
        from .interop.dlpack import export

        return export(self, stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        from .interop.dlpack import device_tuple

        return device_tuple(self.device)

    @property
    def __cuda_array_interface__(self) -> dict:
        """CUDA array interface v3 (GPU arrays only: elsewhere AttributeError, so ``hasattr`` is False).
        Zero-copy; consumers must not write it; ``stream`` is the writer's lane for consumers to
        synchronise on; the memory stays alive as long as this Array object does."""
        from .interop.gpu import cuda_array_interface

        return cuda_array_interface(self)

    # -- conversions and shape ------------------------------------------------------------------
    def astype(self, dtype: Any, *, stream: Any = None) -> "Array":
        return ops.astype(self, dtype, stream=stream)

    def reshape(self, *shape: Any, stream: Any = None) -> "Array":
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = shape[0]
        return ops.reshape(self, shape, stream=stream)

    def transpose(self, *axes: Any, stream: Any = None) -> "Array":
        if len(axes) == 1 and (axes[0] is None or not isinstance(axes[0], (int, np.integer))):
            axes = axes[0]
        return ops.transpose(self, axes if axes != () else None, stream=stream)

    @property
    def T(self) -> "Array":
        return ops.transpose(self)

    def flatten(self, *, stream: Any = None) -> "Array":
        return ops.flatten(self, stream=stream)

    def squeeze(self, axis: Any = None, *, stream: Any = None) -> "Array":
        return ops.squeeze(self, axis, stream=stream)

    def swapaxes(self, a: int, b: int, *, stream: Any = None) -> "Array":
        return ops.swapaxes(self, a, b, stream=stream)

    def __getitem__(self, index: Any) -> "Array":
        return ops.getitem(self, index)

    def __setitem__(self, index: Any, value: Any) -> None:
        self._rebind(ops.setitem(self, index, value)._data)

    # -- reductions -----------------------------------------------------------------------------
    def sum(self, axis=None, keepdims=False, *, stream=None): return ops.sum(self, axis, keepdims, stream=stream)  # noqa: E704
    def mean(self, axis=None, keepdims=False, *, stream=None): return ops.mean(self, axis, keepdims, stream=stream)  # noqa: E704
    def max(self, axis=None, keepdims=False, *, stream=None): return ops.max(self, axis, keepdims, stream=stream)  # noqa: E704
    def min(self, axis=None, keepdims=False, *, stream=None): return ops.min(self, axis, keepdims, stream=stream)  # noqa: E704
    def prod(self, axis=None, keepdims=False, *, stream=None): return ops.prod(self, axis, keepdims, stream=stream)  # noqa: E704
    def any(self, axis=None, keepdims=False, *, stream=None): return ops.any(self, axis, keepdims, stream=stream)  # noqa: E704
    def all(self, axis=None, keepdims=False, *, stream=None): return ops.all(self, axis, keepdims, stream=stream)  # noqa: E704
    def argmax(self, axis=None, keepdims=False, *, stream=None): return ops.argmax(self, axis, keepdims, stream=stream)  # noqa: E704
    def argmin(self, axis=None, keepdims=False, *, stream=None): return ops.argmin(self, axis, keepdims, stream=stream)  # noqa: E704

    def var(self, axis=None, keepdims=False, ddof=0, *, stream=None):
        return ops.var(self, axis, keepdims, ddof, stream=stream)

    def std(self, axis=None, keepdims=False, ddof=0, *, stream=None):
        return ops.std(self, axis, keepdims, ddof, stream=stream)

    # -- operators ------------------------------------------------------------------------------
    def __add__(self, o): return ops.add(self, o)  # noqa: E704
    def __radd__(self, o): return ops.add(o, self)  # noqa: E704
    def __sub__(self, o): return ops.subtract(self, o)  # noqa: E704
    def __rsub__(self, o): return ops.subtract(o, self)  # noqa: E704
    def __mul__(self, o): return ops.multiply(self, o)  # noqa: E704
    def __rmul__(self, o): return ops.multiply(o, self)  # noqa: E704
    def __truediv__(self, o): return ops.divide(self, o)  # noqa: E704
    def __rtruediv__(self, o): return ops.divide(o, self)  # noqa: E704
    def __floordiv__(self, o): return ops.floor_divide(self, o)  # noqa: E704
    def __rfloordiv__(self, o): return ops.floor_divide(o, self)  # noqa: E704
    def __mod__(self, o): return ops.remainder(self, o)  # noqa: E704
    def __rmod__(self, o): return ops.remainder(o, self)  # noqa: E704
    def __pow__(self, o): return ops.power(self, o)  # noqa: E704
    def __rpow__(self, o): return ops.power(o, self)  # noqa: E704
    def __matmul__(self, o): return ops.matmul(self, o)  # noqa: E704
    def __rmatmul__(self, o): return ops.matmul(o, self)  # noqa: E704
    def __neg__(self): return ops.negative(self)  # noqa: E704
    def __pos__(self): return Array._wrap(self._data)  # noqa: E704  (a new array, as numpy's +x)
    def __abs__(self): return ops.abs(self)  # noqa: E704
    def __invert__(self): return ops.invert(self)  # noqa: E704
    def __and__(self, o): return ops.and_(self, o)  # noqa: E704
    def __rand__(self, o): return ops.and_(o, self)  # noqa: E704
    def __or__(self, o): return ops.or_(self, o)  # noqa: E704
    def __ror__(self, o): return ops.or_(o, self)  # noqa: E704
    def __eq__(self, o): return ops.equal(self, o)  # type: ignore[override]  # noqa: E704
    def __ne__(self, o): return ops.not_equal(self, o)  # type: ignore[override]  # noqa: E704
    def __lt__(self, o): return ops.less(self, o)  # noqa: E704
    def __le__(self, o): return ops.less_equal(self, o)  # noqa: E704
    def __gt__(self, o): return ops.greater(self, o)  # noqa: E704
    def __ge__(self, o): return ops.greater_equal(self, o)  # noqa: E704

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

    __hash__ = None  # type: ignore[assignment]


def _unpickle(host: np.ndarray, device: Any) -> Array:
    return ops.array(host, device=device)


from . import _ops_namespace as ops  # noqa: E402  (ops build Arrays, so they import this module first)
