"""Chains of elementwise ops of one evaluation run as one fused command (graph/fusion.py).

Both backends fuse by default (``LANEFLOW_FUSE=0`` turns it off); these tests turn fusion on for the
backend under test whatever the environment says, to check the shared pass and each backend's fused
kernel. Fused
results must equal the unfused ops bit for bit (and numpy), and the command count (lf.stats) shows
whether a group formed.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import laneflow as lf
import test_fuzz as fuzz
from laneflow.defaults import backend_for
from laneflow.graph import fusion
from conftest import random_array


@pytest.fixture
def fused(device, monkeypatch):
    """``device`` with fusion on, whatever LANEFLOW_FUSE says."""
    monkeypatch.setattr(fusion, "_enabled", True)
    monkeypatch.setattr(type(backend_for(device)), "fuses_elementwise", True)
    return device


def _run(device, build, inputs, lanes=1):
    """(host results, commands) of ``build(*arrays)`` evaluated at once on a new stream."""
    st = lf.new_stream(device, lanes=lanes)
    with lf.stream(st):
        xs = [lf.array(x) for x in inputs]
        lf.eval(*xs)
        outs = build(*xs)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        lf.reset_stats()
        lf.eval(*outs)
        n = lf.stats()["commands"]
        res = [np.asarray(o) for o in outs]
    st.close()
    return res, n


def _unfused(device, build, inputs, monkeypatch):
    monkeypatch.setattr(fusion, "_enabled", False)
    try:
        return _run(device, build, inputs)
    finally:
        monkeypatch.setattr(fusion, "_enabled", True)


def test_a_chain_of_adds_is_one_command_per_max_fuse_ops(fused, rng, monkeypatch):
    x = random_array(rng, (33,), np.float32)

    def chain(a):
        for _ in range(40):
            a = a + 1.0
        return a
    (got,), n = _run(fused, chain, [x])
    assert n == 2  # 32 ops, then 8
    (want,), m = _unfused(fused, chain, [x], monkeypatch)
    assert m == 40
    np.testing.assert_array_equal(got, want)
    ref = x.copy()
    for _ in range(40):
        ref = ref + np.float32(1.0)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, "bfloat16", np.float16])
def test_mixed_float_steps_round_as_the_unfused_ops(fused, rng, dtype, monkeypatch):
    dtype = np.dtype(lf.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    x, y = random_array(rng, (257,), dtype), random_array(rng, (257,), dtype)

    def f(a, b):  # multiplies feeding adds (an FMA would change the bits), specials, a comparison
        t = a * b + a
        u = lf.tanh(t) * 0.5 - b * b
        v = lf.maximum(u, a) / (lf.abs(b) + 1.0)
        w = lf.where(v > 0.1, v, u)
        return lf.exp(w * 0.25) + lf.sqrt(lf.abs(t))
    (got,), n = _run(fused, f, [x, y])
    (want,), m = _unfused(fused, f, [x, y], monkeypatch)
    assert n < m
    np.testing.assert_array_equal(got, want)


def test_integer_and_comparison_steps(fused, rng, monkeypatch):
    x = random_array(rng, (100,), np.int32)
    y = random_array(rng, (100,), np.int32) | 1

    def f(a, b):
        q = (a * 7 + b) // b
        r = (q - 3) % b
        return [(r * 2 + 1) > 3, (a + 1) < 2**40, -(r + 2147483647)]  # a widening compare, a wrap
    got, n = _run(fused, f, [x, y])
    want, m = _unfused(fused, f, [x, y], monkeypatch)
    assert n < m
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    with np.errstate(over="ignore"):
        q = (x * 7 + y) // y
        r = (q - 3) % y
        np.testing.assert_array_equal(got[0], (r * 2 + 1) > 3)
        np.testing.assert_array_equal(got[2], -(r + np.int32(2147483647)))


def test_values_the_user_holds_or_shares_are_not_absorbed(fused, rng):
    x = random_array(rng, (16,), np.float32)
    st = lf.new_stream(fused, lanes=2)
    with lf.stream(st):
        a = lf.array(x)
        lf.eval(a)
        kept = a * 2.0           # held by the user: computed and kept
        shared = kept + 1.0      # used twice: kept as a value
        out1 = shared * 3.0
        out2 = shared - 4.0
        lf.reset_stats()
        lf.eval(out1, out2, kept)
        n = lf.stats()["commands"]
        np.testing.assert_array_equal(np.asarray(kept), x * np.float32(2))
        np.testing.assert_array_equal(np.asarray(out1), (x * np.float32(2) + np.float32(1)) * np.float32(3))
        np.testing.assert_array_equal(np.asarray(out2), (x * np.float32(2) + np.float32(1)) - np.float32(4))
    assert n == 4  # nothing fuses: every intermediate is held or shared
    st.close()


def test_broadcasting_and_power_stay_separate(fused, rng):
    col, row = random_array(rng, (4, 1), np.float64), random_array(rng, (1, 5), np.float64)

    def f(c, r):
        return (c * 2.0 + r) ** 2 + 1.0
    (got,), n = _run(fused, f, [col, row])
    np.testing.assert_allclose(got, (col * 2.0 + row) ** 2 + 1.0, rtol=1e-15)
    assert n == 4  # c*2 (4x1); + r broadcasts; the power stays alone; so + 1.0 has nothing to absorb


@pytest.mark.parametrize("lanes", [1, 4])
def test_many_independent_chains_fuse_each_and_match_numpy(fused, rng, lanes):
    xs = [random_array(rng, (64,), np.float32) for _ in range(6)]

    def f(*a):
        return [lf.sin(v) * 2.0 + lf.cos(v) for v in a]
    got, n = _run(fused, f, xs, lanes=lanes)
    assert n == 6
    for g, x in zip(got, xs):
        want = np.sin(x) * np.float32(2) + np.cos(x)
        np.testing.assert_allclose(g, want, rtol=2e-6, atol=2e-6)


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(prog=fuzz.program)
def test_fuzzed_programs_with_fusion_match_numpy_on_one_lane_and_many(fused, prog):
    fuzz.check_program(prog, fused)


_UNARY = ["negative", "abs", "exp", "tanh", "sin", "sqrt_abs", "square", "sigmoid"]
_BINARY = ["add", "subtract", "multiply", "maximum", "minimum", "divide_safe", "greater"]


_CASTS = ["astype_float32", "astype_bfloat16", "astype_float64"]


def _random_tree(r: np.random.Generator, depth: int, n_inputs: int, integer: bool):
    """A random expression: ("in", k), (unary, child), (binary, left, right) or (binary, child, scalar);
    unary ops include dtype conversions (astype, fused too)."""
    if depth == 0 or r.random() < 0.15:
        return ("in", int(r.integers(0, n_inputs)))
    if r.random() < 0.08:
        cast = "astype_int32" if integer else str(r.choice(_CASTS))
        return (cast, _random_tree(r, depth - 1, n_inputs, integer))
    if r.random() < 0.35 and not integer:
        return (str(r.choice(_UNARY)), _random_tree(r, depth - 1, n_inputs, integer))
    op = str(r.choice(_BINARY[:5] if integer else _BINARY))
    left = _random_tree(r, depth - 1, n_inputs, integer)
    if r.random() < 0.4:
        scalar = int(r.integers(-3, 4)) if integer or r.random() < 0.3 else float(r.uniform(-2, 2))
        return (op, left, scalar)
    return (op, left, _random_tree(r, depth - 1, n_inputs, integer))


def _evaluate(tree, xs):
    kind = tree[0]
    if kind == "in":
        return xs[tree[1]]
    if len(tree) == 2:
        a = _evaluate(tree[1], xs)
        if kind == "sqrt_abs":
            return lf.sqrt(lf.abs(a))
        if kind.startswith("astype_"):
            return a.astype(getattr(lf, kind[7:]))
        return getattr(lf, kind)(a)
    a = _evaluate(tree[1], xs)
    b = tree[2] if not isinstance(tree[2], tuple) else _evaluate(tree[2], xs)
    if kind == "divide_safe":
        return a / (lf.abs(b) + 1.0) if not isinstance(b, (int, float)) else a / (abs(b) + 1.0)
    if kind == "greater":
        return lf.where(lf.greater(a, b), a, b) if not isinstance(b, (int, float)) else lf.maximum(a, b)
    return getattr(lf, kind)(a, b)


@pytest.mark.parametrize("seed", range(16))
def test_random_expression_trees_fused_equal_unfused_bit_for_bit(fused, seed, monkeypatch):
    r = np.random.default_rng(seed)
    dtype = [np.float32, np.float64, np.dtype(lf.bfloat16), np.int32][seed % 4]
    integer = dtype == np.int32
    trees = [_random_tree(r, 6, 3, integer) for _ in range(3)]
    inputs = [random_array(r, (300,), dtype) for _ in range(3)]

    def build(*xs):
        return [_evaluate(t, xs) for t in trees]
    with np.errstate(all="ignore"):
        got, n = _run(fused, build, inputs, lanes=3)
        want, m = _unfused(fused, build, inputs, monkeypatch)
    assert n <= m
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_compiled_functions_fuse_like_eager(fused, rng):
    x, y = random_array(rng, (50,), np.float32), random_array(rng, (50,), np.float32)

    def f(a, b):
        t = a * b + 1.0
        return lf.tanh(t) * a - b, (t * t).sum()

    g = lf.compile(f)
    with lf.stream(fused):
        A, B = lf.array(x), lf.array(y)
        eager = f(A, B)
        lf.eval(*eager)
        for _ in range(3):  # trace and commands, then (GPU) capture and replay
            got = g(A, B)
            np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(eager[0]))
            np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(eager[1]))
    steps = g.stats()[0]["steps"]
    assert steps == 4  # t = a*b + 1 (fused; used twice, so kept), tanh(t)*a - b (fused), t*t, the sum


def test_a_fused_chain_holds_few_temporaries(fused):
    # each step writes into the temporary of the step it reads last: peak memory stays near two arrays
    import tracemalloc

    n = 60_000  # under the CPU backend's fusion size limit
    st = lf.new_stream(fused, lanes=1)
    with lf.stream(st):
        x = lf.array(np.ones(n))
        lf.eval(x)
        y = x
        for _ in range(32):
            y = y * 1.0001
        tracemalloc.start()
        try:
            lf.reset_stats()
            lf.eval(y)
            st.synchronize()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert lf.stats()["commands"] == 1
        np.testing.assert_allclose(np.asarray(y), np.full(n, 1.0001) ** 32, rtol=1e-12)
    st.close()
    if fused.type == "cpu":
        assert peak < 4 * n * 8, peak  # the output and a couple of temporaries, not 31


def test_an_error_inside_a_fused_group_names_its_ops(fused):
    with lf.stream(fused):
        x = lf.array(np.ones(4))
        lf.eval(x)
        y = lf.sqrt(x * 10**400) + 1.0  # the multiply's scalar does not fit float64
        with pytest.raises(Exception, match="multiply"):
            lf.eval(y)


def test_large_cpu_arrays_do_not_fuse(no_fusion, monkeypatch):
    monkeypatch.setattr(fusion, "_enabled", True)
    big = np.ones(1 << 17)
    (got,), n = _run(lf.cpu, lambda a: lf.tanh(a) * 2.0 + 1.0, [big])
    assert n == 3
    np.testing.assert_array_equal(got, np.tanh(big) * 2.0 + 1.0)


_MIXED = [np.float32, np.float16, np.dtype(lf.bfloat16), np.float64, np.int32, np.int8, np.uint8]


@pytest.mark.parametrize("seed", range(24))
def test_random_expressions_over_mixed_dtypes_and_a_broadcast_input(fused, seed, monkeypatch):
    # promotion inside fused steps (an int8 input meeting a bfloat16 one), and a (1,)-shaped input
    # whose consumers cannot fuse with their producers (shapes differ)
    r = np.random.default_rng(1000 + seed)
    dts = [np.dtype(_MIXED[int(k)]) for k in r.integers(0, len(_MIXED), 3)]
    integer = all(d.kind in "iu" for d in dts)
    shapes = [(257,), (257,), (1,) if seed % 3 == 0 else (257,)]
    inputs = [random_array(r, s, d) for s, d in zip(shapes, dts)]
    trees = [_random_tree(r, 5, 3, integer) for _ in range(3)]

    def build(*xs):
        return [_evaluate(t, xs) for t in trees]
    with np.errstate(all="ignore"):
        try:
            want, m = _unfused(fused, build, inputs, monkeypatch)
        except (TypeError, OverflowError, ValueError):
            pytest.skip("this random expression is refused by the ops themselves (e.g. uint8 - negative int)")
        got, n = _run(fused, build, inputs, lanes=2)
    assert n <= m
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def test_a_single_element_input_joins_the_group(fused, rng, monkeypatch):
    # a 0-d or (1, 1) array (a learning rate, a norm) broadcast inside a fused group
    x = random_array(rng, (4, 33), np.float32)
    lr, norm = np.float32(0.125), np.array([[1.5]], np.float32)

    def f(a, s, t):
        return lf.tanh(a * s) / t + a
    (got,), n = _run(fused, f, [x, np.array(lr), norm])
    (want,), m = _unfused(fused, f, [x, np.array(lr), norm], monkeypatch)
    assert n == 1 and m == 4
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, np.tanh(x * lr) / norm + x, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"])
def test_layer_norm_with_broadcast_statistics_and_parameters_fuses(fused, rng, dtype, monkeypatch):
    # (x - mean) / sqrt(var + eps) * g + b: mean and var are keepdims reductions (n, 1), g and b rows (d,)
    dtype = np.dtype(lf.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    x = random_array(rng, (8, 48), dtype)
    g, b = random_array(rng, (48,), dtype), random_array(rng, (48,), dtype)

    def ln(x, g, b):
        m = lf.mean(x, axis=-1, keepdims=True)
        v = lf.var(x, axis=-1, keepdims=True)
        lf.eval(m, v)  # (pending statistics would join a row program: tests/test_rowfusion.py)
        return (x - m) / lf.sqrt(v + 1e-5) * g + b
    (got,), n = _run(fused, ln, [x, g, b])
    (want,), m = _unfused(fused, ln, [x, g, b], monkeypatch)
    # (v + eps) and sqrt on the (8, 1) statistics; subtract, divide, multiply, add on (8, 48)
    assert (n, m) == (2, 6)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("seed", range(12))
def test_random_expressions_over_broadcast_inputs(fused, seed, monkeypatch):
    # inputs of shapes (7, 33), (7, 1) and (33,): fused groups read the last two through strides
    r = np.random.default_rng(2000 + seed)
    dtype = [np.float32, np.float64, np.dtype(lf.bfloat16), np.int32][seed % 4]
    inputs = [random_array(r, s, dtype) for s in ((7, 33), (7, 1), (33,))]
    trees = [_random_tree(r, 5, 3, dtype == np.int32) for _ in range(3)]

    def build(*xs):
        return [_evaluate(t, xs) for t in trees]
    with np.errstate(all="ignore"):
        want, m = _unfused(fused, build, inputs, monkeypatch)
        got, n = _run(fused, build, inputs, lanes=2)
    assert n <= m
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
