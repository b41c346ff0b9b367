"""The op table (``laneflow/ops/table.py``) is complete: every op it declares is public, has a kernel on
every backend (or is listed as unsupported there, with a reason), and has its tests; every primitive
kind that ops build is declared. A new op that misses one of these places fails here, by name."""

from __future__ import annotations

import importlib
import pkgutil

import numpy as np
import pytest

import laneflow as lf
from laneflow.backends.cpu import kernels as cpu_kernels
from laneflow.graph.node import Primitive
from laneflow.ops.table import ELEMENTWISE, KINDS, REDUCTIONS


def _cuda_kernels():
    try:
        from laneflow.backends.cuda import dispatch as kernels
        from laneflow.backends.cuda.kernels import expressions
    except ImportError as e:  # cuda-bindings is not installed: nothing to check for this backend
        pytest.skip(f"the CUDA backend does not import here ({e})")
    return kernels, expressions


def test_every_public_elementwise_row_is_a_laneflow_function_with_a_docstring():
    for row in ELEMENTWISE.values():
        if row.public:
            fn = getattr(lf, row.name)
            assert callable(fn) and fn.__name__ == row.name
            assert fn.__doc__, f"lf.{row.name} has no docstring"
    for name in ("power", "where"):  # rows with a hand-written constructor
        assert callable(getattr(lf, name))


def test_every_elementwise_row_has_a_numpy_reference_and_a_dtype_rule():
    for row in ELEMENTWISE.values():
        assert row.numpy or row.reference, f"{row.name}: neither a numpy ufunc nor a reference"
        if row.numpy:
            assert isinstance(getattr(np, row.numpy), np.ufunc), row.name
            assert getattr(np, row.numpy).nin == row.arity, f"{row.name}: arity {row.arity}"
        if row.public:
            assert row.ufunc is not None, f"{row.name}: no ufunc to infer its dtypes from (numpy= or like=)"


def test_the_cpu_backend_computes_every_elementwise_row():
    for row in ELEMENTWISE.values():
        assert row.name in cpu_kernels.UFUNCS or row.name in cpu_kernels.SPECIAL, row.name


def test_the_cuda_backend_has_an_expression_for_every_elementwise_row_or_lists_it_unsupported():
    _, expressions = _cuda_kernels()
    for row in ELEMENTWISE.values():
        assert (row.name in expressions.EXPRESSIONS) != (row.name in expressions.UNSUPPORTED), row.name
    assert set(expressions.EXPRESSIONS) <= set(ELEMENTWISE), "an expression for an op the table lacks"


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_every_backend_has_a_kernel_for_every_primitive_kind_or_lists_it_unsupported(backend):
    mod = cpu_kernels if backend == "cpu" else _cuda_kernels()[0]
    for kind in KINDS:
        have, unsupported = kind in mod.KERNELS, kind in mod.UNSUPPORTED
        assert have != unsupported, f"{backend}: kind {kind!r} is {'both' if have else 'neither'} " \
                                    "registered and unsupported"
        if unsupported:
            assert mod.UNSUPPORTED[kind], f"{backend}: {kind!r} is unsupported without a reason"
    assert set(mod.KERNELS) <= set(KINDS), f"{backend}: kernels for kinds the table lacks"


def _primitive_classes():
    import laneflow

    for info in pkgutil.walk_packages(laneflow.__path__, "laneflow."):
        if ".backends.cuda" in info.name or ".bench" in info.name:
            continue  # (the CUDA backend needs cuda-bindings; neither defines primitives)
        importlib.import_module(info.name)
    seen, todo = set(), [Primitive]
    while todo:
        c = todo.pop()
        for s in c.__subclasses__():
            if s not in seen:
                seen.add(s)
                todo.append(s)
    return seen


def test_every_primitive_kind_that_ops_build_is_in_the_table():
    kinds = {c.kind for c in _primitive_classes()}
    kinds.discard("placeholder")  # an argument being traced by lf.compile: never run
    assert kinds <= set(KINDS), f"kinds missing from ops/table.py KINDS: {sorted(kinds - set(KINDS))}"


def test_every_reduction_row_is_public_and_combines_with_an_elementwise_row():
    for row in REDUCTIONS.values():
        assert callable(getattr(lf, row.name)), row.name
        assert row.combine in ELEMENTWISE, f"{row.name}: combine {row.combine!r} is not an elementwise op"
        assert row.identity in ("zero", "one", "lowest", "highest"), row.name
        assert callable(getattr(np, row.numpy)), row.name


def test_every_unary_math_row_has_test_data_in_the_op_tests():
    import test_ops_elementwise as t

    for row in ELEMENTWISE.values():
        if row.public and row.arity == 1 and not row.predicate:
            assert row.name in t.UNARY, f"add {row.name} to UNARY in tests/test_ops_elementwise.py"
        if row.public and row.arity == 2:
            assert row.name in t.BINARY or row.name in t.COMPARE or row.name in t.LOGICAL, row.name
