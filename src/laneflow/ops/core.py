"""Helpers every op uses: turning arguments into graph values and building nodes."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import dtypes as dt
from ..array import Array
from ..graph import speculate as _speculate
from ..graph import tracer as _tracer
from ..graph.node import ArrayData, Primitive, multi_output
from ..defaults import resolve_stream
from ..shapes import broadcast_shapes  # noqa: F401 - the ops' shared import point
from .primitives import AsType, Constant, Copy

Shape = tuple


def shared(cls: type, *args: Any) -> Primitive:
    """``cls(*args)``, one object per distinct arguments (primitives are immutable): a model's forward
    makes the same reshapes and reductions every call, so this saves an object per op and lets the
    plan cache read a key computed once (``Primitive.cache_info``). ``args`` must be hashable."""
    key = (cls, args)
    p = _SHARED.get(key)
    if p is None:
        p = cls(*args)
        if len(_SHARED) < 8192:
            _SHARED[key] = p
    return p


_SHARED: dict = {}


def remembered(cache: dict, key: Any, make: Any) -> Any:
    """``cache[key]``, made by ``make()`` the first time (and kept while the cache holds fewer than
    4096; a None key is never kept). The ops keep so what they check and infer per shape, for a
    forward that makes the same reshapes, slices and reductions at every call."""
    hit = cache.get(key)
    if hit is None:
        hit = make()
        if key is not None and len(cache) < 4096:
            cache[key] = hit
    return hit


def node(prim: Primitive, inputs: Sequence[ArrayData], shape: Shape, dtype: np.dtype, stream) -> Array:
    """A new pending value, and the Array bound to it (``Array._wrap``, inlined: every op makes one).
    The node and its array are made in one C call where the tape's C module loads (``ctape.fresh``:
    the same objects, about a third of the time of the Python lines below)."""
    if inputs.__class__ is not tuple:
        inputs = tuple(inputs)
    if shape.__class__ is not tuple:
        shape = tuple(shape)
    if _fresh[0] is not None:
        a = _fresh[0](prim, inputs, shape, dtype, stream)
    else:
        d = ArrayData(shape, dtype, stream, prim, inputs)
        a = _new(Array)
        a._data = d
        d.arrays = 1
    if _tracing[0]:
        _tracer.note_created(a)
    elif _watch[0]:  # the first node since a plan-cache hit: it may start the next one (graph/speculate.py)
        _speculate.first_node(a._data)
    return a


def _node_maker() -> Any:
    """``ctape.fresh`` (the C module is loaded at import for the ops' tape wrappers), or None: no C
    compiler here, or ``LANEFLOW_CTAPE=0``."""
    from . import ctape

    mod = ctape.load()
    return None if mod is None else mod.fresh


def _binary_maker() -> Any:
    """``ctape.binary`` (a binary elementwise op's common call in one C call: ops/elementwise.py), set up
    with what it reads of the current stream, tracing and the plan cache's watch; or None."""
    from . import ctape
    from .. import defaults

    mod = ctape.load()
    if mod is None:
        return None
    mod.init_binary(defaults._local, vars(defaults), _tracer.ACTIVE, _speculate.WATCH)
    return mod.binary


_new = object.__new__
#: the C node maker, or None (the Python lines in ``node``); tests compare the two
_fresh = [_node_maker()]
#: the C binary op call, or None (the Python op's own lines); tests compare the two
_binary = [_binary_maker()]
_tracing = _tracer.ACTIVE
_watch = _speculate.WATCH


def outputs(prim: Primitive, inputs: Sequence[ArrayData], specs: Sequence[tuple], stream) -> tuple[Array, ...]:
    """One Array per ``(shape, dtype)`` spec, all outputs of one ``prim`` node; several are tied
    together (scheduling any of them produces all)."""
    inputs = tuple(inputs)
    datas = [ArrayData(tuple(shape), dtype, stream, prim, inputs) for shape, dtype in specs]
    if len(datas) > 1:
        multi_output(datas)
    return tuple(Array._wrap(d) for d in datas)


def to_stream(d: ArrayData, st, op: str) -> ArrayData:
    """The value on st's device: the same node, or a copy to that device."""
    if d.device is st.device or d.device == st.device:
        return d
    return ArrayData(d.shape, d.dtype, st, Copy(f"{op}.to_{st.device}"), (d,))  # e.g. add.to_gpu:1


def cast(d: ArrayData, dtype: np.dtype, st) -> ArrayData:
    """d converted to dtype (d itself when it already has it)."""
    if d.dtype == dtype:
        return d
    return ArrayData(d.shape, dtype, st, shared(AsType, dtype), (d,))


def constant(value: Any, st, dtype: np.dtype | None = None, op: str = "array") -> ArrayData:
    """Host data (list, scalar, numpy array) as a new value on st's device. Always copies."""
    try:
        host = np.array(value, dtype=dtype, copy=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise type(e)(f"{op}: cannot convert {type(value).__name__} to an array: {e}") from None
    if dtype is None:
        host = host.astype(_default_dtype(host, op), copy=False)
    else:
        host = host.astype(dtype, copy=False)
    return ArrayData(host.shape, host.dtype, st, Constant(host, op))


def _default_dtype(host: np.ndarray, op: str) -> np.dtype:
    """The laneflow dtype of host data: its own, or the nearest wider one laneflow has (documented in
    laneflow/dtypes.py: int16 and uint16 become int32, uint64 int64; other floats float64)."""
    d = host.dtype
    if d in dt.DTYPES:
        return d
    if d.kind == "f":
        return dt.float64
    if d.kind == "c":
        return dt.complex128
    wider = dt.wider(d)
    if wider is not None:
        if d.kind == "u" and host.size and int(host.max()) > np.iinfo(wider).max:
            raise OverflowError(f"{op}: value {int(host.max())} of a {d} array does not fit {wider}, the widest "
                                "integer laneflow has")
        return wider
    raise TypeError(f"{op}: unsupported element type {d} (laneflow supports {', '.join(map(str, dt.DTYPES))})")


def operand(x: Any, st, op: str) -> ArrayData:
    """An op's array argument: an Array (moved to st's device if needed) or host data (a constant)."""
    if x.__class__ is Array:
        d = x._data
        return d if d.device is st.device else to_stream(d, st, op)
    if isinstance(x, Array):
        return to_stream(x._data, st, op)
    if isinstance(x, (list, tuple, np.ndarray, np.generic, bool, int, float)):
        return constant(x, st, op=op)
    raise TypeError(f"{op}: expected an lf.Array, a number or array-like data, got {type(x).__name__}")


#: an op's ``stream=`` argument -> its Stream (None: the current stream); the ops' name for it
stream_of = resolve_stream


class AxisError(ValueError, IndexError):
    """An axis out of range: a ValueError (numpy) and an IndexError (the array API standard)."""


def normalize_axis(axis: Any, ndim: int, op: str) -> int:
    if axis.__class__ is int and -ndim <= axis < ndim:
        return axis % ndim
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"{op}: axis must be an int, got {type(axis).__name__}")
    a = int(axis)
    if not -ndim <= a < ndim:
        raise AxisError(f"{op}: axis {a} is out of bounds for an array of {ndim} dimensions")
    return a % ndim if ndim else 0


def normalize_axes(axis: Any, ndim: int, op: str) -> tuple:
    """None means all axes; an int or a tuple of ints, each in range, without repeats."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (list, tuple)):
        axes = tuple(normalize_axis(a, ndim, op) for a in axis)
        if len(set(axes)) != len(axes):
            raise ValueError(f"{op}: repeated axis in {tuple(axis)}")
        return tuple(sorted(axes))
    return (normalize_axis(axis, ndim, op),)


def as_int(v: Any, what: str, op: str) -> int:
    """An integer argument (a Python or numpy int; floats and bools are refused, as numpy does)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{op}: {what} must be an int, got {v!r} of type {type(v).__name__}")
    return int(v)


def check_shape(shape: Any, op: str) -> tuple:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (int(shape),)
    if not isinstance(shape, (tuple, list, np.ndarray)):
        raise TypeError(f"{op}: shape must be an int or a sequence of ints, got {shape!r}")
    shape = tuple(shape)
    for s in shape:  # (the common case, Python ints, checked without making a message per size)
        if s.__class__ is not int:
            shape = tuple(as_int(s, f"each size in shape {shape}", op) for s in shape)
            break
    if any(s < 0 for s in shape):
        raise ValueError(f"{op}: negative dimension in shape {shape}")
    return shape


def describe(*ds: ArrayData) -> str:
    return ", ".join(f"{d.shape} {d.dtype}" for d in ds)


def ordered(op: str, *ds: ArrayData) -> None:
    """Refuse complex operands of an op that orders values (max, sort, less...): the array API
    defines no order of complex numbers."""
    if any(d.dtype.kind == "c" for d in ds):
        raise TypeError(f"{op}: not defined for complex dtypes (complex numbers have no order); got "
                        f"{describe(*ds)}; order by lf.real(x) or lf.abs(x) instead")
