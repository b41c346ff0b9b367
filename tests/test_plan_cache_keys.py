"""What the plan cache's key (``eval_cache._walk``, one pass over the pending graph) must tell apart,
beyond ``test_plan_cache.py``'s changes: which leaf is which, and what was evaluated meanwhile."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf
from laneflow.graph import eval_cache


@pytest.fixture(autouse=True)
def fresh_cache():
    saved = (eval_cache.ENABLED, eval_cache.EXECUTOR_AFTER)
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
