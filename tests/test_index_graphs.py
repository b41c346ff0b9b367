"""Index ops stay inside compiled graphs: take, getitem and setitem with index arrays computed on the
device write a check slot a graph zeroes at every run (a per-launch copy reports the call's own
failure), and index arrays laneflow holds a host copy of are checked on the host when a call binds
them. So an embedding lookup no longer keeps a compiled function on commands."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf
import laneflow.graph.plan as plan_mod
from conftest import random_array


@pytest.fixture
def strict(monkeypatch):
    monkeypatch.setattr(plan_mod, "GRAPH_MODE", "strict")  # a plan that cannot be a graph raises


def _mode(device) -> str:
    return "cuda graph" if device.type == "gpu" else "one command"


def _embed(table, ids):
    return lf.take(table, ids, axis=0).sum(axis=-1)


def test_an_embedding_lookup_with_host_indices_runs_as_a_graph(device, rng, strict):
    tn = random_array(rng, (50, 8), np.float32)
    f = lf.compile(_embed)
    with lf.stream(device):
        table = lf.array(tn)
        for _ in range(4):
            idn = rng.integers(-50, 50, size=(3, 5))
            got = f(table, lf.array(idn))  # a host copy exists: checked when the call binds it
            np.testing.assert_allclose(np.asarray(got), tn[idn].sum(axis=-1), rtol=1e-5, atol=1e-5 * np.abs(tn).sum(axis=-1).max())
    (st,) = f.stats()
    assert st["mode"] == _mode(device), st


def test_a_bad_host_index_raises_like_eager_and_later_calls_are_good(device, rng, strict):
    tn = random_array(rng, (10, 4), np.float32)
    f = lf.compile(_embed)
    with lf.stream(device):
        table = lf.array(tn)
        for _ in range(2):
            lf.eval(f(table, lf.array(np.array([1, 2]))))
        with pytest.raises(lf.ExecutionError, match="index 10 is out of bounds"):
            lf.eval(f(table, lf.array(np.array([3, 10]))))
        got = f(table, lf.array(np.array([9, -10])))
        np.testing.assert_allclose(np.asarray(got), tn[[9, -10]].sum(axis=-1), rtol=1e-5, atol=1e-5 * np.abs(tn).sum(axis=-1).max())


def test_device_computed_indices_are_checked_per_call_inside_the_graph(device, rng, strict):
    tn = random_array(rng, (10, 4), np.float32)

    def step(table, base, k):
        ids = lf.arange(3, dtype=lf.int64) * k + base   # computed on the device: no host copy
        return lf.take(table, ids, axis=0) * 2.0, table[ids] + 1.0

    f = lf.compile(step)
    with lf.stream(device):
        table = lf.array(tn)
        outs = []
        for base in (0, 1, 2, 5, 1, 3):  # base 5: index 5 + 2 * 3 = 11 is out of range
            outs.append((base, f(table, lf.array(np.int64(base)) + 0, lf.array(np.int64(3)) + 0)))
        for base, (a, b) in outs:
            ids = np.arange(3) * 3 + base
            if base == 5:
                with pytest.raises(lf.ExecutionError, match="index 11 is out of bounds"):
                    lf.eval(a)
                with pytest.raises(lf.ExecutionError, match="index 11 is out of bounds"):
                    lf.eval(b)
            else:
                np.testing.assert_allclose(np.asarray(a), tn[ids] * 2.0, rtol=1e-6)
                np.testing.assert_allclose(np.asarray(b), tn[ids] + 1.0, rtol=1e-6)
    (st,) = f.stats()
    assert st["mode"] == _mode(device), st


def test_setitem_at_device_indices_inside_a_graph(device, rng, strict):
    xn = random_array(rng, (6, 3), np.float32)

    def step(x, i, v):
        y = x + 0.0
        y[i] = v
        return y

    f = lf.compile(step)
    with lf.stream(device):
        x = lf.array(xn)
        for k in range(4):
            i = lf.array(np.array([k, 5 - k])) * 1   # no host copy
            v = lf.array(np.full((2, 3), float(k), np.float32))
            want = xn.copy()
            want[[k, 5 - k]] = k
            np.testing.assert_array_equal(np.asarray(f(x, i, v)), want)
    (st,) = f.stats()
    assert st["mode"] == _mode(device), st


@pytest.mark.alone
def test_a_compiled_call_with_device_checks_does_not_wait_for_its_graph(device, rng, strict):
    """The per-launch copies of a graph's check slots run on the device (a kernel, eight slots a
    launch): a compiled call returns while its graph still waits behind other work, and a failure in
    the second copy launch's slots is still reported for its own call only."""
    if device.type != "gpu":
        pytest.skip("needs a GPU stream held back by a sleep kernel")
    import time

    from laneflow.backends.cuda.kernels.misc import gpu_sleep

    tn = random_array(rng, (10, 4), np.float32)

    def step(table, base):
        ids = lf.arange(3, dtype=lf.int64)   # computed on the device: every take gets a check slot
        return [lf.take(table, ids + (base if j == 9 else 0), axis=0) for j in range(10)]

    f = lf.compile(step)
    st = lf.new_stream(device, lanes=1)
    with lf.stream(st):
        table = lf.array(tn)
        for _ in range(3):  # trace, then capture a graph for each of the two output sets the calls below use
            kept = [f(table, lf.array(np.int64(0)) + 0) for _ in range(2)]
            lf.eval(*kept[0], *kept[1])
        del kept
        good, bad = lf.array(np.int64(1)) + 0, lf.array(np.int64(8)) + 0   # 8 + 2 = 10: out of range
        lf.eval(good, bad)
        st.synchronize()
        gpu_sleep(st.lanes[0], 1.0)
        t = time.perf_counter()
        failed, fine = f(table, bad), f(table, good)
        took = time.perf_counter() - t
        assert took < 0.5, f"two compiled calls took {took:.3f} s behind a 1 s sleep: a call waited for the device"
        with pytest.raises(lf.ExecutionError, match="index 10 is out of bounds"):
            lf.eval(failed[9])
        for j, got in enumerate(fine):
            np.testing.assert_allclose(np.asarray(got), tn[np.arange(3) + (1 if j == 9 else 0)], rtol=1e-6)
    (s,) = f.stats()
    assert s["mode"] == _mode(device), s
