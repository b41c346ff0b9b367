"""lf.compile after the first call: on the GPU one multi-lane CUDA graph per signature (on the CPU the
command list). Arguments that stay the same, arguments that change, outputs kept across calls, outputs
fed back as inputs, lanes with random delays: all must equal numpy, and on the GPU the graph must
really be used (LANEFLOW_GRAPH strict: a plan that cannot be captured fails the test)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import laneflow as lf
from laneflow.graph import grouping
import laneflow.graph.plan as plan_mod


@pytest.fixture
def strict(monkeypatch):
    monkeypatch.setattr(plan_mod, "GRAPH_MODE", "strict")


def _mode(f) -> str:
    (s,) = f.stats()
    return s["mode"]


def _expect_graph(device, f) -> dict:
    (s,) = f.stats()
    assert s["mode"] == ("cuda graph" if device.type == "gpu" else "one command"), s
    return s


def mlp(x, w1, w2):
    h = lf.tanh(x @ w1)
    return lf.softmax(h @ w2, axis=-1), h.sum(axis=0)


def mlp_np(x, w1, w2):
    h = np.tanh(x @ w1)
    z = h @ w2
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True), h.sum(axis=0)


def test_same_new_and_kept_arguments_and_kept_outputs_equal_numpy(device, rng, strict):
    s = lf.new_stream(device, lanes=4)
    with lf.stream(s):
        f = lf.compile(mlp)
        w1n, w2n = rng.standard_normal((32, 64)), rng.standard_normal((64, 16))
        w1, w2 = lf.array(w1n), lf.array(w2n)
        xs = [rng.standard_normal((8, 32)) for _ in range(6)]
        kept = []
        x0 = lf.array(xs[0])
        for k in range(3):                      # the same arguments: read where they are
            kept.append((xs[0], f(x0, w1, w2)))
        for xn in xs[1:]:                       # a new x each call: staged; outputs of earlier calls kept
            kept.append((xn, f(lf.array(xn), w1, w2)))
        st = _expect_graph(device, f)
        for xn, (p, hs) in kept:
            rp, rh = mlp_np(xn, w1n, w2n)
            np.testing.assert_allclose(np.asarray(p), rp, rtol=1e-12, atol=1e-15)
            np.testing.assert_allclose(np.asarray(hs), rh, rtol=1e-12, atol=1e-12)
        if device.type == "gpu":
            # call 1 runs commands; calls 2 and 3 capture the two output sets (call 2's outputs are
            # kept); the new x at call 4 stages it and both sets are captured again; from call 4 on
            # each call moves the two kept outputs of the set it reuses
            assert st["captures"] == 4 and st["staged_args"] == [0] and st["output_sets"] == 2, st
            assert st["evacuated"] == 2 * (len(kept) - 3), st
    s.close()


def test_output_fed_back_as_the_next_input(device, rng, strict):
    with lf.stream(lf.new_stream(device, lanes=2)):
        wn = rng.standard_normal((16, 16)) * 0.3
        w = lf.array(wn)
        f = lf.compile(lambda x, w: lf.tanh(x @ w) + x * 0.5)
        xn = rng.standard_normal((4, 16))
        x, ref = lf.array(xn), xn
        for _ in range(12):
            x = f(x, w)
            ref = np.tanh(ref @ wn) + ref * 0.5
        np.testing.assert_allclose(np.asarray(x), ref, rtol=1e-10, atol=1e-12)
        _expect_graph(device, f)


def test_dropped_outputs_are_not_moved_and_lanes_with_delays_keep_order(device, rng, strict):
    s = lf.new_stream(device, lanes=4)
    with lf.stream(s), lf.testing.inject_delays(0.0005, seed=5):
        f = lf.compile(lambda a, b: [lf.sin(a * k) + lf.cos(b) for k in range(1, 6)])
        an, bn = rng.standard_normal(300), rng.standard_normal(300)
        a, b = lf.array(an), lf.array(bn)
        for _ in range(5):
            outs = f(a, b)
            got = [np.asarray(o) for o in outs]
            del outs
            gc.collect()
        for k, g in enumerate(got, start=1):  # GPU sin/cos may differ from numpy's in the last bit
            np.testing.assert_allclose(g, np.sin(an * k) + np.cos(bn), rtol=1e-14, atol=1e-15)
        st = _expect_graph(device, f)
        if device.type == "gpu":
            assert st["evacuated"] == 0 and st["captures"] == 1, st
    s.close()


def test_readers_on_other_streams_finish_before_the_region_is_rewritten(device, rng, strict):
    """Outputs read by lazily queued work on another stream, then dropped: the next calls overwrite the
    output memory only after those readers ran (delays make a missing wait visible)."""
    s, other = lf.new_stream(device, lanes=2), lf.new_stream(device, lanes=2)
    f = lf.compile(lambda x: x * 3.0 + 1.0)
    results, refs = [], []
    with lf.testing.inject_delays(0.002, seed=9):
        for k in range(6):
            xn = rng.standard_normal(1000)
            with lf.stream(s):
                y = f(lf.array(xn))
            with lf.stream(other):
                results.append(lf.exp(y * 0.1) + 0.0)
            lf.async_eval(results[-1])
            refs.append(np.exp((xn * 3.0 + 1.0) * 0.1) + 0.0)
            del y
    for r, ref in zip(results, refs):
        np.testing.assert_allclose(np.asarray(r), ref, rtol=1e-14)
    _expect_graph(device, f)
    s.close()
    other.close()


def test_independent_branches_become_parallel_graph_branches(rng, strict, monkeypatch):
    if not lf.gpu_available():
        pytest.skip("no usable GPU: laneflow's CUDA backend or an NVIDIA driver is missing")
    monkeypatch.setattr(grouping, "_enabled", False)  # else the 8 matmuls are one grouped GEMM
    with lf.stream(lf.new_stream(lf.gpu, lanes=4)):
        ws = [lf.array(rng.standard_normal((64, 64)).astype(np.float32)) for _ in range(8)]
        x = lf.array(rng.standard_normal((16, 64)).astype(np.float32))
        f = lf.compile(lambda x, *ws: [lf.tanh(x @ w) for w in ws])
        for _ in range(3):
            outs = f(x, *ws)
        st = f.stats()[0]
        assert st["mode"] == "cuda graph" and st["branches"] == 8 and st["nodes"] >= 16, st
        for o, w in zip(outs, ws):
            np.testing.assert_allclose(np.asarray(o), np.tanh(np.asarray(x) @ np.asarray(w)), rtol=1e-4, atol=2e-5)


def test_repeated_calls_allocate_nothing(rng, strict):
    if not lf.gpu_available():
        pytest.skip("no usable GPU: laneflow's CUDA backend or an NVIDIA driver is missing")
    from laneflow.defaults import backend_for

    be = backend_for(lf.gpu)
    with lf.stream(lf.new_stream(lf.gpu, lanes=2)):
        w = lf.array(rng.standard_normal((32, 32)).astype(np.float32))
        x = lf.array(rng.standard_normal((8, 32)).astype(np.float32))
        f = lf.compile(lambda x, w: lf.tanh(x @ w).sum(axis=1) + x.mean())
        for _ in range(3):
            y = f(x, w)
        lf.eval(y)
        del y
        gc.collect()
        base = be.memory_stats()["used"]
        for _ in range(10_000):
            y = f(x, w)
        ref = np.tanh(np.asarray(x) @ np.asarray(w)).sum(axis=1) + np.asarray(x).mean()
        np.testing.assert_allclose(np.asarray(y), ref, rtol=2e-5, atol=2e-5)
        del y
        gc.collect()
        used = be.memory_stats()["used"]
        assert used <= base, (base, used)
        st = f.stats()[0]
        # y = f(x, w) keeps the previous y alive during the call: two output sets, nothing moved
        assert st["mode"] == "cuda graph" and st["captures"] == 2 and st["evacuated"] == 0, st
        assert st["launches"] >= 10_000, st


def test_outputs_written_in_place_used_later_and_moved_keep_their_values(device, rng, strict):
    """A returned value assigned into (``y[:8] = 7`` may reuse its buffer, which lies in the plan's
    output memory), one kept and read by a later op, and calls enough to make the plan move kept
    outputs: every value stays what it was (delays make a missing wait visible)."""
    with lf.stream(lf.new_stream(device, lanes=2)), lf.testing.inject_delays(0.0005, seed=3):
        f = lf.compile(lambda x: [x * 2.0 + 1.0, x - 3.0])
        xn = rng.standard_normal(64)
        x = lf.array(xn)
        f(x)
        f(x)                                   # commands, then the graph
        y, z = f(x)
        y[:8] = 7.0                            # may write into y's output memory in place
        used = lf.sin(z) * 2.0                 # a later op reads an output: ordered after the call
        kept = [f(x) for _ in range(5)]        # both output sets busy: kept outputs move
        want_y = xn * 2.0 + 1.0
        want_y[:8] = 7.0
        np.testing.assert_array_equal(np.asarray(y), want_y)
        np.testing.assert_allclose(np.asarray(used), np.sin(xn - 3.0) * 2.0, rtol=1e-14, atol=1e-15)
        for a, b in kept:
            np.testing.assert_array_equal(np.asarray(a), xn * 2.0 + 1.0)
            np.testing.assert_array_equal(np.asarray(b), xn - 3.0)
        st = _expect_graph(device, f)
        if device.type == "gpu":
            assert st["evacuated"] > 0, st


# -- lf.linalg inside a compiled function: cuSOLVER captured into the graph -----------------------

def _spd(rng, n, batch=()):
    a = rng.standard_normal((*batch, n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


def _linalg_step(a, b):
    """The routines captured into the graph on the GPU, with elementwise work around them."""
    c = lf.linalg.cholesky(a)
    x = lf.linalg.solve(a, b)
    ai = lf.linalg.inv(a * 2.0)
    q, r = lf.linalg.qr(a + 1.0)
    return c + 1.0, x * 3.0, ai, lf.abs(q) + lf.abs(r)


def _spectral_step(a):
    """eigh and svd: cuSOLVER's syevd cannot be captured, so on the GPU these replay as commands."""
    w, v = lf.linalg.eigh(a)
    s = lf.linalg.svd(a - 0.5, compute_uv=False)
    return w, lf.abs(v), s


@pytest.mark.parametrize("lanes", [1, 3])
def test_compiled_linalg_equals_eager_and_numpy_on_every_call(device, rng, strict, lanes):
    """On the GPU the cuSOLVER calls are captured into the graph (strict: a capture failure fails the
    test); every call with fresh inputs equals the eager result and numpy."""
    s = lf.new_stream(device, lanes=lanes)
    f = lf.compile(_linalg_step)
    with lf.stream(s):
        for _ in range(4):
            an = _spd(rng, 6, (2,))
            bn = rng.standard_normal((2, 6, 3))
            a, b = lf.array(an), lf.array(bn)
            got = [np.asarray(o) for o in f(a, b)]
            want = [np.asarray(o) for o in _linalg_step(a, b)]
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)
            np.testing.assert_allclose(got[0], np.linalg.cholesky(an) + 1.0, rtol=1e-9)
            np.testing.assert_allclose(got[1], np.linalg.solve(an, bn) * 3.0, rtol=1e-9)
            np.testing.assert_allclose(got[2], np.linalg.inv(an * 2.0), rtol=1e-9)
    _expect_graph(device, f)
    s.close()


def test_compiled_eigh_and_svd_replay_commands_and_leave_the_solver_usable(device, rng):
    f = lf.compile(_spectral_step)
    with lf.stream(device):
        for _ in range(3):
            an = _spd(rng, 5)
            w, v, sv = (np.asarray(o) for o in f(lf.array(an)))
            np.testing.assert_allclose(w, np.linalg.eigvalsh(an), rtol=1e-9)
            np.testing.assert_allclose(sv, np.linalg.svd(an - 0.5, compute_uv=False), rtol=1e-9)
        (st,) = f.stats()
        assert st["mode"] == ("commands" if device.type == "gpu" else "one command"), st
        if device.type == "gpu":
            assert "syevd" in st["note"] or "gesvd" in st["note"], st
        an = _spd(rng, 5)  # eager cuSOLVER still works after the refused capture
        np.testing.assert_allclose(np.asarray(lf.linalg.cholesky(lf.array(an))), np.linalg.cholesky(an), rtol=1e-9)


def test_compiled_cholesky_raises_for_the_call_that_failed_only(device, rng, strict):
    """devInfo inside the graph: each launch is checked with what it wrote, also while an earlier call's
    values are kept and another launch of the same graph rewrites its slot."""
    f = lf.compile(lambda a: lf.linalg.cholesky(a) * 2.0)
    good = _spd(rng, 5)
    bad = -np.eye(5)
    with lf.stream(device):
        for _ in range(2):  # trace, then the graph
            np.testing.assert_allclose(np.asarray(f(lf.array(good))), np.linalg.cholesky(good) * 2.0, rtol=1e-12)
        kept = f(lf.array(good))          # values alive: the next calls use the other output set
        failed = f(lf.array(bad))
        later = [f(lf.array(good)) for _ in range(3)]   # sets reused, kept values moved out
        with pytest.raises(lf.LinAlgError, match="not positive definite"):
            lf.eval(failed)
        with pytest.raises(lf.LinAlgError):
            lf.eval(failed + 1.0)         # also what is computed from it
        lf.eval(kept, *later)
        np.testing.assert_allclose(np.asarray(kept), np.linalg.cholesky(good) * 2.0, rtol=1e-12)
        np.testing.assert_allclose(np.asarray(later[-1]), np.linalg.cholesky(good) * 2.0, rtol=1e-12)
        with pytest.raises(lf.LinAlgError):
            np.asarray(f(lf.array(bad)))
        np.testing.assert_allclose(np.asarray(f(lf.array(good))), np.linalg.cholesky(good) * 2.0, rtol=1e-12)
    _expect_graph(device, f)


def test_compiled_solves_on_two_streams_alongside_eager_solves_stay_correct(device, rng, strict):
    """Graphs holding cuSOLVER calls, launched from two streams, interleaved with eager solves on four
    lanes that share the device's handle, with injected delays: every result equals numpy."""
    f = lf.compile(lambda a, b: lf.linalg.solve(a, b) + 1.0)
    s1, s2 = lf.new_stream(device, lanes=2), lf.new_stream(device, lanes=4)
    probs = [(_spd(rng, 8), rng.standard_normal((8, 2))) for _ in range(12)]
    outs = []
    with lf.testing.inject_delays(0.002, seed=int(rng.integers(1 << 30))):
        for k, (an, bn) in enumerate(probs):
            st = s1 if k % 2 else s2
            with lf.stream(st):
                a, b = lf.array(an), lf.array(bn)
                outs.append((f(a, b), np.linalg.solve(an, bn) + 1.0))
            with lf.stream(s2):
                outs.append((lf.linalg.solve(lf.array(an * 2.0), lf.array(bn)), np.linalg.solve(an * 2.0, bn)))
        for got, want in outs:
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-9)
    assert len(f.stats()) == 2  # a plan per stream
    for st in f.stats():
        assert st["mode"] == ("cuda graph" if device.type == "gpu" else "one command"), st
    s1.close(), s2.close()


def test_cpu_plans_copy_the_layout_of_an_argument_again_only_for_another_value(rng):
    """A CPU plan keeps the layout copies of its arguments (a weight's transpose) between calls and
    makes them again only for another value: a new array, the same array bound to a new value (x[...]
    = v), or memory shared outside laneflow (a zero-copy import that its owner changes)."""
    st = lf.new_stream(lf.cpu, lanes=1)
    f = lf.compile(lambda h, w: h @ w.T + 1.0)
    hn = rng.standard_normal((3, 4)).astype(np.float32)
    w1n, w2n = (rng.standard_normal((5, 4)).astype(np.float32) for _ in range(2))
    with lf.stream(st):
        h, w1, w2 = lf.array(hn), lf.array(w1n), lf.array(w2n)
        for w, wn in [(w1, w1n)] * 3 + [(w2, w2n), (w1, w1n), (w2, w2n), (w2, w2n)]:
            np.testing.assert_array_equal(np.asarray(f(h, w)), hn @ np.ascontiguousarray(wn.T) + 1.0)
        (s,) = f.stats()
        assert s["mode"] == "one command" and s["kept_bytes"] == w1n.nbytes, s
        w1[0] = 7.0  # the same Array, another value
        w1n[0] = 7.0
        np.testing.assert_array_equal(np.asarray(f(h, w1)), hn @ np.ascontiguousarray(w1n.T) + 1.0)
        shared = np.ones((5, 4), np.float32)
        ws = lf.from_dlpack(shared)  # zero-copy: the owner's writes show
        np.testing.assert_array_equal(np.asarray(f(h, ws)), hn @ shared.T + 1.0)
        shared[...] = 2.0
        np.testing.assert_array_equal(np.asarray(f(h, ws)), hn @ shared.T + 1.0)
    st.close()


def test_a_call_that_never_ran_leaves_the_kept_copies_of_the_call_before(rng):
    """A call whose input failed runs no step: the next call with its weight copies that weight."""
    st = lf.new_stream(lf.cpu, lanes=1)
    f = lf.compile(lambda h, w: h @ w.T)
    hn = rng.standard_normal((3, 4)).astype(np.float32)
    w1n, w2n = (rng.standard_normal((5, 4)).astype(np.float32) for _ in range(2))
    with lf.stream(st):
        h, w1, w2 = lf.array(hn), lf.array(w1n), lf.array(w2n)
        for _ in range(3):
            f(h, w1)
        failed = lf.take(h, lf.array(np.arange(3)) + 5, axis=0)  # out of bounds, found when it runs
        with pytest.raises(lf.ExecutionError):
            lf.eval(failed)
        with pytest.raises(lf.ExecutionError):
            lf.eval(f(failed, w2))
        np.testing.assert_array_equal(np.asarray(f(h, w2)), hn @ np.ascontiguousarray(w2n.T))
    st.close()


def test_cached_eager_plans_keep_layout_copies_until_a_weight_changes(rng):
    """The plan cache's CPU executor keeps them too: a repeated eager step with a changed weight."""
    st = lf.new_stream(lf.cpu, lanes=1)
    hn = rng.standard_normal((3, 4)).astype(np.float32)
    wn = rng.standard_normal((5, 4)).astype(np.float32)
    with lf.stream(st):
        h, w = lf.array(hn), lf.array(wn)
        for k in range(8):
            if k == 5:
                wn = wn * 2.0
                w = lf.array(wn)
            y = lf.tanh(h @ w.T) * 0.5
            lf.eval(y)
            np.testing.assert_array_equal(np.asarray(y), np.tanh(hn @ np.ascontiguousarray(wn.T)) * np.float32(0.5))
    st.close()
