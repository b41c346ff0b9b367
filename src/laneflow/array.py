"""``lf.Array``: a lazy value with numpy's names and MLX/JAX value semantics.

An Array is a name bound to an immutable value (:class:`~laneflow.graph.node.ArrayData`). Ops build
new values and return at once; the work runs at ``lf.eval`` or when the host needs the numbers.
``x[i] = v`` binds ``x`` to a new value: other arrays computed from the old value do not change,
while every name bound to this same Array object sees the new one (as in numpy).

This module holds the value, its metadata and host access. The layers above attach the rest of the
method-style API, as JAX attaches its array methods: ``_array_methods.py`` the operators and methods
such as ``.reshape`` and ``.sum``, ``interop/dlpack.py`` ``__dlpack__`` and
``__cuda_array_interface__``. So this module imports no op, and the ops import it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .graph import eval_cache
from .graph import tape as _tape
from .graph import tracer as _tracer
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
        if _tracer.ACTIVE[0]:
            _tracer.note_created(a)
        return a

    def _rebind(self, data: ArrayData) -> None:
        if _tracer.ACTIVE[0]:
            _tracer.check_rebind(self)
        data.arrays += 1
        old, self._data = self._data, data
        old.arrays -= 1

    def __del__(self) -> None:
        # (ops/ctape.py replaces this with the same finalizer in C where its module builds)
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
        _tape.HOST_READS[0] += 1
        with _sched.LOCK:
            d = self._data
            if d.buffer is None:
                eval_cache.schedule((d,))
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

    __hash__ = None  # type: ignore[assignment]


def _unpickle(host: np.ndarray, device: Any) -> Array:
    return Array._from_host(host, device=device)  # lf.array, attached by _array_methods.py
