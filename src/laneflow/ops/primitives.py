"""Primitives: the parameters of each kernel family. Shape and dtype inference live in the op
functions (``ops/*.py``); kernels live in the backends, keyed by ``kind``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..graph.node import Primitive, Scalar, _py_type


class Constant(Primitive):
    kind = "constant"
    cacheable = False  # its host data is a value, not a parameter: the plan cache uploads it first

    def __init__(self, value: np.ndarray, name: str = "array"):
        super().__init__(name)
        self.value = value


class Elementwise(Primitive):
    """``fn`` applied elementwise with broadcasting. ``operands`` lists input indices or Scalars."""

    kind = "elementwise"
    donates = True

    def __init__(self, name: str, fn: str, operands: tuple):
        super().__init__(name)
        self.fn, self.operands = fn, operands

    def cache_info(self) -> tuple:
        ck = self.__dict__.get("_ck")
        if ck is None:
            ops = self.operands
            sc = tuple([o for o in ops if o.__class__ is Scalar])
            key = (Elementwise, self.name, self.fn,
                   tuple([o if o.__class__ is int else (Scalar, _py_type(o.value)) for o in ops]) if sc else ops,
                   self.__dict__.get("in_views"))
            ck = self.__dict__["_ck"] = (key, sc)
        return ck

    def scalars(self) -> tuple:
        return tuple(o for o in self.operands if o.__class__ is Scalar)

    def with_own_scalars(self) -> "Elementwise":
        p = Elementwise(self.name, self.fn, tuple(Scalar(o.value) if o.__class__ is Scalar else o
                                                  for o in self.operands))
        vs = self.__dict__.get("in_views")
        if vs is not None:
            p.in_views = vs
        return p


class AsType(Primitive):
    kind = "astype"

    def __init__(self, dtype: np.dtype):
        super().__init__("astype")
        self.dtype = dtype


class Reduce(Primitive):
    """sum prod max min any all mean var std over ``axes`` (a tuple)."""

    kind = "reduce"

    def __init__(self, name: str, axes: tuple, keepdims: bool, ddof: int = 0):
        super().__init__(name)
        self.axes, self.keepdims, self.ddof = axes, keepdims, ddof


class ArgReduce(Primitive):
    kind = "argreduce"

    def __init__(self, name: str, axis: int | None, keepdims: bool):
        super().__init__(name)
        self.axis, self.keepdims = axis, keepdims


class Softmax(Primitive):
    kind = "softmax"

    def __init__(self, axes: tuple):
        super().__init__("softmax")
        self.axes = axes


class LogSumExp(Primitive):
    kind = "logsumexp"

    def __init__(self, axes: tuple, keepdims: bool):
        super().__init__("logsumexp")
        self.axes, self.keepdims = axes, keepdims


class Matmul(Primitive):
    """``gkey``: (shape of a, shape of b, dtype) when the product may be grouped with others like it
    (graph/grouping.py: equal batches, one float dtype for both operands and the result), else None."""

    kind = "matmul"

    def __init__(self, gkey: tuple | None = None) -> None:
        super().__init__("matmul")
        self.gkey = gkey


class MatmulEpilogue(Matmul):
    """``a @ b`` with an epilogue fused in by ``graph/epilogue.py``: inputs ``(a, b[, bias][, residual])``;
    ``out = act(a @ b + bias + residual)``, accumulated in the compute dtype and rounded once (the
    unfused graph rounds after each op; results agree within the dtype's rounding). ``act`` is None or
    ``"gelu_tanh"``. On the GPU this is one cuBLASLt call (epilogue ``BIAS`` / ``GELU_BIAS``, the
    residual as ``C`` with ``beta = 1``)."""

    def __init__(self, bias: bool, residual: bool, act: str | None):
        super().__init__(None)
        self.name = "matmul+" + "+".join(n for n, on in (("bias", bias), ("residual", residual), (act, act)) if on)
        self.bias, self.residual, self.act = bias, residual, act


class Norm(Primitive):
    """``lf.nn.layer_norm`` (``op="layer_norm"``) or ``lf.nn.rms_norm`` over the last axis: inputs
    ``(x[, weight][, bias])``, statistics in float32 (float64 for float64)."""

    kind = "norm"

    def __init__(self, op: str, eps: float, weight: bool, bias: bool):
        super().__init__(op)
        self.eps, self.weight, self.bias = eps, weight, bias


class Attention(Primitive):
    """``lf.nn.scaled_dot_product_attention``: inputs ``(q, k, v[, mask])``; ``mask`` is None, ``"bool"``
    (True: attend) or ``"additive"``; ``causal`` is bottom-right aligned."""

    kind = "attention"

    def __init__(self, scale: float, causal: bool, mask: str | None):
        super().__init__("scaled_dot_product_attention")
        self.scale, self.causal, self.mask = scale, causal, mask


class Reshape(Primitive):
    kind = "reshape"

    def __init__(self, shape: tuple, name: str = "reshape"):
        super().__init__(name)
        self.shape = shape


class Transpose(Primitive):
    kind = "transpose"

    def __init__(self, perm: tuple, name: str = "transpose"):
        super().__init__(name)
        self.perm = perm


class BroadcastTo(Primitive):
    kind = "broadcast_to"

    def __init__(self, shape: tuple):
        super().__init__("broadcast_to")
        self.shape = shape


class Concatenate(Primitive):
    kind = "concatenate"

    def __init__(self, axis: int, name: str = "concatenate"):
        super().__init__(name)
        self.axis = axis


class GetItem(Primitive):
    """``x[index]``. ``index`` is a tuple of ints, slices, None and ``Ellipsis``-free entries; an int
    ``k`` wrapped as ``("array", k)`` refers to input ``k`` (an integer index array)."""

    kind = "getitem"
    plain = False  # slices or floats among its parameters

    def __init__(self, index: tuple):
        super().__init__("getitem")
        self.index = index


class SetItem(Primitive):
    """New value of ``x`` after ``x[index] = v``: inputs (x, v, *index arrays). Writes in place when it can."""

    kind = "setitem"
    plain = False  # slices or floats among its parameters
    donates = True

    def __init__(self, index: tuple):
        super().__init__("setitem")
        self.index = index


class DynamicSlice(Primitive):
    """``x[start : start + sizes]``: inputs (x, *start arrays). ``static[k]`` is the clamped start of
    dimension k, or None where the next start array gives it (clamped by the kernel)."""

    kind = "dynamic_slice"

    def __init__(self, static: tuple, sizes: tuple):
        super().__init__("dynamic_slice")
        self.static, self.sizes = static, sizes


class DynamicUpdateSlice(Primitive):
    """``x`` with ``update`` written at ``start``: inputs (x, update, *start arrays); ``static`` as in
    :class:`DynamicSlice`. Writes in place when nothing else can see ``x``."""

    kind = "dynamic_update_slice"
    donates = True

    def __init__(self, static: tuple):
        super().__init__("dynamic_update_slice")
        self.static = static


class Take(Primitive):
    kind = "take"

    def __init__(self, axis: int | None):
        super().__init__("take")
        self.axis = axis


class Full(Primitive):
    kind = "full"
    plain = False  # slices or floats among its parameters

    def __init__(self, value: Any, name: str = "full"):
        super().__init__(name)
        self.value = value


class Arange(Primitive):
    kind = "arange"
    plain = False  # slices or floats among its parameters

    def __init__(self, start: Any, step: Any):
        super().__init__("arange")
        self.start, self.step = start, step


class Linspace(Primitive):
    kind = "linspace"
    plain = False  # slices or floats among its parameters

    def __init__(self, start: float, stop: float, endpoint: bool):
        super().__init__("linspace")
        self.start, self.stop, self.endpoint = start, stop, endpoint


class Eye(Primitive):
    kind = "eye"

    def __init__(self, k: int):
        super().__init__("eye")
        self.k = k


class Random(Primitive):
    """Counter-based random numbers (Philox-4x32-10) from a key input: same key, same numbers."""

    kind = "random"
    plain = False  # slices or floats among its parameters

    def __init__(self, name: str, dist: str, a: float, b: float):
        super().__init__(name)
        self.dist, self.a, self.b = dist, a, b


class RandomSplit(Primitive):
    kind = "random_split"

    def __init__(self, num: int):
        super().__init__("random.split")
        self.num = num


class Copy(Primitive):
    """A copy of the input, possibly to another device (the input's backend reads, the output's writes)."""

    kind = "copy"

    def __init__(self, name: str = "copy"):
        super().__init__(name)


class Sort(Primitive):
    """``lf.sort`` (``arg`` False) or ``lf.argsort`` (True) along ``axis``; always stable."""

    kind = "sort"

    def __init__(self, name: str, axis: int, descending: bool, arg: bool):
        super().__init__(name)
        self.axis, self.descending, self.arg = axis, descending, arg


class SearchSorted(Primitive):
    """``lf.searchsorted``: insertion points of input 1 into the sorted 1-d input 0."""

    kind = "searchsorted"

    def __init__(self, right: bool):
        super().__init__("searchsorted")
        self.right = right


class Scan(Primitive):
    """``lf.cumulative_sum`` / ``cumulative_prod`` (``op`` "sum" or "prod") along ``axis``; half types
    accumulate in float32; ``include_initial`` puts the identity first."""

    kind = "scan"

    def __init__(self, name: str, op: str, axis: int, include_initial: bool):
        super().__init__(name)
        self.op, self.axis, self.include_initial = op, axis, include_initial
