"""The plan cache of lf.eval (graph/eval_cache.py): a repeated graph replays its plan, and runs as the
backend's whole-plan executor (a CUDA graph; one command on the CPU) after a few hits. A change of
structure misses; a change of values hits and gives the new result; memory stays bounded."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf
from laneflow.graph import eval_cache
from conftest import random_array


@pytest.fixture(autouse=True)
def fresh_cache():
    """Each test starts with an empty cache and its default settings, and leaves them so."""
    with _Settings():
        yield


class _Settings:
    def __enter__(self):
        self.saved = (eval_cache.ENABLED, eval_cache.EXECUTOR_AFTER, eval_cache.MAX_ENTRIES, eval_cache.MAX_BYTES)
        eval_cache.clear()
        eval_cache.configure(enabled=True, executor_after=2)
        for k in eval_cache.STATS:
            eval_cache.STATS[k] = 0

    def __exit__(self, *exc):
        enabled, after, entries, nbytes = self.saved
        eval_cache.configure(enabled, after, entries, nbytes)
        eval_cache.clear()


def _step(x, w, s=0.5):
    h = lf.tanh(x @ w) * s + 1.0
    return h.sum(axis=-1), lf.exp(-h)


def _step_np(x, w, s=0.5):
    h = np.tanh(x.astype(np.float64) @ w) * s + 1.0
    return h.sum(axis=-1), np.exp(-h)


def _check(got, want, rtol=1e-5):
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=rtol, atol=rtol)


def test_a_repeated_step_hits_and_runs_as_the_backends_executor_with_new_values(device, rng):
    with lf.stream(device):
        for k in range(6):
            xn, wn = random_array(rng, (4, 8), np.float32), random_array(rng, (8, 8), np.float32)
            out = _step(lf.array(xn), lf.array(wn))
            lf.eval(*out)
            _check(out, _step_np(xn, wn))
    info = lf.plan_cache_info()
    # first sighting: eager; second: the plan is built; then four hits, the last two by the executor
    assert (info["sighted"], info["misses"], info["hits"]) == (1, 1, 4), info
    assert info["executor_runs"] == 2 and info["executors"] == 1, info


def test_a_changed_python_scalar_value_hits_and_gives_the_new_result(device, rng):
    xn, wn = random_array(rng, (4, 8), np.float32), random_array(rng, (8, 8), np.float32)
    with lf.stream(device):
        x, w = lf.array(xn), lf.array(wn)
        for s in (0.5, 0.25, 2.0, -1.0, 0.5, 3.0, 0.5):
            out = _step(x, w, s)
            lf.eval(*out)
            _check(out, _step_np(xn, wn, s))
    info = lf.plan_cache_info()
    assert info["misses"] == 1 and info["hits"] == 5, info


@pytest.mark.parametrize("change", ["shape", "dtype", "scalar type", "stream", "an array kept", "wiring"])
def test_a_changed_structure_misses(device, rng, change):
    xn, wn = random_array(rng, (4, 8), np.float32), random_array(rng, (8, 8), np.float32)
    other = lf.new_stream(device, lanes=1)

    def run(variant: bool):
        x, w = lf.array(xn), lf.array(wn)
        if variant and change == "shape":
            x = lf.array(xn[:3])
        if variant and change == "dtype":
            x = lf.array(xn.astype(np.float64))
        st = other if variant and change == "stream" else None
        with lf.stream(st or device):
            h = lf.tanh(x @ w)
            h = h * (2 if variant and change == "scalar type" else 2.0)
            if variant and change == "wiring":
                h = h + h
            else:
                h = h + lf.tanh(x @ w)
            if variant and change == "an array kept":  # an intermediate the caller holds: an output too
                keep = h + 1.0
                y = keep.sum()
            else:
                y = (h + 1.0).sum()
        lf.eval(y)
        return None

    for _ in range(3):
        run(False)
    before = lf.plan_cache_info()
    run(True)
    after = lf.plan_cache_info()
    assert after["hits"] == before["hits"], (change, before, after)
    assert after["sighted"] == before["sighted"] + 1, (change, before, after)
    other.close()


def test_a_donated_value_and_an_in_place_update_stay_values(device, rng):
    """x += 1 on a value nobody else sees writes in place eagerly; a cached plan writes fresh memory.
    Either way every array keeps its own value."""
    base = random_array(rng, (16,), np.float32)
    with lf.stream(device):
        x = lf.array(base)
        kept = []
        for k in range(6):
            x = x * 1.0 + 1.0
            kept.append(x[:])  # another Array bound to this value (x[0] = ... rebinds x alone)
            x[0] = float(k)
            lf.eval(x)
        want = base.copy()
        for k, a in enumerate(kept):
            want = want * 1.0 + 1.0
            np.testing.assert_allclose(np.asarray(a), want, rtol=1e-6)
            want[0] = k
        np.testing.assert_allclose(np.asarray(x), want, rtol=1e-6)


def test_an_intermediate_the_user_holds_is_evaluated_with_the_roots(device, rng):
    xn = random_array(rng, (32,), np.float32)
    with lf.stream(device):
        for _ in range(5):
            x = lf.array(xn)
            h = lf.exp(x) * 2.0   # held: the plan returns it too
            y = (h + 1.0).sum()
            lf.eval(y)
            assert h._data.buffer is not None
            np.testing.assert_allclose(np.asarray(h), np.exp(xn) * 2.0, rtol=1e-6)
            np.testing.assert_allclose(y.item(), (np.exp(xn.astype(np.float64)) * 2.0 + 1.0).sum(), rtol=1e-5)


def test_values_computed_once_by_a_plan_are_never_written_in_place(device):
    with lf.stream(device):
        outs = []
        for _ in range(4):
            y = lf.arange(8, dtype=lf.float32) * 2.0 + 1.0  # depends on no leaf: the plan keeps it
            y[0] = -1.0  # would overwrite the plan's copy if it were shared unprotected
            outs.append(np.asarray(y).copy())
        for o in outs:
            np.testing.assert_array_equal(o, np.r_[-1.0, np.arange(1, 8) * 2.0 + 1.0].astype(np.float32))


def test_several_threads_on_one_stream_hit_one_plan_with_their_own_scalars(device, rng):
    from conftest import run_threads

    s = lf.new_stream(device, lanes=3)
    base = random_array(rng, (64,), np.float32)
    out, errors = {}, []

    def work(k):
        try:
            for r in range(4):
                x = lf.array(base, stream=s)
                for _ in range(20):
                    x = lf.add(x, float(k + r), stream=s)
                out[k, r] = np.asarray(x)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    run_threads(work, 4)
    assert not errors, errors
    for (k, r), got in out.items():
        np.testing.assert_allclose(got, base + 20.0 * (k + r), rtol=1e-5)
    s.close()


def test_the_cache_stays_bounded_over_ten_thousand_distinct_graphs():
    eval_cache.configure(max_entries=32, max_bytes=1 << 20)
    x = lf.array(np.zeros((1, 4), np.float32), device=lf.cpu)
    with lf.stream(lf.cpu):
        for n in range(10_000):
            a = lf.zeros((1 + n % 40, 4), dtype=lf.float32) + x  # 40 structures, more than 32 entries
            lf.eval((a * 2.0).sum())
            if n % 2000 == 0:
                info = lf.plan_cache_info()
                assert info["entries"] <= 32 and info["pinned_bytes"] <= 1 << 20, info
    info = lf.plan_cache_info()
    assert info["entries"] <= 32 and info["pinned_bytes"] <= 1 << 20 and info["evicted"] > 0, info
    assert info["pinned_bytes"] == sum(e.bytes for e in eval_cache._entries.values()) >= 0, info
    assert len(eval_cache._seen) <= 4 * 32


def test_off_and_on_give_the_same_results_and_off_empties_it(device, rng):
    xn, wn = random_array(rng, (4, 8), np.float32), random_array(rng, (8, 8), np.float32)
    with lf.stream(device):
        def run():
            out = _step(lf.array(xn), lf.array(wn))
            lf.eval(*out)
            return out

        ref = [np.asarray(o) for o in run()]
        for _ in range(4):
            _check(run(), ref, 0)
        assert lf.plan_cache_info()["entries"] == 1 and lf.plan_cache_info()["hits"] == 3
        lf.set_plan_cache(False)
        assert lf.plan_cache_info()["entries"] == 0
        for _ in range(3):
            _check(run(), ref, 0)
        assert lf.plan_cache_info()["hits"] == 3


def test_bad_settings_raise_naming_the_function():
    with pytest.raises(ValueError, match="set_plan_cache: max_entries"):
        lf.set_plan_cache(max_entries=-1)


def test_pinned_bytes_stay_the_sum_of_the_entries_through_evictions(device, rng):
    """Every entry's bytes (its arena, its executors' outputs) are counted once when kept and once when
    evicted: with one entry kept, the count never drifts below zero or away from what is held."""
    eval_cache.configure(max_entries=1)
    try:
        x = lf.array(rng.standard_normal((64, 64)))
        lf.eval(x)
        for f in ("exp", "sin", "tanh", "cos") * 2:
            for _ in range(4):  # sighted, built, hits, executor
                y = getattr(lf, f)(x @ x) * 2.0 + x
                lf.eval(y)
            info = lf.plan_cache_info()
            assert info["pinned_bytes"] == sum(e.bytes for e in eval_cache._entries.values()) >= 0, info
    finally:
        eval_cache.configure(max_entries=256)
