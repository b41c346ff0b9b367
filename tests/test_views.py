"""Layout ops folded into their readers (graph/views.py): the same values as numpy, fewer commands,
and no write in place through a view."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf
from laneflow.graph import eval_cache, views
from laneflow.runtime.backend import backend_for
from laneflow.shapes import basic_index_view, contiguous_strides, is_contiguous
from conftest import random_array


@pytest.fixture(autouse=True)
def _on_the_device(request):
    """Ops of a test run on its device's stream (not the default device's, which may be another)."""
    if "device" not in request.fixturenames:
        yield
        return
    with lf.stream(lf.new_stream(request.getfixturevalue("device"))):
        yield


def _commands(fn):
    lf.reset_stats()
    out = fn()
    return out, lf.stats()["commands"]


def _evaluated(r):
    lf.eval(*(r if isinstance(r, list) else [r]))
    return r


def _np_view(base: np.ndarray, shape, strides, offset):
    it = base.itemsize
    return np.lib.stride_tricks.as_strided(base.reshape(-1)[offset:], shape, tuple(s * it for s in strides))


# -- the view algebra, against numpy's own views ---------------------------------------------------

def _random_strided(rng):
    """A numpy view (transposed and sliced) of a fresh base, and its (strides, offset) in elements."""
    nd = int(rng.integers(1, 5))
    shape = tuple(int(s) for s in rng.integers(1, 5, nd))
    base = np.arange(int(np.prod(shape)) * 4, dtype=np.int64)
    x = base[: int(np.prod(shape))].reshape(shape)
    if rng.random() < 0.5:
        x = x.transpose(tuple(rng.permutation(nd)))
    if rng.random() < 0.5:
        k = int(rng.integers(0, nd))
        x = x[(slice(None),) * k + (slice(0, max(1, x.shape[k] - 1)),)]
    strides = tuple(s // base.itemsize for s in x.strides)
    offset = (x.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // base.itemsize
    return base, x, strides, offset


def test_reshape_view_is_numpys_no_copy_reshape(rng):
    tried = folded = 0
    for _ in range(400):
        base, x, strides, offset = _random_strided(rng)
        n = x.size
        # a random factorisation of n, with 1s sprinkled in
        new = []
        rest = n
        while rest > 1:
            f = next(d for d in range(2, rest + 1) if rest % d == 0) if rng.random() < 0.6 else rest
            new.append(f)
            rest //= f
            if rng.random() < 0.2:
                new.append(1)
        new = tuple(new) or (1,)
        tried += 1
        got = views.reshape_view(x.shape, strides, new)
        try:  # numpy reshapes without a copy exactly when copy=False is accepted
            x.reshape(new, copy=False)
            possible = True
        except ValueError:
            possible = False
        if got is None:
            assert not possible or 0 in x.shape, (x.shape, strides, new)
            continue
        folded += 1
        np.testing.assert_array_equal(_np_view(base, new, got, offset), x.reshape(new))
    assert folded > tried // 4


def test_basic_index_view_matches_numpy(rng):
    for _ in range(300):
        base, x, strides, offset = _random_strided(rng)
        entries = []
        for s in x.shape:
            r = rng.random()
            if r < 0.3:
                entries.append(int(rng.integers(-s, s)))
            elif r < 0.8:
                a, b = sorted(int(v) for v in rng.integers(-s - 1, s + 2, 2))
                entries.append(slice(a, b, int(rng.choice([1, 2, -1, 3]))))
            else:
                entries.append(slice(None))
            if rng.random() < 0.15:
                entries.append(None)
        shape, st, off = basic_index_view(x.shape, strides, offset, tuple(entries))
        want = x[tuple(entries)]
        assert shape == want.shape
        if want.size:
            np.testing.assert_array_equal(_np_view(base, shape, st, off), want)


def test_contiguity_ignores_size_one_dims():
    assert is_contiguous((2, 1, 3), (3, 99, 1))
    assert not is_contiguous((2, 3), (1, 2))
    assert is_contiguous((4, 5), contiguous_strides((4, 5)))


# -- folded into readers ---------------------------------------------------------------------------

def test_transposes_and_slices_feed_a_matmul_without_copies(device, rng):
    x = random_array(rng, (16, 3 * 24), np.float32)
    w = random_array(rng, (8, 24), np.float32)
    X, W = lf.array(x, device=device), lf.array(w, device=device)
    lf.eval(X, W)

    def prog():  # (b, t, heads, d) -> (b, heads, t, d) of a slice, times the transpose of another slice
        q = X[:, :24].reshape(1, 16, 4, 6).transpose(0, 2, 1, 3)
        k = X[:, 24:48].reshape(1, 16, 4, 6).transpose(0, 2, 1, 3)
        return [q @ k.swapaxes(-1, -2), X[:, :24] @ W.T]  # (q and k die here: nothing holds them)

    y, n = _commands(lambda: _evaluated(prog()))
    ref_q = x[:, :24].reshape(1, 16, 4, 6).transpose(0, 2, 1, 3)
    ref_k = x[:, 24:48].reshape(1, 16, 4, 6).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(np.asarray(y[0]), ref_q @ ref_k.swapaxes(-1, -2), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(y[1]), x[:, :24] @ w.T, rtol=2e-5, atol=2e-5)
    if "matmul" in backend_for(device).strided_kinds:
        assert n == 2  # the two matmuls, nothing else
    else:  # (the CPU: numpy's BLAS reads contiguous copies, see CPUBackend.strided_kinds)
        assert n == 6  # one copy per strided operand, and the matmuls


def test_a_chain_of_layout_ops_is_one_copy_where_its_reader_needs_memory(device, rng):
    x = random_array(rng, (2, 3, 4, 5), np.float32)
    X = lf.array(x, device=device)
    lf.eval(X)
    y, n = _commands(lambda: _evaluated(X.transpose(0, 2, 1, 3)[:, 1:3].reshape(2, 2, 15)))
    np.testing.assert_array_equal(np.asarray(y), x.transpose(0, 2, 1, 3)[:, 1:3].reshape(2, 2, 15))
    assert n == 1


def test_contiguous_views_feed_elementwise_and_reductions(device, rng):
    x = random_array(rng, (6, 8), np.float32)
    b = random_array(rng, (10, 8), np.float32)
    X, B = lf.array(x, device=device), lf.array(b, device=device)
    lf.eval(X, B)
    y, n = _commands(lambda: _evaluated([(X.reshape(48).reshape(6, 8) + B[:6]) * 2.0,
                                         lf.sum(X.reshape(3, 16), axis=1)]))
    np.testing.assert_allclose(np.asarray(y[0]), (x + b[:6]) * 2.0, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(y[1]), x.reshape(3, 16).sum(axis=1), rtol=1e-5)
    assert n == 2


def test_a_view_that_is_its_base_is_read_as_the_base(device, rng):
    """A reshape and back (bench dispatch's mixed chain) composes to the base's own layout: the reader
    takes the base with no view (so the C submit path takes it), may write it in place, and a reshape
    a user holds keeps its value."""
    x = random_array(rng, (6, 8), np.float32)
    w = random_array(rng, (8, 8), np.float32)
    X, W = lf.array(x, device=device), lf.array(w, device=device)
    lf.eval(X, W)
    for held in (False, True):
        m = X @ W
        flat = m.reshape(-1)
        y = flat.reshape(6, 8) + 1.0
        if not held:
            del flat
        got, n = _commands(lambda: _evaluated([y]))
        want = x @ w + 1.0
        np.testing.assert_allclose(np.asarray(got[0]), want, rtol=1e-5, atol=1e-5)
        if held:
            np.testing.assert_allclose(np.asarray(flat), (x @ w).reshape(-1), rtol=1e-5, atol=1e-5)
        else:
            assert n == 2  # (the matmul and the add, no copy)
    m = X @ W
    y = m.reshape(-1).reshape(6, 8) * 2.0
    d = y._data
    order = views.fold(_order(d))
    assert order is not None and d.inputs[0] is m._data and getattr(d.prim, "in_views", None) is None
    np.testing.assert_allclose(np.asarray(y), (x @ w) * 2.0, rtol=1e-5, atol=1e-5)


def _order(d):
    from laneflow.graph.schedule import toposort

    return toposort([d])


def test_an_input_read_through_a_view_is_never_written_in_place(device, rng):
    x = random_array(rng, (5, 5), np.float32)
    X = lf.array(x, device=device)
    for _ in range(3):
        a = X * 2.0          # pending, one user: the transpose
        y = a.T + 1.0        # must not overwrite a while reading it transposed
        np.testing.assert_array_equal(np.asarray(y), (x * 2.0).T + 1.0)


def test_a_view_of_a_value_a_user_holds_keeps_that_value(device, rng):
    x = random_array(rng, (4, 6), np.float32)
    X = lf.array(x, device=device)
    t = X * 3.0
    v = t.T                  # held by the user: computed, and also folded into the matmul
    m = v @ t
    lf.eval(m, v)
    np.testing.assert_allclose(np.asarray(m), (x * 3.0).T @ (x * 3.0), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(v), (x * 3.0).T)
    np.testing.assert_array_equal(np.asarray(t), x * 3.0)


def test_views_off_gives_the_same_values_with_more_commands(device, rng, monkeypatch):
    x = random_array(rng, (8, 12), np.float32)
    X = lf.array(x, device=device)
    lf.eval(X)

    def prog():
        r = (X.reshape(4, 24)[:, ::2].T @ X.T[:4, 1:4]) + 1.0
        lf.eval(r)
        return r

    on, n_on = _commands(prog)
    monkeypatch.setattr(views, "_enabled", False)
    off, n_off = _commands(prog)
    want = (x.reshape(4, 24)[:, ::2].T @ x.T[:4, 1:4]) + 1.0
    np.testing.assert_allclose(np.asarray(on), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(off), want, rtol=1e-5, atol=1e-5)
    assert n_on < n_off


def test_folded_plans_hit_the_plan_cache_with_new_values(device, rng):
    w = random_array(rng, (12, 5), np.float32)
    W = lf.array(w, device=device)
    lf.eval(W)
    before = eval_cache.info()["hits"]
    for _ in range(5):
        x = random_array(rng, (3, 4, 12), np.float32)
        X = lf.array(x, device=device)
        y = (X.transpose(1, 0, 2).reshape(4, 36)[:, :12] @ W).T + 0.5
        np.testing.assert_allclose(np.asarray(y), (x.transpose(1, 0, 2).reshape(4, 36)[:, :12] @ w).T + 0.5,
                                   rtol=1e-5, atol=1e-5)
    if eval_cache.info()["enabled"]:
        assert eval_cache.info()["hits"] - before >= 3


def test_compiled_functions_fold_views_too(device, rng):
    f = lf.compile(lambda a, b: (a.T @ b.reshape(6, 4)) * 2.0)
    for _ in range(3):
        a, b = random_array(rng, (6, 5), np.float32), random_array(rng, (24,), np.float32)
        got = f(lf.array(a, device=device), lf.array(b, device=device))
        np.testing.assert_allclose(np.asarray(got), (a.T @ b.reshape(6, 4)) * 2.0, rtol=1e-5, atol=1e-5)
    assert f.stats()[0]["steps"] <= (2 if "matmul" in backend_for(device).strided_kinds else 3)


@pytest.mark.parametrize("dtype", ["bfloat16", np.float16, np.int32])
def test_other_dtypes_through_transposed_matmul_operands(device, rng, dtype):
    dtype = np.dtype(lf.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    a = random_array(rng, (2, 7, 9), dtype)
    b = random_array(rng, (2, 5, 9), dtype)
    A, B = lf.array(a, device=device), lf.array(b, device=device)
    got = np.asarray(A @ B.swapaxes(-1, -2)).astype(np.float64)
    want = a.astype(np.float64) @ b.astype(np.float64).swapaxes(-1, -2)
    tol = 0 if dtype.kind == "i" else 5e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 10)


def test_reductions_of_a_folded_transpose_have_the_bits_of_a_contiguous_copy(device, rng):
    """numpy's summation order follows memory layout, so the CPU kernels reduce a C-contiguous copy of a
    strided view: a value's bits do not depend on whether a transpose was folded, nor on the layout a
    compiled plan gives it (the CPU fuzz found 1-ulp differences between commands and plan replays)."""
    x = random_array(rng, (40, 6), np.float64)
    X = lf.array(x, device=device)
    xt = np.ascontiguousarray(x.T)

    def prog(a):
        return [lf.sum(a, axis=-1, keepdims=True), lf.mean(a, axis=-1, keepdims=True), lf.softmax(a, axis=-1),
                lf.nn.layer_norm(a), (a * 0.5 - lf.mean(a, axis=-1, keepdims=True)) * 2.0]
    want = [np.asarray(v) for v in prog(lf.array(xt, device=device))]
    eager = [np.asarray(v) for v in prog(X.T)]
    f = lf.compile(lambda a: prog(a.T))
    for got in (eager, [np.asarray(v) for v in f(X)], [np.asarray(v) for v in f(X)]):
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    # (a GPU sums in another order than numpy: a row whose sum cancels differs by a few ulps of its terms)
    np.testing.assert_allclose(want[0], xt.sum(-1, keepdims=True), rtol=1e-13,
                               atol=1e-14 * np.abs(xt).sum(-1).max())
