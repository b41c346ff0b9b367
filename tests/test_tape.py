"""Trace-guided replay (``graph/tape.py``, ``ops/tape.py``): a repeated step is recorded once as its op
calls, and later steps answer each matching call with the recorded nodes. Every case checks values
against numpy (or the same program with the tape off); the counters say whether a step was replayed,
left the tape (a divergence) or missed."""

from __future__ import annotations

import gc
import sys
import threading
import weakref

import numpy as np
import pytest

import laneflow as lf
from laneflow.graph import eval_cache, tape


@pytest.fixture(params=["C steps", "C maker", "Python"])
def taping(device, request, monkeypatch):
    # every case three ways: the steps in C (ops/ctape.c interprets each call's Plan), Python steps
    # whose nodes the C node maker makes, and all in Python
    from laneflow.ops import ctape, tape_steps

    tape_steps._maker()
    if request.param != "Python" and not tape_steps._GLOBALS["C"]:
        pytest.skip(f"the tape's node maker is not built here ({ctape.why_not()})")
    if request.param == "C steps" and tape_steps._GLOBALS.get("CSTEP") is None:
        pytest.skip("LANEFLOW_CSTEPS=0: the steps are not in C")
    monkeypatch.setitem(tape_steps._GLOBALS, "C", request.param != "Python")
    if request.param == "C maker":
        monkeypatch.setitem(tape_steps._GLOBALS, "CSTEP", None)
    eval_cache.clear()
    lf.set_plan_cache(tape=True)
    yield device
    eval_cache.clear()


def _stats() -> dict:
    return {k: tape.STATS[k] for k in tape.STATS}


def _delta(before: dict) -> dict:
    return {k: tape.STATS[k] - before[k] for k in tape.STATS}


def _forward(x, ws, scale=0.5, shape=None, xp=lf):
    h = xp.tanh(x @ ws[0])
    for w in ws[1:]:
        h = h + scale * xp.tanh(h @ w)
    if shape is not None:
        h = h.reshape(shape)
    return h[..., :5].sum(axis=-1)


def _np_forward(x, ws, **kw):
    return _forward(x, ws, xp=np, **kw)


def _setup(rng, device, layers=3):
    st = lf.new_stream(device, lanes=2)
    wn = [rng.standard_normal((8, 8)) * 0.3 for _ in range(layers)]
    ws = [lf.array(w, stream=st) for w in wn]
    lf.eval(*ws)
    return st, ws, wn


def _step(st, xn, ws, **kw):
    x = lf.array(xn, stream=st)
    lf.eval(x)
    with lf.stream(st):
        y = _forward(x, ws, **kw)
    lf.eval(y)
    return np.asarray(y)


def test_a_repeated_step_is_recorded_then_replayed_with_new_inputs(taping):
    rng = np.random.default_rng(0)
    st, ws, wn = _setup(rng, taping)
    before = _stats()
    for k in range(8):
        xn = rng.standard_normal((3, 8))
        np.testing.assert_allclose(_step(st, xn, ws), _np_forward(xn, wn), rtol=1e-12, atol=1e-12)
    d = _delta(before)
    assert d["tapes_recorded"] == 1 and d["tape_replays"] >= 3, d
    assert d["tape_divergences"] == 0 and d["tape_misses"] == 0, d
    assert lf.plan_cache_info()["tapes"] == 1


def test_the_tape_is_off_when_asked(taping):
    rng = np.random.default_rng(1)
    st, ws, wn = _setup(rng, taping)
    lf.set_plan_cache(tape=False)
    try:
        before = _stats()
        for _ in range(6):
            xn = rng.standard_normal((3, 8))
            np.testing.assert_allclose(_step(st, xn, ws), _np_forward(xn, wn), rtol=1e-12, atol=1e-12)
        assert _delta(before)["tape_replays"] == 0 and lf.plan_cache_info()["tape"] is False
    finally:
        lf.set_plan_cache(tape=True)


def _built(rng, st, ws):
    """The step's graph on a new evaluated input, built (replayed) and not evaluated."""
    x = lf.array(rng.standard_normal((3, 8)), stream=st)
    lf.eval(x)
    with lf.stream(st):
        return _forward(x, ws)


def _replaying(rng, device, **kw):
    """A step replayed from its tape at least once."""
    st, ws, wn = _setup(rng, device)
    for _ in range(6):
        _step(st, rng.standard_normal((3, 8)), ws, **kw)
    assert tape.STATS["tape_replays"] > 0
    return st, ws, wn


@pytest.mark.parametrize("change", [{"scale": 0.25}, {"shape": (3, 2, 4)}])  # a static float, a static tuple
def test_a_changed_static_argument_leaves_the_tape_and_gives_the_new_result(taping, change):
    rng = np.random.default_rng(2)
    st, ws, wn = _replaying(rng, taping)
    before = _stats()
    xn = rng.standard_normal((3, 8))
    np.testing.assert_allclose(_step(st, xn, ws, **change), _np_forward(xn, wn, **change), rtol=1e-12, atol=1e-12)
    assert _delta(before)["tape_divergences"] == 1
    why = lf.plan_cache_info()["tape_last_divergence"]  # (which call, and why: what a user asks)
    want = ("Array.__rmul__: an argument differs from the recording" if "scale" in change else
            "Array.reshape where the tape has Array.__getitem__")  # (the reshape is a call the tape lacks)
    assert why.startswith("call ") and want in why, why


@pytest.mark.parametrize("index", [(Ellipsis, slice(None, 4)), (Ellipsis, slice(None, 5, 2)), (Ellipsis, slice(1, 5)),
                                   (slice(None), slice(None, 5)), (Ellipsis, slice(None, np.int64(5))),
                                   (Ellipsis, slice(None, 5), None)])
def test_an_index_that_differs_anywhere_leaves_the_tape(taping, index):
    # the tape compares index tuples and slices field by field, classes too (np.int64(5) is not 5)
    st = lf.new_stream(taping, lanes=1)
    rng = np.random.default_rng(9)

    def step(xn, ix):
        x = lf.array(xn, stream=st)
        lf.eval(x)
        with lf.stream(st):
            y = lf.tanh(x)[ix] * 2.5
        lf.eval(y)
        return np.asarray(y)

    recorded = (Ellipsis, slice(None, 5))
    for _ in range(6):
        xn = rng.standard_normal((3, 8))
        np.testing.assert_allclose(step(xn, recorded), np.tanh(xn)[recorded] * 2.5, rtol=1e-12)
    assert tape.STATS["tape_replays"] > 0
    before = _stats()
    xn = rng.standard_normal((3, 8))
    np.testing.assert_allclose(step(xn, index), np.tanh(xn)[index] * 2.5, rtol=1e-12)
    assert _delta(before)["tape_divergences"] == 1


def test_an_untaped_op_reading_another_intermediate_than_recorded_gets_the_right_values(taping):
    """lf.sort is not taped: it reads a replayed node without ending the replay. Reading ``m`` in the
    recorded steps and ``b`` later leaves the nodes' users the same in sum, not node by node; the
    evaluation must not take the recorded plan for this graph (it kept ``a`` with too few users, and
    evaluating ``sort(b)`` then wrote ``a + 1`` into ``a``'s buffer: ``sort(a)`` came out as ``sort(a + 1)``)."""
    st = lf.new_stream(taping, lanes=1)
    rng = np.random.default_rng(14)

    def build(x, first):  # (a, b and m die here: only the plan can need them)
        a = x * 2.0
        s1 = lf.sort(a)
        b = a + 1.0
        m = a - 1.0
        s2 = lf.sort(m) if first else lf.sort(b)
        return b + m, s1, s2

    for k in range(10):
        xn = rng.standard_normal(16)
        x = lf.array(xn, stream=st)
        lf.eval(x)
        with lf.stream(st):
            r, s1, s2 = build(x, k < 5)
        lf.eval(r)
        an = xn * 2.0
        np.testing.assert_allclose(np.asarray(s2), np.sort(an - 1.0 if k < 5 else an + 1.0), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(s1), np.sort(an), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(r), 2 * an, rtol=1e-12)
    assert tape.STATS["tape_replays"] > 0


def test_minus_zero_is_not_the_zero_the_tape_has(taping):
    st = lf.new_stream(taping, lanes=1)

    def step(s):
        x = lf.array(np.ones(3), stream=st)
        lf.eval(x)
        with lf.stream(st):
            y = lf.tanh(x) * s
        lf.eval(y)
        return np.asarray(y)

    for _ in range(6):
        assert not np.signbit(step(0.0)).any()
    before = _stats()
    assert np.signbit(step(-0.0)).all()
    assert _delta(before)["tape_divergences"] == 1


def test_an_int_where_the_tape_has_a_float_is_another_call(taping):
    rng = np.random.default_rng(3)
    st, ws, wn = _setup(rng, taping)
    for _ in range(6):
        _step(st, rng.standard_normal((3, 8)), ws, scale=1.0)
    before = _stats()
    xn = rng.standard_normal((3, 8))
    np.testing.assert_allclose(_step(st, xn, ws, scale=1), _np_forward(xn, wn, scale=1), rtol=1e-12, atol=1e-12)
    assert _delta(before)["tape_divergences"] == 1


def test_an_array_rebound_in_place_mid_step_leaves_the_tape(taping):
    rng = np.random.default_rng(4)
    st, ws, wn = _replaying(rng, taping)

    def step(xn, bump):
        x = lf.array(xn, stream=st)
        lf.eval(x)
        with lf.stream(st):
            h = lf.tanh(x @ ws[0])
            if bump:
                h += 1.0  # rebinds h: the next call's argument is not the tape's
            h = h + 0.5 * lf.tanh(h @ ws[1])
            y = h.sum(axis=-1)
        lf.eval(y)
        return np.asarray(y)

    def ref(xn, bump):
        h = np.tanh(xn @ wn[0]) + (1.0 if bump else 0.0)
        return (h + 0.5 * np.tanh(h @ wn[1])).sum(axis=-1)

    for _ in range(6):
        xn = rng.standard_normal((3, 8))
        np.testing.assert_allclose(step(xn, False), ref(xn, False), rtol=1e-12)
    before = _stats()
    xn = rng.standard_normal((3, 8))
    np.testing.assert_allclose(step(xn, True), ref(xn, True), rtol=1e-12)
    assert _delta(before)["tape_divergences"] == 1
    xn = rng.standard_normal((3, 8))
    np.testing.assert_allclose(step(xn, False), ref(xn, False), rtol=1e-12)


def test_one_array_for_two_leaves_the_tape_had_apart_is_not_replayed(taping):
    rng = np.random.default_rng(5)
    st = lf.new_stream(taping, lanes=1)

    def step(a, b):
        with lf.stream(st):
            y = (a - b) * 2.0 + a
        lf.eval(y)
        return np.asarray(y)

    for _ in range(6):
        an, bn = rng.standard_normal(4), rng.standard_normal(4)
        a, b = lf.array(an, stream=st), lf.array(bn, stream=st)
        lf.eval(a, b)
        np.testing.assert_allclose(step(a, b), (an - bn) * 2.0 + an)
    an = rng.standard_normal(4)
    a = lf.array(an, stream=st)
    lf.eval(a)
    np.testing.assert_allclose(step(a, a), an)


def test_a_stream_changed_mid_step_leaves_the_tape_and_the_nodes_follow_it(taping):
    rng = np.random.default_rng(6)
    st, ws, wn = _replaying(rng, taping)
    other = lf.new_stream(taping, lanes=1)
    x = lf.array(rng.standard_normal((3, 8)), stream=st)
    lf.eval(x)
    before = _stats()
    with lf.stream(st):
        h = lf.tanh(x @ ws[0])
        with lf.stream(other):
            g = h + 0.5 * lf.tanh(h @ ws[1])
    assert g.stream is other
    lf.eval(g)
    assert _delta(before)["tape_divergences"] == 1


def test_another_threads_ops_during_a_replay_run_as_usual(taping):
    rng = np.random.default_rng(7)
    st, ws, wn = _replaying(rng, taping)
    x = lf.array(rng.standard_normal((3, 8)), stream=st)
    lf.eval(x)
    out = {}

    def other():
        s2 = lf.new_stream(taping, lanes=1)
        a = lf.array(np.arange(8.0), stream=s2)
        out["v"] = np.asarray(lf.tanh(a @ lf.array(np.eye(8), stream=s2)) * 2.0)

    before = _stats()
    with lf.stream(st):
        h = lf.tanh(x @ ws[0])  # the replay has started on this thread
        t = threading.Thread(target=other)
        t.start()
        t.join()
        for w in ws[1:]:
            h = h + 0.5 * lf.tanh(h @ w)
        y = h[..., :5].sum(axis=-1)
        del h  # (as in _forward, whose graph the tape's plan has: no array holds the last sum)
    lf.eval(y)
    np.testing.assert_allclose(out["v"], np.tanh(np.arange(8.0)) * 2.0)
    np.testing.assert_allclose(np.asarray(y), _np_forward(np.asarray(x), wn), rtol=1e-12)
    d = _delta(before)
    assert d["tape_replays"] == 1 and d["tape_divergences"] == 0, d


def test_a_replay_does_not_keep_the_steps_values_alive(taping):
    rng = np.random.default_rng(8)
    st, ws, wn = _replaying(rng, taping)
    y = _built(rng, st, ws)
    lf.eval(y)
    ref = weakref.ref(y._data)
    del y
    gc.collect()
    assert ref() is None


def test_a_call_the_tape_cannot_note_gives_no_tape_and_the_entry_stops_asking(taping):
    rng = np.random.default_rng(9)
    st = lf.new_stream(taping, lanes=1)
    w = lf.array(rng.standard_normal((4, 4)), stream=st)
    lf.eval(w)
    before = _stats()
    for _ in range(10):
        xn = rng.standard_normal(4)
        x = lf.array(xn, stream=st)
        lf.eval(x)
        with lf.stream(st):
            y = lf.tanh(x @ w) + xn  # a numpy array argument: not static data the tape can compare
        lf.eval(y)
        np.testing.assert_allclose(np.asarray(y), np.tanh(xn @ np.asarray(w)) + xn, rtol=1e-12)
    d = _delta(before)
    assert d["tapes_recorded"] == 0 and d["tape_replays"] == 0, d
    assert any(e.tape == tape.MAX_MISSES for e in eval_cache._entries.values())
    why = lf.plan_cache_info()["tape_last_failure"]  # (what a user asks when a step is never taped)
    assert why.startswith("Array.__add__: an argument the tape cannot compare"), why


def test_gpt2_small_replayed_from_its_tape_matches_the_untaped_forward(taping):
    """The yardstick model (lf.nn, a small config): logits equal, bit for bit, with the tape off."""
    from laneflow.models import gpt2

    cfg = gpt2.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=97, n_positions=32)
    st = lf.new_stream(taping, lanes=1)
    params = gpt2.init_params(cfg, seed=0, dtype=lf.float32, device=taping)
    lf.eval(list(params.values()))
    rng = np.random.default_rng(10)
    before = _stats()
    ids, got = [], []
    for k in range(7):
        ids.append(lf.array(rng.integers(0, cfg.vocab_size, (2, 8)), stream=st))
        with lf.stream(st):
            got.append(np.asarray(gpt2.forward(params, ids[-1], cfg, gpt2.NN_OPS)))
    assert _delta(before)["tape_replays"] >= 2
    lf.set_plan_cache(tape=False)
    try:
        for x, g in zip(ids, got):
            with lf.stream(st):
                np.testing.assert_array_equal(g, np.asarray(gpt2.forward(params, x, cfg, gpt2.NN_OPS)))
    finally:
        lf.set_plan_cache(tape=True)


@pytest.mark.parametrize("extra", ["kept", "used"])
def test_a_replay_whose_graph_differs_from_the_tapes_is_not_taken_for_it(taping, extra):
    """The eval after a whole replay takes the tape's graph without matching it only when every node's
    users and arrays are as recorded: an intermediate array kept, or read by an op the tape does not
    record (lf.sort), makes another graph, which must not hit the tape's plan."""
    rng = np.random.default_rng(11)
    st, ws, wn = _replaying(rng, taping)
    xn = rng.standard_normal((3, 8))
    x = lf.array(xn, stream=st)
    lf.eval(x)
    hits, before = eval_cache.STATS["hits"], _stats()
    with lf.stream(st):
        h = lf.tanh(x @ ws[0])
        side = h if extra == "kept" else lf.sort(h, axis=-1)
        for w in ws[1:]:
            h = h + 0.5 * lf.tanh(h @ w)
        y = h[..., :5].sum(axis=-1)
        del h
    lf.eval(y)
    np.testing.assert_allclose(np.asarray(y), _np_forward(xn, wn), rtol=1e-12)
    assert eval_cache.STATS["hits"] == hits  # (a graph seen for the first time)
    d = _delta(before)
    assert d["tape_replays"] == 0 and d["tape_misses"] == 1, d
    assert side.shape == (3, 8)


def _repeat(device, step, inputs, times=7):
    """``step(st, *values)`` for the first ``times`` input sets then each later one (the tape is replaying
    by then); every result returned, with the tape counters over the later ones."""
    st = lf.new_stream(device, lanes=1)
    for _ in range(times):
        step(st, *inputs[0])
    before = _stats()
    outs = [step(st, *vals) for vals in inputs]
    return outs, _delta(before)


@pytest.mark.parametrize("op", ["mask", "fill", "repeat"])
def test_an_op_that_reads_an_arrays_values_is_never_replayed_on_old_values(taping, op):
    """A boolean mask, a fill value, repeat counts given as evaluated arrays: the op reads their values
    to build its nodes, so a replay matching them by shape alone would reuse the old values."""
    rng = np.random.default_rng(12)
    xn = rng.standard_normal(4)

    def step(st, vn):
        x = lf.array(xn, stream=st)
        v = lf.array(vn, stream=st)
        lf.eval(x, v)
        with lf.stream(st):
            if op == "mask":
                y = lf.tanh(x)[v].sum()
            elif op == "fill":
                y = lf.full((4,), v) + lf.tanh(x)
            else:
                y = lf.repeat(lf.tanh(x), v)
        lf.eval(y)
        return np.asarray(y)

    first, later = {"mask": (np.array([True, False, True, True]), np.array([False, True, False, False])),
                    "fill": (np.float64(1.0), np.float64(7.0)),
                    "repeat": (np.array([1, 1, 1, 1]), np.array([2, 0, 1, 3]))}[op]
    outs, _ = _repeat(taping, step, [(first,), (later,)])
    t = np.tanh(xn)
    want = {"mask": lambda m: t[m].sum(), "fill": lambda f: np.full(4, f) + t, "repeat": lambda r: np.repeat(t, r)}[op]
    np.testing.assert_allclose(outs[0], want(first), rtol=1e-12)
    np.testing.assert_allclose(outs[1], want(later), rtol=1e-12)
    why = lf.plan_cache_info()["tape_last_failure"]
    name = {"mask": "Array.__getitem__", "fill": "lf.full", "repeat": "lf.repeat"}[op]
    assert why == f"{name} read array values on the host", why


def test_a_list_argument_changed_in_place_is_compared_as_it_was(taping):
    shape = [2, 3]
    xn = np.arange(6.0)

    def step(st, _):
        x = lf.array(xn, stream=st)
        lf.eval(x)
        with lf.stream(st):
            y = lf.reshape(lf.tanh(x), shape)
        lf.eval(y)
        return np.asarray(y)

    st = lf.new_stream(taping, lanes=1)
    for _ in range(7):
        step(st, None)
    shape[0], shape[1] = 3, 2
    before = _stats()
    np.testing.assert_allclose(step(st, None), np.tanh(xn).reshape(3, 2))
    assert _delta(before)["tape_divergences"] == 1


def test_complex_minus_zero_is_not_the_zero_the_tape_or_the_plan_has(taping):
    def step(st, c):
        x = lf.array(np.full(2, -0.0), stream=st)
        lf.eval(x)
        with lf.stream(st):
            y = lf.full((2,), c) + x
            z = lf.tanh(x) * 1.0 + c
        lf.eval(y, z)
        return np.asarray(y), np.asarray(z)

    cs = [np.complex128(0j), np.complex128(complex(-0.0, -0.0))]
    outs, _ = _repeat(taping, step, [(c,) for c in cs])
    x = np.full(2, -0.0)
    for c, (y, z) in zip(cs, outs):
        for got, want in ((y, np.full(2, c) + x), (z, np.tanh(x) * 1.0 + c)):
            np.testing.assert_array_equal(np.signbit(got.real), np.signbit(want.real))
            np.testing.assert_array_equal(np.signbit(got.imag), np.signbit(want.imag))
    assert np.signbit(outs[1][0].real).all()  # (the case: -0j must reach the result)


def test_an_array_in_an_index_tuple_where_the_tape_has_an_int_runs_as_usual(taping):
    xn = np.arange(12.0).reshape(3, 4)

    def step(st, idx):
        x = lf.array(xn, stream=st)
        lf.eval(x)
        with lf.stream(st):
            y = lf.tanh(x)[..., idx]
        lf.eval(y)
        return np.asarray(y)

    outs, _ = _repeat(taping, step, [(0,), (np.array([0, 2]),), (1,)])
    np.testing.assert_allclose(outs[1], np.tanh(xn)[..., [0, 2]])
    np.testing.assert_allclose(outs[2], np.tanh(xn)[..., 1])
    st = lf.new_stream(taping, lanes=1)
    a = lf.tanh(lf.array(xn, stream=st))  # the next op call after all that is answered, not MISS
    assert isinstance(a, lf.Array)


def test_a_leaf_used_twice_in_one_call_is_replayed(taping):
    def step(st, xn):
        x = lf.array(xn, stream=st)
        lf.eval(x)
        with lf.stream(st):
            y = lf.tanh(x * x)
        lf.eval(y)
        return np.asarray(y)

    rng = np.random.default_rng(13)
    ins = [(rng.standard_normal(3),) for _ in range(3)]
    outs, d = _repeat(taping, step, ins)
    for (xn,), y in zip(ins, outs):
        np.testing.assert_allclose(y, np.tanh(xn * xn), rtol=1e-12)
    assert d["tape_replays"] == 3 and d["tape_divergences"] == 0, d


def test_another_thread_evaluating_the_replayed_step_lets_its_values_go(taping):
    rng = np.random.default_rng(14)
    st, ws, wn = _replaying(rng, taping)
    y = _built(rng, st, ws)  # replayed; this thread does not evaluate it
    t = threading.Thread(target=lambda: lf.eval(y))
    t.start()
    t.join()
    ref = weakref.ref(y._data)
    del y
    gc.collect()
    assert ref() is None
    before = _stats()
    _step(st, rng.standard_normal((3, 8)), ws)  # and the tape still serves this thread's next step
    assert _delta(before)["tape_replays"] == 1


def test_two_programs_that_start_alike_do_not_cost_the_first_its_tape(taping):
    rng = np.random.default_rng(15)
    st, ws, wn = _setup(rng, taping)

    def other(xn):
        x = lf.array(xn, stream=st)
        lf.eval(x)
        with lf.stream(st):
            y = (lf.tanh(x @ ws[0]) * 3.0).max(axis=-1)  # starts as _forward does
        lf.eval(y)
        return np.asarray(y)

    for phase in range(4):
        before = _stats()
        for _ in range(8):
            xn = rng.standard_normal((3, 8))
            if phase % 2 == 0:
                np.testing.assert_allclose(_step(st, xn, ws), _np_forward(xn, wn), rtol=1e-12)
            else:
                np.testing.assert_allclose(other(xn), (np.tanh(xn @ wn[0]) * 3.0).max(axis=-1), rtol=1e-12)
        d = _delta(before)
        if phase % 2:
            assert d["tape_misses"] == 0, d  # (the other program diverges: not the tape's fault)
        elif phase:
            assert d["tape_replays"] >= 7, d


def test_host_data_a_recorded_call_made_is_not_the_replays_leaf(taping):
    """Host data made inside a taped call (lf.astype of a list) is uploaded as a leaf of the recorded
    graph; a replay makes its own, and its eval must not take the recording's buffer (which the caller
    here donates and so writes in place)."""
    st = lf.new_stream(taping, lanes=1)
    bump = lf.compile(lambda a: a * 100.0, donate_argnums=(0,))
    c_host = [1.0, 2.0, 3.0, 4.0]
    for k in range(9):
        x = lf.array(np.full(4, float(k)), stream=st)
        lf.eval(x)
        with lf.stream(st):
            c = lf.astype(c_host, lf.float64)
            y = (x * 2.0 + c) * 1.0
        lf.eval(y)
        np.testing.assert_allclose(np.asarray(y), 2.0 * k + np.array(c_host))
        with lf.stream(st):
            c = bump(c)
        lf.eval(c)


@pytest.mark.parametrize("first, then", [(np.nan, -np.nan), (0.0, -0.0)])
@pytest.mark.parametrize("kind", ["float", "bfloat16"])
def test_the_sign_of_nan_and_of_zero_reach_the_result(taping, first, then, kind):
    """A static float argument (a Python float, an ml_dtypes bfloat16) is compared bit for bit by the tape,
    and keyed so by the plan cache: the sign of NaN and of zero reach the result."""
    cast = float if kind == "float" else lf.bfloat16.type

    def step(st, v):
        x = lf.array(np.ones(3, np.float32), stream=st)
        lf.eval(x)
        with lf.stream(st):
            y = lf.copysign(x + 1.0, lf.full((3,), cast(v), dtype=lf.float32))
        lf.eval(y)
        return np.asarray(y)

    outs, _ = _repeat(taping, step, [(first,), (then,)])
    for v, y in zip((first, then), outs):
        np.testing.assert_array_equal(y, np.copysign(np.full(3, 2.0, np.float32), np.float32(cast(v))))


def test_a_call_inside_a_replay_another_thread_just_ended_runs_as_usual(taping):
    """The race the op wrapper covers, staged: another thread evaluates the replayed step (ending the
    replay and emptying it) while this thread is about to run the replay's next step function."""
    rng = np.random.default_rng(16)
    st, ws, wn = _replaying(rng, taping)
    xn = rng.standard_normal((3, 8))
    x = lf.array(xn, stream=st)
    lf.eval(x)
    with lf.stream(st):
        h = lf.tanh(x @ ws[0])
        rp = tape.STATE[0]
        assert rp.__class__.__name__ == "Replayer"
        t = threading.Thread(target=lambda: lf.eval(h))
        t.start()
        t.join()
        assert rp.cut and rp.made is None
        tape.STATE[0] = rp  # (as this thread's op wrapper read it before the other thread's eval)
        h = h + 0.5 * lf.tanh(h @ ws[1])
        for w in ws[2:]:
            h = h + 0.5 * lf.tanh(h @ w)
        y = h[..., :5].sum(axis=-1)
    np.testing.assert_allclose(np.asarray(y), _np_forward(xn, wn), rtol=1e-12)


def test_arrays_inside_lists_and_tuples_are_taped(taping):
    """lf.concatenate and lf.stack take a list of arrays, a dynamic_update_slice a tuple of starts that
    may hold a device scalar: such calls are taped element by element (a KV cache grown by concatenation
    replays), and a list of another length or an element of another kind is another call."""
    rng = np.random.default_rng(17)

    def step(st, xn, pos, n):
        x = lf.array(xn, stream=st)
        p = lf.array(np.int32(pos), stream=st)
        lf.eval(x, p)
        with lf.stream(st):
            t = lf.tanh(x)
            c = lf.concatenate([t] * n, axis=0)
            s = lf.stack((t, x * 2.0), axis=0).sum(axis=0)
            u = lf.dynamic_update_slice(lf.zeros((4, 3)), t[:1], (p, 0))
            y = c.sum() + s.sum() + u.sum(axis=1)
        lf.eval(y)
        return np.asarray(y)

    def ref(xn, pos, n):
        t = np.tanh(xn)
        u = np.zeros((4, 3))
        u[pos] = t[0]
        return np.concatenate([t] * n).sum() + (t + xn * 2.0).sum() + u.sum(axis=1)

    ins = [(rng.standard_normal((2, 3)), 1, 2), (rng.standard_normal((2, 3)), 2, 2),
           (rng.standard_normal((2, 3)), 0, 3), (rng.standard_normal((2, 3)), 3, 2)]
    outs, d = _repeat(taping, step, ins)
    for (xn, pos, n), y in zip(ins, outs):
        np.testing.assert_allclose(y, ref(xn, pos, n), rtol=1e-12)
    assert d["tape_replays"] >= 2 and d["tape_divergences"] == 1, d  # (three arrays in the list: another call)


def test_steps_on_several_streams_taking_turns_each_get_a_tape(taping):
    """As bench rows run: one model on three streams, a step on each in turn, with a step the plan cache
    bypasses between (its evaluation is another program's): every stream's steps are replayed."""
    rng = np.random.default_rng(18)
    rows = [_setup(rng, taping) for _ in range(3)]
    other = lf.new_stream(taping, lanes=1)
    before = _stats()
    for _ in range(10):
        for st, ws, wn in rows:
            xn = rng.standard_normal((3, 8))
            np.testing.assert_allclose(_step(st, xn, ws), _np_forward(xn, wn), rtol=1e-12)
            with eval_cache.bypass():
                lf.eval(lf.tanh(lf.array(xn, stream=other)) * 2.0)
    d = _delta(before)
    assert d["tapes_recorded"] == 3 and d["tape_replays"] >= 3 * 5, d


def test_a_tape_lets_the_recorded_steps_input_go_once_another_is_bound(taping):
    rng = np.random.default_rng(19)
    st, ws, wn = _setup(rng, taping)
    refs = []
    for _ in range(7):
        x = lf.array(rng.standard_normal((3, 8)), stream=st)
        lf.eval(x)
        refs.append(weakref.ref(x._data))
        with lf.stream(st):
            y = _forward(x, ws)
        lf.eval(y)
        del x, y
    gc.collect()
    assert tape.STATS["tape_replays"] > 0
    assert all(r() is None for r in refs[:-1]), [r() for r in refs]  # (the inputs of every step but the last)
    (t,) = [t for kept in tape.TAPES.values() for t in kept]
    assert sorted(map(id, [d for d in t.leaves if d is not None])) == sorted(id(w._data) for w in ws)  # (kept)


_ON_THE_FAKE_GPU = r'''
import sys
sys.path.insert(0, sys.argv[1])
import fake_cuda
fake_cuda.install()
import numpy as np
import laneflow as lf
from laneflow.graph import eval_cache, speculate, tape
from laneflow.models import gpt2
from laneflow.runtime import encoder

ops = []
_submit = encoder.CommandEncoder.submit
def submit(self, cmd, lane=None, settled=()):
    ops.append(cmd.op)
    return _submit(self, cmd, lane, settled)
encoder.CommandEncoder.submit = submit

cfg = gpt2.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=97, n_positions=32)
dev = lf.Device("gpu")
seen = {}
for on in (True, False):
    lf.set_plan_cache(tape=on)
    st = lf.new_stream(dev, lanes=1)
    params = gpt2.init_params(cfg, seed=0, dtype=lf.bfloat16, device=dev)
    lf.eval(list(params.values()))
    ids = lf.array(np.arange(8).reshape(1, 8), stream=st)
    lf.eval(ids)
    for _ in range(6):
        with lf.stream(st):
            y = gpt2.forward(params, ids, cfg, gpt2.NN_OPS)
        lf.eval(y)
    s0, t0, h0 = dict(speculate.STATS), dict(tape.STATS), eval_cache.STATS["hits"]
    del ops[:]
    for _ in range(10):
        with lf.stream(st):
            y = gpt2.forward(params, ids, cfg, gpt2.NN_OPS)
        lf.eval(y)
    seen[on] = (list(ops), speculate.STATS["speculation_used"] - s0["speculation_used"],
                tape.STATS["tape_replays"] - t0["tape_replays"], eval_cache.STATS["hits"] - h0)
on, off = seen[True], seen[False]
assert on[2] == 10 and off[2] == 0, (on[1:], off[1:])       # every step replayed from the tape
assert on[1] == off[1] == 10 and on[3] == off[3] == 10, (on[1:], off[1:])  # every guess taken, every step a hit
assert on[0] == off[0] == ["compiled graph"] * 10, (on[0], off[0])  # one launch a step, no output moved
print("ok")
'''


def test_on_the_fake_gpu_a_replayed_step_launches_as_an_untaped_one(tmp_path):
    """The CUDA backend's side, on the fake driver (it runs nothing, so no values): a replayed GPT-2
    step is a plan hit whose speculative launch (made from the replay's first node) is taken, with one
    graph launch a step and no outputs moved, as with the tape off."""
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed (pip install -e '.[dev]')")
    from conftest import run_under_fake_driver

    p = run_under_fake_driver(_ON_THE_FAKE_GPU, tmp_path, timeout=180)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout[-3000:] + p.stderr[-3000:]


def test_a_call_that_raises_and_is_caught_leaves_the_tape_alone(taping):
    """Duck typing: a step tries numpy's keyword, catches the TypeError and calls another way. The call
    that raised made nothing; the step is taped and replayed as if it had not been made."""
    st = lf.new_stream(taping, lanes=1)
    rng = np.random.default_rng(21)
    wn = rng.standard_normal((4, 3))
    w = lf.array(wn, stream=st)
    lf.eval(w)

    def total(h):
        try:
            return h.sum(axis=0, dtype=np.float64)  # (lf.Array.sum takes no dtype=)
        except TypeError:
            return h.sum(axis=0)

    before = _stats()
    for _ in range(10):
        xn = rng.standard_normal((2, 4))
        x = lf.array(xn, stream=st)
        lf.eval(x)
        with lf.stream(st):
            y = total((x @ w) * 0.5) + 1.0
        lf.eval(y)
        np.testing.assert_allclose(np.asarray(y), ((xn @ wn) * 0.5).sum(axis=0) + 1.0, rtol=1e-12)
    d = _delta(before)
    assert d["tape_replays"] >= 5 and d["tape_divergences"] == 0 and d["tape_misses"] == 0, d


def test_taped_methods_pickle_and_keep_their_annotations():
    import pickle
    import typing

    for m in (lf.Array.sum, lf.Array.reshape, lf.Array.__add__):
        assert pickle.loads(pickle.dumps(m)) is m
    assert typing.get_type_hints(lf.Array.reshape)["return"] is lf.Array


def test_a_value_changing_every_step_in_the_tapes_first_call_drops_the_tape(taping):
    # The tape's first call multiplies by a Python number that changes every step: no replay can start
    # (its first call never matches), yet every step hits the tape's plan. Those steps are misses, so the
    # tape is dropped after MAX_MISSES, and the divergence note says which call and what to do. The
    # entry may record again (another constant could stay), but a value that changes every step makes
    # it stop after MAX_MISSES tapes.
    st = lf.new_stream(taping, lanes=1)
    rng = np.random.default_rng(21)
    wn = rng.standard_normal((8, 8)) * 0.3
    w = lf.array(wn, stream=st)
    lf.eval(w)

    def step(xn, s, xp=lf):
        if xp is lf:
            x = lf.array(xn, stream=st)
            lf.eval(x)
            with lf.stream(st):
                y = lf.tanh((x * s) @ w).sum(axis=-1)
            lf.eval(y)
            return np.asarray(y)
        return np.tanh((xn * s) @ wn).sum(axis=-1)

    before = _stats()
    for k in range(4):  # (recorded at the second step, confirmed at the third)
        xn = rng.standard_normal((3, 8))
        np.testing.assert_allclose(step(xn, 0.5 + k), step(xn, 0.5 + k, np), rtol=1e-12, atol=1e-12)
    assert _delta(before)["tapes_recorded"] == 1 and lf.plan_cache_info()["tapes"] == 1
    before = _stats()
    for k in range(tape.MAX_MISSES):
        xn = rng.standard_normal((3, 8))
        np.testing.assert_allclose(step(xn, 7.0 + k), step(xn, 7.0 + k, np), rtol=1e-12, atol=1e-12)
    d = _delta(before)
    assert d["tape_misses"] == tape.MAX_MISSES and d["tape_replays"] == 0, d
    assert lf.plan_cache_info()["tapes"] == 0  # dropped
    why = lf.plan_cache_info()["tape_last_divergence"]
    assert why.startswith("call 1 of ") and "Array.__mul__" in why and "passed as an array" in why, why
    for k in range(8 * tape.MAX_MISSES):  # recorded again at most MAX_MISSES - 1 times, then never
        xn = rng.standard_normal((3, 8))
        np.testing.assert_allclose(step(xn, 20.0 + k), step(xn, 20.0 + k, np), rtol=1e-12, atol=1e-12)
    d = _delta(before)
    assert 1 <= d["tapes_recorded"] <= tape.MAX_MISSES - 1 and d["tape_replays"] == 0, d
    assert lf.plan_cache_info()["tapes"] == 0
    before = _stats()
    for k in range(3 * tape.MAX_MISSES):  # the entry no longer records
        xn = rng.standard_normal((3, 8))
        np.testing.assert_allclose(step(xn, 50.0 + k), step(xn, 50.0 + k, np), rtol=1e-12, atol=1e-12)
    assert _delta(before)["tapes_recorded"] == 0 and lf.plan_cache_info()["tapes"] == 0


def test_another_programs_steps_on_the_same_plan_do_not_drop_a_tape_for_good(taping):
    # P replays; Q runs the same graph (the same plan: Python numbers are plan parameters) with another
    # constant in the first call. Q's steps are misses of P's tape, which is dropped, but the entry
    # records again, and P replays again.
    st = lf.new_stream(taping, lanes=1)
    rng = np.random.default_rng(24)

    def run(s):
        xn = rng.standard_normal((4, 4))
        x = lf.array(xn, stream=st)
        lf.eval(x)
        with lf.stream(st):
            y = lf.tanh(x * s).sum(axis=-1)
        lf.eval(y)
        np.testing.assert_allclose(np.asarray(y), np.tanh(xn * s).sum(axis=-1), rtol=1e-12, atol=1e-12)

    for _ in range(6):
        run(2.0)
    for _ in range(tape.MAX_MISSES):
        run(3.0)
    before = _stats()
    for _ in range(10):
        run(2.0)
    assert _delta(before)["tape_replays"] >= 6, _delta(before)


def test_a_dropped_tape_is_not_kept_by_a_probe_of_a_thread_that_ended(taping):
    # A worker's step fails a tape's first-call probe and the worker ends before evaluating: turning
    # the tape off drops the tapes, and nothing keeps the worker's weights alive.
    ref = {}

    def worker():
        st = lf.new_stream(taping, lanes=1)
        rng = np.random.default_rng(25)
        w = lf.array(rng.standard_normal((16, 16)), stream=st)
        lf.eval(w)
        ref["w"] = weakref.ref(w._data)
        for _ in range(6):
            x = lf.array(rng.standard_normal((3, 16)), stream=st)
            lf.eval(x)
            with lf.stream(st):
                y = lf.tanh((x * 0.5) @ w).sum(axis=-1)
            lf.eval(y)
        assert lf.plan_cache_info()["tapes"] == 1
        with lf.stream(st):
            x * 2.0  # fails the probe; the thread ends before evaluating

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    keep = lf.plan_cache_info()["max_entries"]
    lf.set_plan_cache(tape=False)  # drops the tapes
    lf.set_plan_cache(max_entries=0)  # and every plan
    try:
        gc.collect()
        assert ref["w"]() is None
    finally:
        lf.set_plan_cache(max_entries=keep)


def test_a_step_that_only_starts_like_a_tape_is_not_its_miss(taping):
    # Two programs on one stream start with the same op, the second with another static value: its
    # failed probe is no miss of the first's tape (its evaluation hits its own plan), which keeps replaying.
    st = lf.new_stream(taping, lanes=1)
    rng = np.random.default_rng(22)

    def run(xn, s, extra):
        x = lf.array(xn, stream=st)
        lf.eval(x)
        with lf.stream(st):
            y = lf.tanh(x * s)
            y = (y + 1.0).sum() if extra else y.sum()
        lf.eval(y)
        return float(np.asarray(y))

    before = _stats()
    for _ in range(8):
        xn = rng.standard_normal((4, 4))
        assert run(xn, 2.0, False) == pytest.approx(np.tanh(xn * 2.0).sum(), rel=1e-12)
        assert run(xn, 3.0, True) == pytest.approx((np.tanh(xn * 3.0) + 1.0).sum(), rel=1e-12)
    d = _delta(before)
    assert d["tape_misses"] == 0 and d["tape_replays"] >= 4, d


def test_steps_evaluated_with_the_cache_bypassed_are_no_misses(taping):
    # A bench's uncached row (eval_cache.bypass()) runs the same step between the cached row's: the
    # replay it gets says nothing of the tape (no plan was looked for), so it is not a miss, and the
    # tape survives more than MAX_MISSES of them in a row.
    rng = np.random.default_rng(23)
    st, ws, wn = _replaying(rng, taping)
    before = _stats()
    for _ in range(tape.MAX_MISSES + 2):
        xn = rng.standard_normal((3, 8))
        with eval_cache.bypass():
            np.testing.assert_allclose(_step(st, xn, ws), _np_forward(xn, wn), rtol=1e-12, atol=1e-12)
    d = _delta(before)
    assert d["tape_misses"] == 0 and lf.plan_cache_info()["tapes"] == 1, d
    xn = rng.standard_normal((3, 8))
    np.testing.assert_allclose(_step(st, xn, ws), _np_forward(xn, wn), rtol=1e-12, atol=1e-12)
    assert _delta(before)["tape_replays"] == 1


@pytest.mark.parametrize("swapped", [False, True])
def test_the_eval_after_a_whole_replay_takes_the_graph_in_the_template_order(taping, swapped, monkeypatch):
    # Made in the graph's order (a chain), the replay's nodes are the graph as they are; made in
    # another order (two branches joined the other way round), they are put in the template's order.
    rng = np.random.default_rng(7)
    st = lf.new_stream(taping, lanes=1)
    an, bn = rng.standard_normal((4, 4)), rng.standard_normal((4, 4))
    a, b = lf.array(an, stream=st), lf.array(bn, stream=st)
    lf.eval(a, b)

    def step(x):
        with lf.stream(st):
            y = lf.tanh(x @ a)
            z = lf.exp(x * b)
            r = (z + y) if swapped else (y + z)
            return r.sum(axis=0), y, z
    from laneflow.ops import tape_replay
    found, shortcuts = tape_replay.Replayer.found, []
    def spy(self, roots):
        r = found(self, roots)
        shortcuts.append((r, self.made))
        return r
    monkeypatch.setattr(tape_replay.Replayer, "found", spy)
    before = _stats()
    for _ in range(7):
        xn = rng.standard_normal((4, 4))
        x = lf.array(xn, stream=st)
        lf.eval(x)
        got, y, z = step(x)
        lf.eval(got, y, z)
        yn, zn = np.tanh(xn @ an), np.exp(xn * bn)
        np.testing.assert_allclose(np.asarray(got), (yn + zn).sum(axis=0), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(y), yn, rtol=1e-12)
        np.testing.assert_allclose(np.asarray(z), zn, rtol=1e-12)
    d = _delta(before)
    assert d["tapes_recorded"] == 1 and d["tape_replays"] >= 3 and d["tape_misses"] == 0, d
    t, = [t for ts in tape.TAPES.values() for t in ts if t.stream is st]
    assert t.template is not None and t.in_order == (t.perm == list(range(len(t.perm))))
    assert t.in_order != swapped
    taken = [(r[1][0], made) for r, made in shortcuts if r is not None]
    assert len(taken) == d["tape_replays"]  # (each replay's eval took the shortcut)
    assert all((nodes is made) == (not swapped) for nodes, made in taken)  # (no copy when in order)


def test_a_weight_passed_as_a_proxy_is_replayed_as_the_array_it_stands_for(taping):
    # a weakref.proxy says its class is Array (the steps read __class__, as Python does) and gives its _data
    import weakref

    rng = np.random.default_rng(11)
    st = lf.new_stream(taping, lanes=1)
    wn = rng.standard_normal(4)
    w = lf.array(wn, stream=st)
    lf.eval(w)
    pw = weakref.proxy(w)
    before = _stats()
    for _ in range(8):
        xn = rng.standard_normal(4)
        x = lf.array(xn, stream=st)
        lf.eval(x)
        with lf.stream(st):
            y = x * 2.0 + pw
        np.testing.assert_allclose(np.asarray(y), xn * 2.0 + wn, rtol=1e-12)
    d = _delta(before)
    assert d["tape_replays"] >= 3 and d["tape_divergences"] == 0 and d["tape_misses"] == 0, d


def test_a_list_argument_emptied_during_its_checks_raises_as_python_does(taping):
    # A list [array, [1.0, 2.0], [3.0]]: while a static element is compared (tape_steps.same, Python), a GC
    # callback empties the list. Reading the next element then raises IndexError (never reads past the end).
    from laneflow.ops import tape_steps

    rng = np.random.default_rng(12)
    st = lf.new_stream(taping, lanes=1)
    arm = [None]

    def emptier(phase, info):
        f = sys._getframe()
        while arm[0] is not None and phase == "start" and f is not None:
            if f.f_code is tape_steps.same.__code__:
                arm[0].clear()
                arm[0] = None
            f = f.f_back

    gc.callbacks.append(emptier)
    threshold = gc.get_threshold()
    raised = []
    try:
        for i in range(8):
            x = lf.array(rng.standard_normal(4), stream=st)
            lf.eval(x)
            items = [None, [1.0, 2.0], [3.0]]
            with lf.stream(st):
                items[0] = x * 1.0
                if i == 7:
                    arm[0] = items
                    gc.set_threshold(1)
                try:
                    y = lf.concatenate(items, axis=0)
                except IndexError as e:
                    raised.append(e)
                    y = items and items[0]
                finally:
                    gc.set_threshold(*threshold)
            if i < 7:
                np.testing.assert_allclose(np.asarray(y), np.concatenate([np.asarray(x), [1.0, 2.0, 3.0]]))
    finally:
        gc.callbacks.remove(emptier)
    assert tape.STATS["tape_replays"] >= 1 and len(raised) == 1 and arm[0] is None
