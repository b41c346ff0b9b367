"""The op table: every elementwise op, reduction and primitive kind, declared once.

Everything that needs to know about an op reads its row here: the public namespace
(``ops/elementwise.py`` makes ``lf.add`` from the row ``add``), the CPU kernels (the row's numpy
reference), the CUDA expression generator (``backends/cuda/kernels/expressions.py`` has one C
expression per row, or lists the row in its ``UNSUPPORTED``), the fusion pass (``fuses``), the CUDA
graph (``validated``: inputs a kernel checks on the host when it can see them) and the op tests
(``tests/test_op_table.py`` checks that every backend covers every row).

Adding an elementwise op is one :class:`Elementwise` row below, one C expression where the CUDA
backend needs it (``expressions.py``), and its test against numpy. ``logaddexp`` is the worked
example: its row and its expression are all the code it took.

This module imports only numpy and the dtypes, so any layer (backends included) may read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .. import dtypes as dt


@dataclass(frozen=True)
class Elementwise:
    """One elementwise op.

    ``numpy``: the numpy ufunc that is the CPU reference and whose loop resolution gives the result
    dtype (numpy's rules, bit for bit). Ops numpy has no ufunc for give ``like`` instead (the ufunc
    whose dtype rule they follow: ``"exp"`` makes integer inputs float) and ``reference``, the CPU
    computation ``reference(out_dtype, *args)``.
    ``predicate``: the result is bool whatever the inputs (comparisons, logical ops, isnan).
    ``validated``: input positions a kernel checks on the host when it holds a host copy (an integer
    power's exponent); a compiled graph runs such calls as commands so errors match eager mode.
    ``fuses``: may join a fused elementwise kernel (``graph/fusion.py``); False for ops with a
    host-side check.
    ``public``: ``lf.<name>`` is generated from this row (False: a hand-written constructor in
    ``ops/elementwise.py`` builds it, e.g. ``where`` and ``power``, or it is internal: ``identity``).
    ``complex_reference``: the CPU computation ``complex_reference(z)`` for complex inputs where numpy's
    ufunc misses the array API's special cases (expm1 of infinities).
    ``real_only``: defined for real values only (the array API orders no complex numbers, and gives
    these functions no complex meaning; numpy has no complex erf either); complex operands raise
    TypeError naming the op, on every backend.
    """

    name: str
    arity: int
    numpy: str | None = None
    like: str | None = None
    reference: Callable | None = None
    predicate: bool = False
    validated: tuple[int, ...] = ()
    fuses: bool = True
    public: bool = True
    real_only: bool = False
    complex_reference: Callable | None = None
    doc: str = ""

    @property
    def ufunc(self) -> np.ufunc | None:
        """The numpy ufunc whose loops give this op's dtypes (its own, or the one it is ``like``)."""
        name = self.numpy or self.like
        return getattr(np, name) if name else None


def compute_in(x, dtype):
    """x as floats of the precision a result of ``dtype`` is computed in: float32 for the half types
    (special functions are accurate there), else ``dtype`` itself. Integer and bool inputs are
    converted first, so nothing wraps around."""
    half = dtype == dt.float16 or dtype == dt.bfloat16
    return np.asarray(x).astype(dt.float32 if half else dtype, copy=False)


_erf64 = np.frompyfunc(math.erf, 1, 1)


def _erf(dtype, x):
    x = compute_in(x, dtype)
    return np.asarray(_erf64(x.astype(dt.float64)), dtype=dt.float64).astype(x.dtype, copy=False)


def _gelu(dtype, x):
    x = compute_in(x, dtype)
    return 0.5 * x * (1.0 + _erf(x.dtype, x * x.dtype.type(1 / math.sqrt(2.0))))


#: sqrt(2 / pi), the tanh GELU's constant
GELU_TANH_C = math.sqrt(2.0 / math.pi)


def _gelu_tanh(dtype, x):
    x = compute_in(x, dtype)
    c = x.dtype.type
    return c(0.5) * x * (c(1.0) + np.tanh(c(GELU_TANH_C) * (x + c(0.044715) * x * x * x)))


def _silu(x):
    return x / (x.dtype.type(1.0) + np.exp(-x))


def _expm1_complex(z):
    """``exp(z) - 1`` without cancellation for small z; the standard's special cases (those of exp, less
    one) where a part is infinite or NaN, which numpy's complex expm1 does not give."""
    z = np.asarray(z)
    x, y = z.real, z.imag
    s = np.sin(y / 2)
    near = (np.expm1(x) * np.cos(y) - 2 * s * s) + 1j * (np.exp(x) * np.sin(y))
    return np.where(np.isfinite(z), near, np.exp(z) - 1).astype(z.dtype, copy=False)


def _tanh_complex(z):
    """numpy's complex tanh, with the standard's value at an infinite real part and a finite imaginary
    one: ``+-1 + 0j`` with the zero's sign the imaginary part's (numpy signs it by ``sin(2 im)``)."""
    z = np.asarray(z)
    with np.errstate(all="ignore"):
        r = np.array(np.tanh(z), dtype=z.dtype, copy=True)
    at = np.isinf(z.real) & np.isfinite(z.imag)
    if at.any():
        r.real[at] = np.copysign(1, z.real[at])
        r.imag[at] = np.copysign(0, z.imag[at])
    return r


def _where(dtype, c, a, b):
    # Both branches in the result dtype first: numpy has no common dtype for some pairs laneflow
    # promotes (bfloat16 with float16 gives float32).
    return np.where(c, np.asarray(a).astype(dtype, copy=False), np.asarray(b).astype(dtype, copy=False))


def _rows(*rows: Elementwise) -> dict[str, Elementwise]:
    return {r.name: r for r in rows}


def _u(name: str, npname: str | None = None, **kw) -> Elementwise:
    return Elementwise(name, 1, npname or name, **kw)


def _b(name: str, npname: str | None = None, **kw) -> Elementwise:
    return Elementwise(name, 2, npname or name, **kw)


#: Every elementwise op, by name (the name is also the primitive's ``fn``).
ELEMENTWISE: dict[str, Elementwise] = _rows(
    _b("add"), _b("subtract"), _b("multiply"), _b("divide"), _b("floor_divide", real_only=True), _b("remainder", real_only=True),
    # integers to negative integer powers are refused, as in numpy: checked on the host when it can
    _b("power", validated=(1,), fuses=False, public=False),
    _b("maximum", real_only=True), _b("minimum", real_only=True),
    _b("logaddexp", real_only=True, doc="``log(exp(a) + exp(b))`` computed without overflow (numpy's ``np.logaddexp``)."),
    _b("hypot", real_only=True, doc="``sqrt(a**2 + b**2)`` without intermediate overflow (numpy's ``np.hypot``)."),
    _b("nextafter", real_only=True,
       doc="The next representable value after ``a`` towards ``b``, in ``a``'s floating dtype "
           "(numpy's ``np.nextafter``; integers give float64)."),
    _b("equal", predicate=True), _b("not_equal", predicate=True), _b("less", predicate=True, real_only=True),
    _b("less_equal", predicate=True, real_only=True), _b("greater", predicate=True, real_only=True),
    _b("greater_equal", predicate=True, real_only=True),
    _b("logical_and", predicate=True), _b("logical_or", predicate=True),
    _u("negative"), _u("abs", "absolute"), _u("sign"), _u("exp"), _u("log"), _u("log1p"), _u("sqrt"),
    _u("square"), _u("sin"), _u("cos"), _u("tanh", complex_reference=_tanh_complex),
    _u("logical_not", predicate=True), _u("isnan", predicate=True), _u("isfinite", predicate=True),
    # the array API standard's elementwise functions (numpy's ufuncs, under the standard's names)
    _u("acos", "arccos"), _u("acosh", "arccosh"), _u("asin", "arcsin"), _u("asinh", "arcsinh"),
    _u("atan", "arctan"), _u("atanh", "arctanh"), _b("atan2", "arctan2", real_only=True), _u("cosh"), _u("sinh"), _u("tan"),
    _u("expm1", complex_reference=_expm1_complex), _u("log2"), _u("log10"), _u("ceil", real_only=True), _u("floor", real_only=True), _u("trunc", real_only=True),
    _u("rint", public=False, doc="Round to the nearest integer, halves to even (``lf.round`` of floats)."),
    _u("positive"), _u("reciprocal"), _b("copysign", real_only=True),
    _u("isinf", predicate=True), _u("signbit", predicate=True, real_only=True), _b("logical_xor", predicate=True),
    _b("bitwise_and"), _b("bitwise_or"), _b("bitwise_xor"), _u("bitwise_invert", "invert"),
    _b("bitwise_left_shift", "left_shift"), _b("bitwise_right_shift", "right_shift"),
    Elementwise("rsqrt", 1, like="exp", reference=lambda dtype, x: 1.0 / np.sqrt(compute_in(x, dtype)),
                doc="Elementwise ``1 / sqrt(x)``; integer inputs give floats as ``np.sqrt`` does."),
    Elementwise("sigmoid", 1, like="exp", reference=lambda dtype, x: 1.0 / (1.0 + np.exp(-compute_in(x, dtype))),
                doc="Elementwise logistic function ``1 / (1 + exp(-x))``."),
    Elementwise("erf", 1, like="exp", reference=_erf, real_only=True, doc="Elementwise Gauss error function."),
    # the activations of lf.nn (public there, not as lf.<name>): one fused step each
    Elementwise("gelu", 1, like="exp", reference=_gelu, public=False, real_only=True,
                doc="``0.5 x (1 + erf(x / sqrt 2))``: GELU as defined (``lf.nn.gelu``)."),
    Elementwise("gelu_tanh", 1, like="exp", reference=_gelu_tanh, public=False, real_only=True,
                doc="``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``: GELU's tanh approximation."),
    Elementwise("silu", 1, like="exp", reference=lambda dtype, x: _silu(compute_in(x, dtype)), public=False,
                doc="``x / (1 + exp(-x))`` (SiLU, swish)."),
    # complex parts (built by ops/elementwise.real/imag/conj; real inputs are returned as they are).
    # real and imag have numpy's absolute's dtype rule: complex64 gives float32
    Elementwise("real", 1, like="absolute", reference=lambda dtype, x: np.real(x), public=False,
                doc="The real part of a complex number."),
    Elementwise("imag", 1, like="absolute", reference=lambda dtype, x: np.imag(x), public=False,
                doc="The imaginary part of a complex number."),
    _u("conj", "conjugate", public=False, doc="The complex conjugate."),
    # ``where(c, x, y)``: the dtype of x and y promoted (built by ops/elementwise.where)
    Elementwise("where", 3, like="add", reference=_where, public=False),
    # a dtype conversion as a step of a fused kernel (what astype computes): the cast is the work
    Elementwise("identity", 1, reference=lambda dtype, x: x, public=False),
)


@dataclass(frozen=True)
class Reduction:
    """One reduction (``lf.sum`` and friends).

    ``numpy``: the numpy function that is the reference and gives the result dtype of a default call.
    ``combine``: the elementwise op (a row of :data:`ELEMENTWISE`) that combines two partial results;
    mean, var and std add (their epilogue divides).
    ``identity``: the neutral element of ``combine``: ``zero``, ``one``, ``lowest`` (max) or
    ``highest`` (min).
    ``moments``: computed from the mean in two passes, as numpy does (var, std).
    ``empty_ok``: a zero-size reduction has a result (max and min have no identity to return).
    Half-precision inputs accumulate in float32 and round once at the end; integer sums in int64.
    """

    name: str
    numpy: str
    combine: str
    identity: str
    moments: bool = False
    empty_ok: bool = True


REDUCTIONS: dict[str, Reduction] = {r.name: r for r in (
    Reduction("sum", "sum", "add", "zero"),
    Reduction("prod", "prod", "multiply", "one"),
    Reduction("max", "max", "maximum", "lowest", empty_ok=False),
    Reduction("min", "min", "minimum", "highest", empty_ok=False),
    Reduction("any", "any", "logical_or", "zero"),
    Reduction("all", "all", "logical_and", "one"),
    Reduction("mean", "mean", "add", "zero"),
    Reduction("var", "var", "add", "zero", moments=True),
    Reduction("std", "std", "add", "zero", moments=True),
)}


def _index_inputs(first: int) -> Callable:
    return lambda prim, pos: pos >= first


@dataclass(frozen=True)
class Kind:
    """A primitive kind: the kernel family a backend implements (``Backend.kernel(kind)``).

    ``validated(prim, pos)``: whether input ``pos`` is a value the kernel checks on the host when it
    holds a host copy (index arrays, an integer power's exponent). ``fuses``: may be absorbed into a
    fused elementwise kernel.
    """

    name: str
    validated: Callable = field(default=lambda prim, pos: False)
    fuses: bool = False


def _elementwise_validated(prim, pos: int) -> bool:
    row = ELEMENTWISE[prim.fn]
    return bool(row.validated) and any(prim.operands[k] == pos for k in row.validated
                                       if k < len(prim.operands) and prim.operands[k].__class__ is int)


#: Every primitive kind a backend may be asked for.
KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("constant"),
    Kind("elementwise", validated=_elementwise_validated, fuses=True),
    Kind("astype", fuses=True),
    Kind("fused"), Kind("rowfused"),
    Kind("reduce"), Kind("argreduce"), Kind("sort"), Kind("searchsorted"), Kind("scan"), Kind("softmax"), Kind("logsumexp"), Kind("norm"), Kind("attention"),
    Kind("matmul"), Kind("matmul_group"),
    Kind("reshape"), Kind("transpose"), Kind("broadcast_to"), Kind("strided"), Kind("concatenate"),
    Kind("getitem", validated=_index_inputs(1)), Kind("setitem", validated=_index_inputs(2)),
    Kind("take", validated=_index_inputs(1)),
    Kind("dynamic_slice"), Kind("dynamic_update_slice"),
    Kind("full"), Kind("arange"), Kind("linspace"), Kind("eye"),
    Kind("random"), Kind("random_split"),
    Kind("copy"), Kind("linalg"), Kind("slogdet"), Kind("custom"), Kind("collective"),
)}


def fuses(prim) -> bool:
    """Whether a primitive may join a fused elementwise kernel."""
    if prim.kind == "elementwise":
        return ELEMENTWISE[prim.fn].fuses
    return KINDS[prim.kind].fuses


def validated_on_host(prim, pos: int) -> bool:
    """Whether input ``pos`` of ``prim`` is checked on the host by its kernel when a host copy exists."""
    k = KINDS.get(prim.kind)
    return k is not None and k.validated(prim, pos)
