"""What the plan cache's key (``eval_cache._walk``, one pass over the pending graph) must tell apart,
beyond ``test_plan_cache.py``'s changes: which leaf is which, and what was evaluated meanwhile."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf
from laneflow.graph import eval_cache, eval_templates


@pytest.fixture(autouse=True)
def fresh_cache():
    saved = (eval_cache.ENABLED, eval_cache.EXECUTOR_AFTER, eval_cache.MAX_ENTRIES, eval_cache.MAX_BYTES)
    eval_cache.clear()
    eval_cache.configure(enabled=True, executor_after=2)
    yield
    eval_cache.configure(*saved)
    eval_cache.clear()


def _hits_then(run, variant):
    """Run ``run(False)`` until it hits, then ``run(variant)``: the counters before and after."""
    for _ in range(4):
        run(False)
    before = lf.plan_cache_info()
    run(variant)
    return before, lf.plan_cache_info()


def test_one_leaf_used_twice_and_two_alike_leaves_are_different_graphs(rng):
    an, bn = rng.standard_normal((4, 4)), rng.standard_normal((4, 4))
    a, b = lf.array(an), lf.array(bn)
    lf.eval(a, b)
    got = {}

    def run(same: bool):
        y = (lf.tanh(a) * 2.0) @ (lf.exp(a if same else b) + 1.0)
        lf.eval(y)
        got[same] = np.asarray(y)

    before, after = _hits_then(run, True)
    assert after["hits"] == before["hits"], (before, after)
    np.testing.assert_allclose(got[True], (np.tanh(an) * 2.0) @ (np.exp(an) + 1.0), rtol=1e-12)
    np.testing.assert_allclose(got[False], (np.tanh(an) * 2.0) @ (np.exp(bn) + 1.0), rtol=1e-12)


def test_leaves_swapped_between_two_inputs_hit_and_bind_in_their_new_places(rng):
    an, bn = rng.standard_normal(8), rng.standard_normal(8)
    a, b = lf.array(an), lf.array(bn)
    lf.eval(a, b)
    before = lf.plan_cache_info()["hits"]
    for x, y, xn, yn in ((a, b, an, bn), (a, b, an, bn), (b, a, bn, an), (a, b, an, bn), (b, a, bn, an)):
        z = lf.exp(x) - lf.sin(y)
        lf.eval(z)
        np.testing.assert_allclose(np.asarray(z), np.exp(xn) - np.sin(yn), rtol=1e-12)
    assert lf.plan_cache_info()["hits"] - before == 3  # sighted, built, then hits


def test_an_intermediate_evaluated_meanwhile_is_a_leaf_and_misses(rng):
    xn = rng.standard_normal(8)
    x = lf.array(xn)
    lf.eval(x)

    def run(evaluate_first: bool):
        h = lf.exp(x) * 3.0
        if evaluate_first:
            lf.eval(h)
        y = lf.sin(h) + 1.0
        lf.eval(y)
        np.testing.assert_allclose(np.asarray(y), np.sin(np.exp(xn) * 3.0) + 1.0, rtol=1e-12)

    before, after = _hits_then(run, True)
    assert after["hits"] == before["hits"], (before, after)


def test_a_pending_consumer_outside_the_graph_makes_its_input_an_output(rng):
    xn = rng.standard_normal(8)
    x = lf.array(xn)
    lf.eval(x)
    later = []

    def run(consumer: bool):
        h = lf.exp(x) * 3.0
        if consumer:
            later.append(lf.cos(h))  # built, not evaluated: it needs h after this eval
        y = lf.sin(h)
        lf.eval(y)

    before, after = _hits_then(run, True)
    assert after["hits"] == before["hits"], (before, after)
    lf.eval(later[0])
    np.testing.assert_allclose(np.asarray(later[0]), np.cos(np.exp(xn) * 3.0), rtol=1e-12)


def test_the_same_leaves_wired_to_other_inputs_miss_and_compute_their_own_values(rng):
    an, bn = rng.standard_normal(8), rng.standard_normal(8)
    a, b = lf.array(an), lf.array(bn)
    lf.eval(a, b)
    got = {}

    def run(swapped: bool):
        y = lf.exp(a) - lf.sin(b) + ((b - a) if swapped else (a - b))
        lf.eval(y)
        got[swapped] = np.asarray(y)

    before, after = _hits_then(run, True)
    assert after["hits"] == before["hits"], (before, after)
    np.testing.assert_allclose(got[True], np.exp(an) - np.sin(bn) + (bn - an), rtol=1e-12)


def test_alike_intermediates_wired_crosswise_miss_and_compute_their_own_values(rng):
    # Same nodes, same user counts, only which of two alike nodes feeds which consumer differs.
    xn = rng.standard_normal(8)
    x = lf.array(xn)
    lf.eval(x)
    got = {}

    def run(crossed: bool):
        p, q = lf.exp(x), lf.exp(x) * 1.0
        a = p - lf.sin(q)
        b = (p - lf.sin(q)) if crossed else (q - lf.sin(p))
        y = a * b
        lf.eval(y)
        got[crossed] = np.asarray(y)

    before, after = _hits_then(run, True)
    assert after["hits"] == before["hits"], (before, after)
    e = np.exp(xn)
    np.testing.assert_allclose(got[True], (e - np.sin(e)) ** 2, rtol=1e-12)
    np.testing.assert_allclose(got[False], (e - np.sin(e)) * (e - np.sin(e)), rtol=1e-12)


def test_a_repeated_step_hits_through_its_template_without_a_walk(rng, monkeypatch):
    x = lf.array(rng.standard_normal(8))
    lf.eval(x)

    def step(s):
        return (lf.tanh(x * s) + 1.0).sum()

    for s in (0.5, 1.5, 2.5):  # sighted, built, first hit (which makes the template)
        lf.eval(step(s))
    walks = []
    real = eval_cache._walk
    monkeypatch.setattr(eval_cache, "_walk", lambda roots: walks.append(1) or real(roots))
    for s in (3.0, -1.0):
        y = step(s)
        lf.eval(y)
        np.testing.assert_allclose(np.asarray(y), (np.tanh(np.asarray(x) * s) + 1.0).sum(), rtol=1e-12)
    assert walks == []


def test_two_graphs_with_alike_roots_take_turns_and_each_gives_its_own_values(rng):
    xn = rng.standard_normal(8)
    x = lf.array(xn)
    lf.eval(x)
    for k in range(8):
        inner = lf.exp(x) if k % 2 else lf.sin(x)
        y = (inner * 2.0).sum()
        lf.eval(y)
        want = ((np.exp(xn) if k % 2 else np.sin(xn)) * 2.0).sum()
        np.testing.assert_allclose(np.asarray(y), want, rtol=1e-12)


def test_alternating_graphs_with_alike_roots_each_hit_through_their_own_template(rng, monkeypatch):
    """Two structures ending in the same primitive and shape, taking turns (bench gpt2's two models and
    two streams do): each finds its own template, with no walk, and gives its own values."""
    xn = rng.standard_normal(8)
    x = lf.array(xn)
    lf.eval(x)
    steps = {"exp": lambda s: (lf.exp(x) * s).sum(), "sin": lambda s: (lf.sin(x) * s + 1.0).sum(),
             "tanh": lambda s: (lf.tanh(x * s) * s).sum()}
    want = {"exp": lambda s: (np.exp(xn) * s).sum(), "sin": lambda s: (np.sin(xn) * s + 1.0).sum(),
            "tanh": lambda s: (np.tanh(xn * s) * s).sum()}
    for s in (0.5, 1.5, 2.5):  # each: sighted, built, first hit (which makes its template)
        for f in steps:
            lf.eval(steps[f](s))
    walks = []
    real = eval_cache._walk
    monkeypatch.setattr(eval_cache, "_walk", lambda roots: walks.append(1) or real(roots))
    for k in range(9):
        f, s = list(steps)[k % 3], 0.25 * k - 1.0
        y = steps[f](s)
        lf.eval(y)
        np.testing.assert_allclose(np.asarray(y), want[f](s), rtol=1e-12)
    assert walks == []


def test_an_evicted_plan_leaves_no_template_behind(rng):
    eval_cache.configure(max_entries=1)
    x = lf.array(rng.standard_normal(8))
    lf.eval(x)
    for f in ("exp",) * 3 + ("sin",) * 2:  # a template for exp; sin's plan evicts exp's
        lf.eval(lf.exp(x).sum() if f == "exp" else lf.sin(x).max())
    assert len(eval_cache._entries) == 1
    assert eval_templates.TEMPLATES == {}
