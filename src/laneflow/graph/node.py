"""Graph nodes. An :class:`ArrayData` is one immutable value: pending (a primitive applied to inputs)
or evaluated (a buffer). Evaluation drops the primitive and inputs, so an evaluated value keeps only
its buffer and the graph behind it can be freed.
"""

from __future__ import annotations

import struct

from typing import Any

import numpy as np


class Scalar:
    """A Python scalar operand of an elementwise op, kept weak (NEP 50) and passed to the kernel. Its
    value is a run-time parameter: the plan cache keys a graph by the scalar's type, not its value."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return f"Scalar({self.value!r})"


def reads_view(prim: "Primitive", pos: int) -> bool:
    """Whether ``prim``'s kernel reads input ``pos`` through a view of another value's memory
    (``graph/views.py``): such an input is never written in place."""
    vs = prim.__dict__.get("in_views")
    return vs is not None and vs[pos] is not None


def _py_type(v: Any) -> type:
    t = v.__class__
    if t is bool or t is int or t is float:
        return t
    return bool if isinstance(v, (bool, np.bool_)) else int if isinstance(v, (int, np.integer)) else float


class Primitive:
    """What a node computes. ``kind`` names the kernel family a backend implements; ``name`` is the
    user-facing op name used in errors, stats and traces. ``donates``: output 0 may reuse input 0's
    buffer when nothing else can observe it (same shape and dtype), which is a real in-place write.
    ``one_allocation``: the outputs (alike, made and usually dropped together) share one allocation
    where the backend offers ``allocate_many``. ``cacheable``: the plan cache may key a graph holding
    it by :meth:`cache_key` (False for a primitive whose parameters are data: a constant's host array,
    a user kernel's launch closure).

    Primitives are immutable once made, except the values of their :class:`Scalar` operands, which the
    plan cache treats as run-time parameters.
    """

    kind = "?"
    donates = False
    one_allocation = False
    cacheable = True
    #: The parameters are plain hashable values (ints, tuples of ints, dtypes, strings): the key is
    #: them as they are. Primitives holding Scalars, slices or dicts say False and are frozen.
    plain = True
    #: None, or ``lane_for(stream)``: the lane the command must run on (``lf.distributed``'s
    #: collectives: their group's communication lane), instead of the one the encoder would choose.
    lane_for = None
    #: a pinned primitive (``lane_for``) a whole-plan executor may capture (NCCL's collectives)
    capturable = False

    def __init__(self, name: str):
        self.name = name

    def cache_key(self) -> tuple:
        """The primitive's static parameters as a hashable key (computed once; Scalars by type only)."""
        return self.cache_info()[0]

    def cache_info(self) -> tuple:
        """``(cache_key(), scalars())``, computed once and kept as ``_ck`` (what the plan cache reads
        per node: ``prim._ck``, with this as the fallback)."""
        d = self.__dict__
        ck = d.get("_ck")
        if ck is None:
            if self.plain:
                key = (type(self), *d.values())
            else:
                key = (type(self), tuple((n, _freeze(v)) for n, v in d.items()))
            ck = d["_ck"] = (key, self.scalars())
        return ck

    def scalars(self) -> tuple:
        """The Scalar operands (run-time parameters), in a fixed order."""
        return ()

    def with_own_scalars(self) -> "Primitive":
        """This primitive, or a copy with Scalar objects of its own (which a cached plan may set)."""
        return self

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if k not in ("name", "_ck"))
        return f"{type(self).__name__}({self.name}{', ' if fields else ''}{fields})"


def same_number(a: Any, b: Any) -> bool:
    """Whether two equal numbers are the same value for a kernel: also the signs of zero, in the real
    and the imaginary part (``-0.0 == 0.0`` and ``-0j == 0j`` in Python; ``x * -0.0`` is not ``x * 0.0``),
    whatever their classes (a float and a numpy float of one value are one). ``a == b`` is the
    caller's to check first."""
    try:
        za, zb = complex(a), complex(b)
    except (TypeError, ValueError):
        return True
    return _PACK2(za.real, za.imag) == _PACK2(zb.real, zb.imag)


def exact(a: Any) -> Any:
    """A float's or complex number's bits, numpy's inexact scalars (ml_dtypes' bfloat16 too) with their
    dtype; None for anything else. Two numbers of one class with the same ``exact`` are the same value
    to a kernel: the signs of zero and of NaN apart (``-0.0 == 0.0``; NaN is not equal to itself)."""
    c = a.__class__
    if c is float:
        return _PACK(a)
    if c is complex:
        return _PACK2(a.real, a.imag)
    if isinstance(a, np.generic) and not isinstance(a, (np.integer, np.bool_)):
        return a.dtype.str, a.tobytes()
    return None


_PACK = struct.Struct("<d").pack
_PACK2 = struct.Struct("<dd").pack


def _freeze(v: Any) -> Any:
    """A hashable stand-in for a primitive's parameter (numbers that a kernel tells apart are apart:
    ``-0.0`` and ``0.0``, NaNs of either sign; the same NaN is equal to itself)."""
    c = v.__class__
    if c is tuple or c is list:
        return tuple(_freeze(x) for x in v)
    if c is Scalar:
        return (Scalar, _py_type(v.value))
    if c is slice:
        return (slice, v.start, v.stop, v.step)
    if c is dict:
        return (dict, tuple(sorted((k, _freeze(x)) for k, x in v.items())))
    bits = exact(v)
    if bits is not None:
        return (c, bits)
    if isinstance(v, np.generic):  # (a key holds no numpy scalar: one compared with a tuple broadcasts)
        return (c, v.item())
    return v


class ArrayData:
    """A value in the graph.

    ``users`` counts pending nodes that take this value as input; ``arrays`` counts user-visible
    :class:`~laneflow.Array` objects bound to it. A buffer may be reused in place only when the one
    node about to consume it is its only user and no array can still see it.
    """

    __slots__ = ("shape", "dtype", "device", "stream", "prim", "inputs", "siblings",
                 "buffer", "users", "arrays", "__weakref__")

    def __init__(self, shape: tuple, dtype: np.dtype, stream: Any, prim: Primitive | None,
                 inputs: tuple = ()):
        self.shape = shape
        self.dtype = dtype
        self.stream = stream
        self.device = stream.device
        self.prim = prim
        self.inputs = inputs
        self.siblings: tuple | None = None
        self.buffer = None
        self.users = 0
        self.arrays = 0
        for i in inputs:
            i.users += 1

    @property
    def pending(self) -> bool:
        return self.buffer is None

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __repr__(self) -> str:
        state = self.prim.name if self.prim is not None else "evaluated"
        return f"<ArrayData {self.shape} {self.dtype} {state}>"


_buffer_slot = ArrayData.buffer  # the slot's descriptor: LazyData reads and writes it under its property


class LazyData(ArrayData):
    """An evaluated value whose :class:`~laneflow.runtime.buffer.Buffer` is made on first use: a
    compiled call returns tens of values, most of them read once or dropped, and a buffer with its
    device handle costs two more Python objects each (about 1 us per value on the H200 host). The
    ``lease`` (one per call, shared by its values) makes the buffer: ``lease.materialize(self)``;
    ``spec`` is the lease's description of this value. Never pending; ``buffer`` is never None."""

    __slots__ = ("lease", "spec")
    # Constant for every such value: class attributes, so making one stores less (never assigned:
    # a LazyData is never scheduled)
    prim = None
    inputs = ()
    siblings = None

    def made(self):
        """The buffer if it was made already, else None (never makes it)."""
        try:
            return _buffer_slot.__get__(self)
        except AttributeError:  # not filled at creation
            return None

    @property
    def buffer(self):
        b = self.made()
        if b is None:
            b = self.lease.materialize(self)  # fills the slot, once, under the scheduler lock
        return b

    @buffer.setter
    def buffer(self, value) -> None:
        _buffer_slot.__set__(self, value)

    @property
    def pending(self) -> bool:
        return False


def multi_output(datas: list[ArrayData]) -> list[ArrayData]:
    """Tie the outputs of one primitive together: scheduling any of them produces all."""
    sib = tuple(datas)
    for d in datas:
        d.siblings = sib
    return datas
