"""Independent same-shape matmuls of one evaluation run as one grouped command (graph/grouping.py).

The GPU backend groups float matmuls by itself; the CPU backend does not (its lanes already run
matmuls in parallel), so on the CPU these tests turn grouping on to check the shared pass and the
CPU's reference kernel. Results are checked against numpy on random inputs, and the command count
(lf.stats) shows whether a group formed.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import laneflow as lf
from laneflow.runtime.backend import backend_for
from laneflow.backends.cpu import CPUBackend
from laneflow.graph import grouping, views
from conftest import random_array


@pytest.fixture(autouse=True)
def _count_matmuls_only(no_fusion):
    """Command counts here are about matmul groups: elementwise fusion off."""


FLOATS = (lf.float16, lf.bfloat16, lf.float32, lf.float64)


@pytest.fixture
def grouped(device, monkeypatch):
    """``device`` with matmul grouping on (the CPU backend opts in for the test)."""
    if device.type == "cpu":
        monkeypatch.setattr(CPUBackend, "groups_matmul", lambda self, dtype: dtype in FLOATS)
        monkeypatch.setattr(CPUBackend, "limits", dataclasses.replace(CPUBackend.limits, max_matmul_group=128))
    return device


def _close(got, want, k):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-5 * k)


def _commands(fn):
    lf.reset_stats()
    out = fn()
    return out, lf.stats()["commands"]


@pytest.mark.parametrize("lanes", [1, 4])
def test_independent_matmuls_become_one_command_and_match_numpy(grouped, rng, lanes):
    E, M, K, N = 6, 5, 7, 3
    xs = [random_array(rng, (M, K), np.float32) for _ in range(E)]
    ws = [random_array(rng, (K, N), np.float32) for _ in range(E)]
    st = lf.new_stream(grouped, lanes=lanes)
    X = [lf.array(x, stream=st) for x in xs]
    W = [lf.array(w, stream=st) for w in ws]
    lf.eval(*X, *W)
    with lf.stream(st):  # `@` runs on the current stream
        ys, n = _commands(lambda: lf.eval(*(ys := [X[i] @ W[i] for i in range(E)])) or ys)
    assert n == 1
    for y, x, w in zip(ys, xs, ws):
        _close(y, x.astype(np.float64) @ w, K)
    st.close()


def test_one_lane_and_four_lanes_give_the_same_bits(grouped, rng):
    xs = [random_array(rng, (3, 4, 9), np.float32) for _ in range(5)]
    ws = [random_array(rng, (3, 9, 6), np.float32) for _ in range(5)]
    outs = []
    for lanes in (1, 4):
        st = lf.new_stream(grouped, lanes=lanes)
        with lf.stream(st):
            ys = [lf.array(x) @ lf.array(w) for x, w in zip(xs, ws)]
            outs.append([np.asarray(y) for y in ys])
        st.close()
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)
        assert a.shape == (3, 4, 6)


def test_a_shared_operand_groups_too(grouped, rng):
    # attention's projections: one x, three weights
    x = random_array(rng, (8, 16), np.float32)
    ws = [random_array(rng, (16, 16), np.float32) for _ in range(3)]
    with lf.stream(grouped):
        X = lf.array(x)
        W = [lf.array(w) for w in ws]
        lf.eval(X, *W)
        (q, k, v), n = _commands(lambda: lf.eval(*(r := [X @ w for w in W])) or r)
    assert n == 1
    for got, w in zip((q, k, v), ws):
        _close(got, x.astype(np.float64) @ w, 16)


def test_users_of_a_member_scheduled_before_the_others_still_see_its_result(grouped, rng):
    # depth-first order puts relu(m1) before m2; the grouped schedule must move it after the group
    a, b, c, d = (random_array(rng, (4, 4), np.float32) for _ in range(4))
    with lf.stream(grouped):
        A, B, C, D = (lf.array(v) for v in (a, b, c, d))
        lf.eval(A, B, C, D)
        m1 = A @ B
        r = lf.maximum(m1, 0.0) * 2.0
        m2 = C @ D
        total, n = _commands(lambda: lf.eval(out := r + m2) or out)
    assert n == 4  # the group, maximum, * 2, the add
    want = np.maximum(a.astype(np.float64) @ b, 0) * 2 + c.astype(np.float64) @ d
    _close(total, want, 8)


def test_dependent_matmuls_do_not_group(grouped, rng):
    a, b, c = (random_array(rng, (5, 5), np.float32) for _ in range(3))
    with lf.stream(grouped):
        A, B, C = (lf.array(v) for v in (a, b, c))
        lf.eval(A, B, C)
        y, n = _commands(lambda: lf.eval(out := (A @ B) @ C) or out)
    assert n == 2
    _close(y, (a.astype(np.float64) @ b) @ c, 25)


def test_only_equal_shapes_and_dtypes_group(grouped, rng):
    a = [random_array(rng, (3, 4), np.float32) for _ in range(4)]
    w1, w2 = random_array(rng, (4, 5), np.float32), random_array(rng, (4, 6), np.float32)
    w3 = random_array(rng, (4, 5), np.float64)
    with lf.stream(grouped):
        A = [lf.array(v) for v in a]
        W1, W2, W3 = lf.array(w1), lf.array(w2), lf.array(w3)
        lf.eval(*A, W1, W2, W3)
        outs, n = _commands(lambda: lf.eval(*(r := [A[0] @ W1, A[1] @ W1,  # a group of two
                                                    A[2] @ W2,              # another N: alone
                                                    A[3] @ W3])) or r)      # mixed dtypes: alone
    assert n == 3  # the group, the other N, the mixed-dtype matmul
    for got, x, w in zip(outs, a, (w1, w1, w2, w3)):
        _close(got, x.astype(np.float64) @ w, 4)


def test_broadcast_batches_do_not_group(grouped, rng):
    a = [random_array(rng, (2, 3, 4), np.float32) for _ in range(3)]
    b = [random_array(rng, (4, 5), np.float32) for _ in range(3)]
    with lf.stream(grouped):
        A, B = [lf.array(v) for v in a], [lf.array(v) for v in b]
        lf.eval(*A, *B)
        ys, n = _commands(lambda: lf.eval(*(r := [x @ w for x, w in zip(A, B)])) or r)
    assert n == 3
    for y, x, w in zip(ys, a, b):
        _close(y, x.astype(np.float64) @ w, 4)


def test_more_matmuls_than_one_group_holds_split_into_groups(grouped, rng, monkeypatch):
    cls = type(backend_for(grouped))
    monkeypatch.setattr(cls, "limits", dataclasses.replace(cls.limits, max_matmul_group=4))
    xs = [random_array(rng, (2, 3), np.float32) for _ in range(9)]
    ws = [random_array(rng, (3, 2), np.float32) for _ in range(9)]
    with lf.stream(grouped):
        X, W = [lf.array(v) for v in xs], [lf.array(v) for v in ws]
        lf.eval(*X, *W)
        ys, n = _commands(lambda: lf.eval(*(r := [x @ w for x, w in zip(X, W)])) or r)
    assert n == 3  # 4 + 4 + 1
    for y, x, w in zip(ys, xs, ws):
        _close(y, x.astype(np.float64) @ w, 3)


def test_grouping_can_be_turned_off(grouped, rng, monkeypatch):
    monkeypatch.setattr(grouping, "_enabled", False)
    xs = [random_array(rng, (2, 3), np.float32) for _ in range(3)]
    with lf.stream(grouped):
        X = [lf.array(v) for v in xs]
        lf.eval(*X)
        ys, n = _commands(lambda: lf.eval(*(r := [x @ x.T for x in X])) or r)
    # three matmuls, each reading x.T in place where the backend's matmul takes strided views
    # (graph/views.py); otherwise three transposes too
    assert n == (3 if views.enabled() and "matmul" in backend_for(grouped).strided_kinds else 6)
    for y, x in zip(ys, xs):
        _close(y, x.astype(np.float64) @ x.T, 3)


@pytest.mark.parametrize("dtype", [np.float64, "bfloat16", np.float16])
def test_grouped_matmuls_of_other_float_dtypes(grouped, rng, dtype):
    dtype = np.dtype(lf.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    xs = [random_array(rng, (4, 8), dtype) for _ in range(3)]
    ws = [random_array(rng, (8, 4), dtype) for _ in range(3)]
    with lf.stream(grouped):
        X, W = [lf.array(v) for v in xs], [lf.array(v) for v in ws]
        lf.eval(*X, *W)
        ys, n = _commands(lambda: lf.eval(*(r := [x @ w for x, w in zip(X, W)])) or r)
    assert n == 1
    tol = 1e-12 if dtype == np.float64 else 2e-2
    for y, x, w in zip(ys, xs, ws):
        assert np.asarray(y).dtype == dtype
        want = x.astype(np.float64) @ w.astype(np.float64)
        np.testing.assert_allclose(np.asarray(y).astype(np.float64), want, rtol=tol, atol=tol * 8 * 4)


def test_compiled_functions_group_and_match_eager(grouped, rng):
    E = 5
    xs = [random_array(rng, (6, 8), np.float32) for _ in range(E)]
    ws = [random_array(rng, (8, 3), np.float32) for _ in range(E)]

    @lf.compile
    def experts(x, w):
        return [lf.maximum(x[i] @ w[i], 0.0) for i in range(E)]

    with lf.stream(grouped):
        X, W = [lf.array(v) for v in xs], [lf.array(v) for v in ws]
        eager = experts.__wrapped__(X, W)
        lf.eval(*eager)  # together, as the compiled plan runs them: one group (np.asarray one by one would not group)
        eager = [np.asarray(y) for y in eager]
        for call in range(3):  # trace and commands, then (GPU) capture and replay the CUDA graph
            got = experts(X, W)
            for i, y in enumerate(got):
                want = np.maximum(xs[i].astype(np.float64) @ ws[i], 0)
                _close(y, want, 8)
                if call == 0:  # the same commands as eager: the same bits
                    np.testing.assert_array_equal(np.asarray(y), eager[i])
                else:  # inside a CUDA graph capture cuBLAS may pick another GEMM kernel (measured on
                    # the H200: a 1-ulp difference in float32), so the graph matches eager to rounding
                    np.testing.assert_allclose(np.asarray(y), eager[i], rtol=2e-6, atol=1e-6)
    steps = experts.stats()[0]["steps"]
    assert steps == 1 + E  # one group, E maximums


def test_matmuls_on_different_streams_group_and_one_stream_gives_the_same_bits(grouped, rng):
    # the fuzzer's invariant: the grouping decision must not depend on streams or lanes
    xs = [random_array(rng, (4, 6), np.float32) for _ in range(4)]
    ws = [random_array(rng, (6, 5), np.float32) for _ in range(4)]
    results = []
    for n_streams in (1, 2):
        streams = [lf.new_stream(grouped, lanes=2) for _ in range(n_streams)]
        X = [lf.array(x, stream=streams[i % n_streams]) for i, x in enumerate(xs)]
        W = [lf.array(w, stream=streams[i % n_streams]) for i, w in enumerate(ws)]
        lf.eval(*X, *W)
        ys, n = _commands(lambda: lf.eval(*(r := [lf.matmul(x, w, stream=streams[i % n_streams])
                                                  for i, (x, w) in enumerate(zip(X, W))])) or r)
        assert n == 1
        results.append([np.asarray(y) for y in ys])
        for s in streams:
            s.close()
    for a, b, x, w in zip(*results, xs, ws):
        np.testing.assert_array_equal(a, b)
        _close(a, x.astype(np.float64) @ w, 6)


def _random_matmul_program(seed: int, n_inputs: int = 6, n_steps: int = 24) -> list:
    """Steps over a pool of square matrices, rich in matmuls at the same level (the fuzzer's
    programs rarely have two): ("matmul", i, j), ("add", i, j), ("tanh", i), stream choice k."""
    r = np.random.default_rng(seed)
    steps, size = [], n_inputs
    for _ in range(n_steps):
        kind = r.choice(["matmul", "matmul", "matmul", "add", "tanh"])
        i, j = int(r.integers(0, size)), int(r.integers(0, size))
        steps.append((kind, i, j, int(r.integers(0, 3))))
        size += 1
    return steps


def _run_program(steps, inputs, streams, delays):
    vals = [lf.array(x, stream=streams[0]) for x in inputs]
    lf.eval(*vals)
    ref = [x.astype(np.float64) for x in inputs]

    def build():
        for kind, i, j, k in steps:
            st = streams[k % len(streams)]
            if kind == "matmul":
                vals.append(lf.matmul(vals[i], vals[j], stream=st))
                ref.append(ref[i] @ ref[j] / 4.0)
                vals[-1] = lf.multiply(vals[-1], 0.25, stream=st)
            elif kind == "add":
                vals.append(lf.add(vals[i], vals[j], stream=st))
                ref.append(ref[i] + ref[j])
            else:
                vals.append(lf.tanh(vals[i], stream=st))
                ref.append(np.tanh(ref[i]))
        lf.eval(*vals)

    if delays:
        with lf.testing.inject_delays(0.0005, seed=len(steps)):
            build()
    else:
        build()
    return [np.asarray(v) for v in vals], ref


@pytest.mark.parametrize("seed", range(12))
def test_random_matmul_programs_on_one_lane_and_many_give_the_same_bits(grouped, seed):
    dtype = np.float32 if seed % 2 else np.float64
    steps = _random_matmul_program(seed)
    inputs = [np.random.default_rng(seed + 100 + k).uniform(-1, 1, (8, 8)).astype(dtype) for k in range(6)]
    one_stream = [lf.new_stream(grouped, lanes=1)]
    one, ref = _run_program(steps, inputs, one_stream, delays=False)
    many_streams = [lf.new_stream(grouped, lanes=3), lf.new_stream(grouped, lanes=2)]
    many, _ = _run_program(steps, inputs, many_streams, delays=True)
    for s in one_stream + many_streams:
        s.close()
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for k, (a, b, r) in enumerate(zip(one, many, ref)):
        np.testing.assert_array_equal(a, b, err_msg=f"value {k}: many lanes differ from one lane")
        np.testing.assert_allclose(a, r, rtol=tol, atol=tol, err_msg=f"value {k}: differs from numpy")


def test_empty_batches_do_not_group(grouped):
    with lf.stream(grouped):
        xs = [lf.array(np.ones((0, 4, 4), np.float32)) for _ in range(4)]
        lf.eval(*xs)
        ys, n = _commands(lambda: lf.eval(*(r := [x @ x for x in xs])) or r)
    assert n == 4
    assert all(np.asarray(y).shape == (0, 4, 4) for y in ys)
