"""A whole plan's one command on an idle CPU lane runs on the thread that evaluates it (``HostCommand``,
``ThreadLane.run_deferred``): what that may and may not change."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import laneflow as lf
from laneflow.graph import eval_cache
from laneflow.runtime.buffer import Buffer
from laneflow.runtime.lane import CALLER, HostCommand, run_collected


@pytest.fixture(autouse=True)
def fresh_cache():
    saved = (eval_cache.ENABLED, eval_cache.EXECUTOR_AFTER)
    eval_cache.clear()
    eval_cache.configure(enabled=True, executor_after=0)
    yield
    eval_cache.configure(*saved)
    eval_cache.clear()


def _buf(n=4):
    return Buffer(lf.cpu, 8 * n, np.zeros(n))


def _runs_on(stream):
    """The thread ident of each run of the cached step's executor command on ``stream``."""
    threads = []
    lane = stream.lanes[0]
    orig = lane._run

    def spy(item):
        if item.inline:
            threads.append(threading.get_ident())
        orig(item)

    lane._run = spy
    return threads


def _step(x):
    return lf.tanh(x * 2.0 + 1.0).sum()


def _repeat(rng, evaluate) -> list:
    """Five evaluations of one step (cache hits from the third), each checked against numpy; returns
    the threads the lane's cached plan ran on."""
    s = lf.new_stream(lf.cpu, lanes=1)
    threads = _runs_on(s)
    with lf.stream(s):
        for _ in range(5):
            xn = rng.standard_normal(8)
            y = _step(lf.array(xn))
            evaluate(y)
            np.testing.assert_allclose(np.asarray(y), np.tanh(xn * 2.0 + 1.0).sum())
    s.close()
    return threads


def test_an_evaluated_cache_hit_runs_its_plan_on_the_evaluating_thread(rng):
    threads = _repeat(rng, lf.eval)
    assert threads and set(threads) == {threading.get_ident()}


def test_async_eval_of_a_cache_hit_stays_on_the_worker(rng):
    threads = _repeat(rng, lf.async_eval)
    assert threads and threading.get_ident() not in threads


def _deferred(stream, fn, reads, writes):
    """Submit a HostCommand the way lf.eval does (collected for this thread); returns the collection."""
    collected = CALLER.collect = []
    try:
        with lf.graph.schedule.LOCK:
            stream.encoder.submit(HostCommand("host", fn, reads, writes), stream.lanes[0])
    finally:
        CALLER.collect = None
    return collected


def test_a_later_command_queued_before_the_deferred_one_ran_runs_after_it():
    s = lf.new_stream(lf.cpu, lanes=1)
    a, b = _buf(), _buf()
    order = []
    collected = _deferred(s, lambda lane: (order.append("first"), a.data.fill(1.0)), [], [a])
    assert len(collected) == 1  # the lane was idle: left to this thread
    with lf.graph.schedule.LOCK:  # the next command on the lane hands the deferred one to the worker
        s.encoder.encode("second", lambda lane: (order.append("second"), np.copyto(b.data, a.data + 1)), [a], [b])
    s.synchronize()
    run_collected(collected)  # nothing left to run here
    assert order == ["first", "second"]
    np.testing.assert_array_equal(b.data, 2.0)
    s.close()


def test_a_command_submitted_while_the_deferred_one_runs_inline_waits_for_it():
    s = lf.new_stream(lf.cpu, lanes=2)
    a, b = _buf(), _buf()
    started, release = threading.Event(), threading.Event()

    def slow(lane):
        started.set()
        assert release.wait(10)
        a.data.fill(3.0)

    collected = _deferred(s, slow, [], [a])
    t = threading.Thread(target=run_collected, args=(collected,))
    t.start()
    assert started.wait(10)
    with lf.graph.schedule.LOCK:  # on the same lane, and on the other lane (a cross-lane wait)
        s.encoder.encode("same", lambda lane: np.copyto(b.data, a.data + 1), [a], [b], lane=s.lanes[0])
        c = _buf()
        s.encoder.encode("other", lambda lane: np.copyto(c.data, a.data * 2), [a], [c], lane=s.lanes[1])
    release.set()
    t.join(10)
    s.synchronize()
    np.testing.assert_array_equal(b.data, 4.0)
    np.testing.assert_array_equal(c.data, 6.0)
    assert s.lanes[0].fence.value == s.lanes[0].submitted
    s.close()


def test_a_host_wait_for_a_deferred_command_hands_it_to_the_worker():
    s = lf.new_stream(lf.cpu, lanes=1)
    a = _buf()
    collected = _deferred(s, lambda lane: a.data.fill(5.0), [], [a])
    lane = s.lanes[0]
    assert lane.host_wait(lane.submitted, timeout=10)  # would never finish if nobody ran it
    np.testing.assert_array_equal(a.data, 5.0)
    run_collected(collected)
    s.close()


def test_a_busy_lane_queues_the_command_instead():
    s = lf.new_stream(lf.cpu, lanes=1)
    a, b = _buf(), _buf()
    release = threading.Event()
    with lf.graph.schedule.LOCK:
        s.encoder.encode("busy", lambda lane: release.wait(10), [], [a])
    collected = _deferred(s, lambda lane: b.data.fill(1.0), [a], [b])
    assert collected == []
    release.set()
    s.synchronize()
    np.testing.assert_array_equal(b.data, 1.0)
    s.close()


def test_an_eval_with_a_timeout_leaves_the_plan_to_the_worker(rng):
    s = lf.new_stream(lf.cpu, lanes=1)
    threads = _runs_on(s)
    with lf.stream(s):
        for _ in range(5):
            y = _step(lf.array(rng.standard_normal(8)))
            lf.eval(y, timeout=30)
    assert threads and threading.get_ident() not in threads
    s.close()
