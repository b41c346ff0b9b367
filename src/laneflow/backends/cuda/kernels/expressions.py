"""The C expression of every elementwise op of the op table (``ops/table.py``), one row per op.

``EXPRESSIONS[name](a, k, T)`` gives the C expression of op ``name`` on the compute values ``a`` (a
list of C expressions, one per operand, already converted to the op's loop dtype), where ``k`` is
the loop dtype's kind (``b`` bool, ``i`` signed, ``u`` unsigned, ``f`` floating, bfloat16 included,
``c`` complex) and ``T`` its C compute type. Complex values (``lf_c64``, ``lf_c128``) have the
arithmetic operators and math functions of floats (``cdefs.COMPLEX_PREAMBLE``), so a row's ``f``
expression serves them unless the row gives a ``c`` one. The result has the compute type of the op's output loop dtype (bool for
predicates). Integer arithmetic wraps as numpy's does (``lf_wadd`` and friends, ``cdefs.PREAMBLE``).

The single-op kernels (``elementwise.py``) and the fused kernels (``fused.py``) both build from these
rows, so a fused group computes exactly what its ops compute one by one. An op of the table that the
CUDA backend does not implement is listed in :data:`UNSUPPORTED` (MLX's ``NO_GPU``); the completeness
test (``tests/test_op_table.py``) fails for an op in neither.
"""

from __future__ import annotations

from typing import Callable

_CMP = {"equal": "==", "not_equal": "!=", "less": "<", "less_equal": "<=", "greater": ">", "greater_equal": ">="}


def _by_kind(table: dict, default: Callable | None = None) -> Callable:
    """An expression that depends on the loop kind: ``table[k](x, y, T)``."""
    def f(a, k, T):
        g = table.get(k) or (table.get("f") if k == "c" else None) or default
        return g(*a, T) if len(a) > 1 else g(a[0], None, T)
    return f


def _compare(sym: str) -> Callable:
    return lambda a, k, T: f"({a[0]} {sym} {a[1]})"


def _fn(name: str) -> Callable:
    """A float function of the preamble, overloaded for float and double (``lf_exp``...)."""
    return lambda a, k, T: f"lf_{name}({', '.join(a)})"


EXPRESSIONS: dict[str, Callable] = {
    "add": _by_kind({"b": lambda x, y, T: f"({x} || {y})", "f": lambda x, y, T: f"({x} + {y})"},
                    lambda x, y, T: f"lf_wadd<{T}>({x}, {y})"),
    "subtract": _by_kind({"f": lambda x, y, T: f"({x} - {y})"}, lambda x, y, T: f"lf_wsub<{T}>({x}, {y})"),
    "multiply": _by_kind({"b": lambda x, y, T: f"({x} && {y})", "f": lambda x, y, T: f"({x} * {y})"},
                         lambda x, y, T: f"lf_wmul<{T}>({x}, {y})"),
    "divide": lambda a, k, T: f"({a[0]} / {a[1]})",
    "floor_divide": _by_kind({"f": lambda x, y, T: f"lf_floordiv_f<{T}>({x}, {y})",
                              "i": lambda x, y, T: f"lf_floordiv_i<{T}>({x}, {y})",
                              "u": lambda x, y, T: f"lf_floordiv_u<{T}>({x}, {y})",
                              "b": lambda x, y, T: f"({x} && {y})"}),
    "remainder": _by_kind({"f": lambda x, y, T: f"lf_mod_f<{T}>({x}, {y})",
                           "i": lambda x, y, T: f"lf_mod_i<{T}>({x}, {y})",
                           "u": lambda x, y, T: f"lf_mod_u<{T}>({x}, {y})",
                           "b": lambda x, y, T: "false"}),
    "power": _by_kind({"f": lambda x, y, T: f"lf_pow({x}, {y})"}, lambda x, y, T: f"lf_ipow<{T}>({x}, {y})"),
    "maximum": _by_kind({"f": lambda x, y, T: f"lf_max_nan<{T}>({x}, {y})", "b": lambda x, y, T: f"({x} || {y})"},
                        lambda x, y, T: f"({x} > {y} ? {x} : {y})"),
    "minimum": _by_kind({"f": lambda x, y, T: f"lf_min_nan<{T}>({x}, {y})", "b": lambda x, y, T: f"({x} && {y})"},
                        lambda x, y, T: f"({x} < {y} ? {x} : {y})"),
    "logaddexp": lambda a, k, T: f"lf_logaddexp<{T}>({a[0]}, {a[1]})",
    "hypot": _fn("hypot"),
    "nextafter": lambda a, k, T: f"lf_nextafter({a[0]}, {a[1]})",
    **{name: _compare(sym) for name, sym in _CMP.items()},
    "logical_and": lambda a, k, T: f"(({a[0]} != 0) && ({a[1]} != 0))",
    "logical_or": lambda a, k, T: f"(({a[0]} != 0) || ({a[1]} != 0))",
    "negative": _by_kind({"f": lambda x, y, T: f"(-{x})"}, lambda x, y, T: f"lf_wsub<{T}>(({T})0, {x})"),
    "abs": _by_kind({"f": lambda x, y, T: f"lf_abs({x})", "i": lambda x, y, T: f"({x} < 0 ? lf_wsub<{T}>(({T})0, {x}) : {x})"},
                    lambda x, y, T: x),
    "sign": _by_kind({"f": lambda x, y, T: f"lf_sign_f<{T}>({x})", "c": lambda x, y, T: f"lf_sign({x})", "i": lambda x, y, T: f"(({T})(({x} > 0) - ({x} < 0)))",
                      "u": lambda x, y, T: f"(({T})({x} > 0))"}, lambda x, y, T: x),
    **{name: _fn(name) for name in ("exp", "log", "log1p", "sqrt", "sin", "cos", "tanh", "erf")},
    "square": _by_kind({"f": lambda x, y, T: f"({x} * {x})", "b": lambda x, y, T: f"({x} && {x})"},
                       lambda x, y, T: f"lf_wmul<{T}>({x}, {x})"),
    "logical_not": lambda a, k, T: f"({a[0]} == 0)",
    "isnan": lambda a, k, T: f"({a[0]} != {a[0]})" if k == "f" else (f"lf_isnan({a[0]})" if k == "c" else "false"),
    "isfinite": lambda a, k, T: f"lf_isfinite({a[0]})" if k in "fc" else "true",
    "rsqrt": lambda a, k, T: f"(({T})1 / lf_sqrt({a[0]}))",
    "sigmoid": lambda a, k, T: f"(({T})1 / (({T})1 + lf_exp(-{a[0]})))",
    "gelu": lambda a, k, T: f"lf_gelu<{T}>({a[0]})",
    "gelu_tanh": lambda a, k, T: f"lf_gelu_tanh<{T}>({a[0]})",
    "silu": lambda a, k, T: f"lf_silu<{T}>({a[0]})",
    **{name: _fn(name) for name in ("acos", "acosh", "asin", "asinh", "atan", "atanh", "atan2", "cosh", "sinh",
                                    "tan", "expm1", "log2", "log10", "rint", "copysign")},
    # integers are whole already (numpy keeps their dtype)
    **{name: _by_kind({"f": lambda x, y, T, n=name: f"lf_{n}({x})"}, lambda x, y, T: x)
       for name in ("ceil", "floor", "trunc")},
    "positive": lambda a, k, T: a[0],
    "reciprocal": _by_kind({"f": lambda x, y, T: f"(({T})1 / {x})"},
                           lambda x, y, T: f"({x} == 0 ? ({T})0 : ({T})(({T})1 / {x}))"),
    "isinf": lambda a, k, T: f"lf_isinf({a[0]})" if k in "fc" else "false",
    "signbit": lambda a, k, T: f"lf_signbit({a[0]})" if k == "f" else (f"({a[0]} < 0)" if k == "i" else "false"),
    "logical_xor": lambda a, k, T: f"(({a[0]} != 0) != ({a[1]} != 0))",
    **{name: _by_kind({"b": lambda x, y, T, o=bsym: f"({x} {o} {y})"}, lambda x, y, T, o=sym: f"(({T})({x} {o} {y}))")
       for name, sym, bsym in (("bitwise_and", "&", "&&"), ("bitwise_or", "|", "||"), ("bitwise_xor", "^", "!="))},
    "bitwise_invert": _by_kind({"b": lambda x, y, T: f"(!{x})"}, lambda x, y, T: f"(({T})~{x})"),
    "bitwise_left_shift": lambda a, k, T: f"lf_shl<{T}>({a[0]}, {a[1]})",
    "bitwise_right_shift": lambda a, k, T: f"lf_shr<{T}>({a[0]}, {a[1]})",
    "where": lambda a, k, T: f"(({a[0]} != 0) ? {a[1]} : {a[2]})",
    # complex parts (a real operand is its own real part and conjugate)
    "real": lambda a, k, T: f"lf_cre({a[0]})" if k == "c" else a[0],
    "imag": lambda a, k, T: f"lf_cim({a[0]})" if k == "c" else f"(({T})0)",
    "conj": lambda a, k, T: f"lf_conj({a[0]})" if k == "c" else a[0],
    "identity": lambda a, k, T: a[0],
}

#: Ops whose float16/bfloat16 loops need more than their float expression: the compute type is float, so
#: a step to the next representable value must be taken on the 16-bit word (``HALF[name](a, dtype name)``).
HALF: dict[str, Callable] = {
    "nextafter": lambda a, d: f"lf_nextafter16<{int(d == 'bfloat16')}>({a[0]}, {a[1]})",
}

#: Ops of the op table this backend has no expression for (none today).
UNSUPPORTED: frozenset[str] = frozenset()

#: Comparison ops: a Python int outside the array's range widens the loop (numpy compares by value).
COMPARISONS = frozenset(_CMP)
