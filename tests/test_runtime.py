"""Lanes really run at the same time; streams, threads, fences, errors and memory behave."""

from __future__ import annotations

import gc
import threading
import time
import tracemalloc

import numpy as np
import pytest

import laneflow as lf
from conftest import run_threads
from laneflow.runtime.fence import ThreadFence

pytestmark = pytest.mark.usefixtures("cpu_default_device")  # these tests are about CPU lanes


def _four_independent(x, s):
    return [lf.exp(x, stream=s), lf.sin(x, stream=s), lf.cos(x, stream=s), lf.tanh(x, stream=s)]


def _timed_eval(lanes, rng, delay=0.05):
    s = lf.new_stream(lf.cpu, lanes=lanes)
    x = lf.array(rng.standard_normal(16))
    lf.eval(x)
    with lf.testing.inject_delays(fixed=delay):
        outs = _four_independent(x, s)
        t0 = time.perf_counter()
        lf.eval(*outs)
        dt = time.perf_counter() - t0
    s.close()
    return dt


def test_four_independent_commands_on_four_lanes_overlap(rng):
    t4 = _timed_eval(4, rng)
    assert t4 < 2 * 0.05, f"4 lanes took {t4 * 1e3:.1f} ms for 4 x 50 ms commands"


def test_four_independent_commands_on_one_lane_run_one_after_another(rng):
    t1 = _timed_eval(1, rng)
    assert t1 >= 4 * 0.05 * 0.95, f"1 lane took {t1 * 1e3:.1f} ms"


def test_fence_timeline_wait_and_timeout():
    f = ThreadFence()
    assert f.wait(0) and not f.wait(1, timeout=0.01)
    threading.Timer(0.02, f.signal, args=(3,)).start()
    assert f.wait(2, timeout=2.0) and f.value == 3
    f.signal(1)  # never goes backwards
    assert f.value == 3


def test_stream_synchronize_waits_for_submitted_work(rng):
    s = lf.new_stream(lf.cpu, lanes=2)
    x = lf.array(rng.standard_normal(8))
    with lf.testing.inject_delays(fixed=0.03):
        y = lf.exp(x, stream=s)
        lf.async_eval(y)
        lf.synchronize(s)
    assert all(lane.fence.value == lane.submitted for lane in s.lanes)
    lf.synchronize()  # everything, no error
    s.close()


def test_stream_context_sets_the_default_for_this_thread_only(rng):
    s = lf.new_stream(lf.cpu, lanes=3)
    seen = {}

    def other():
        seen["other"] = lf.add(lf.array([1.0]), 1.0).stream

    with lf.stream(s):
        y = lf.array([1.0]) + 1
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert y.stream is s and seen["other"] is not s
    assert (lf.array([1.0]) + 1).stream is not s
    s.close()


def test_device_as_stream_argument_uses_the_default_stream():
    y = lf.add(lf.array([1, 2]), 1, stream=lf.cpu)
    assert y.stream is lf.default_stream(lf.cpu)


def test_host_threads_each_with_their_own_stream_get_correct_results(rng):
    inputs = [rng.standard_normal((32, 32)) for _ in range(4)]
    results, errors = {}, []

    def work(k):
        try:
            s = lf.new_stream(lf.cpu, lanes=2)
            with lf.stream(s):
                x = lf.array(inputs[k])
                acc = x
                for i in range(30):
                    acc = lf.tanh(acc @ x) + (x * i)
                    if i % 7 == 0:
                        acc[0] = acc[1]
                lf.eval(acc)
                results[k] = np.asarray(acc)
            s.close()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    with lf.testing.inject_delays(0.001, seed=1):
        run_threads(work, 4)
    assert not errors
    for k, x in enumerate(inputs):
        acc = x
        for i in range(30):
            acc = np.tanh(acc @ x) + (x * i)
            if i % 7 == 0:
                acc[0] = acc[1]
        np.testing.assert_array_equal(results[k], acc)


def test_one_stream_shared_by_several_threads_is_safe(rng):
    s = lf.new_stream(lf.cpu, lanes=3)
    base = rng.standard_normal(100)
    out, errors = {}, []

    def work(k):
        try:
            x = lf.array(base, stream=s)
            for _ in range(50):
                x = lf.add(x, k, stream=s)
            out[k] = np.asarray(x)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    run_threads(work, 4)
    assert not errors
    for k in range(4):
        expect = base.copy()
        for _ in range(50):
            expect = expect + k
        np.testing.assert_array_equal(out[k], expect)
    s.close()


def test_execution_error_is_raised_at_eval_naming_the_op_and_runtime_stays_usable():
    x = lf.array([2, 3, 4])
    bad = lf.power(x, lf.array([1, -1, 2]))   # integers to negative powers fail while running
    dependent = bad + 1
    with pytest.raises(lf.ExecutionError, match="power"):
        lf.eval(dependent)
    with pytest.raises(lf.ExecutionError, match="power"):
        np.asarray(bad)
    ok = lf.power(x, 2) + 1
    assert ok.tolist() == [5, 10, 17]


def test_async_eval_returns_before_the_work_is_done(rng):
    s = lf.new_stream(lf.cpu, lanes=1)
    x = lf.array(rng.standard_normal(4))
    with lf.testing.inject_delays(fixed=0.1):
        y = lf.exp(x, stream=s)
        t0 = time.perf_counter()
        lf.async_eval(y)
        assert time.perf_counter() - t0 < 0.05
        lf.eval(y)
    np.testing.assert_array_equal(np.asarray(y), np.exp(np.asarray(x)))
    s.close()


def test_evaluated_arrays_keep_only_their_buffer(rng):
    x = lf.array(rng.standard_normal(10))
    y = lf.exp(x) + 1
    lf.eval(y)
    assert y._data.prim is None and y._data.inputs == ()


def _loop(x, n):
    for i in range(n):
        x = x * 1.0001 + 0.5
        if i % 50 == 0:
            lf.eval(x)
    lf.eval(x)
    return x


def _live_graph_objects():
    from laneflow.graph.node import ArrayData
    from laneflow.runtime.buffer import Buffer

    gc.collect()
    return sum(isinstance(o, (ArrayData, Buffer)) for o in gc.get_objects())


def test_a_loop_of_100k_ops_does_not_grow_the_graph_or_memory():
    x = _loop(lf.zeros((256,), lf.float32) + 1.0, 1000)  # warm caches
    live = _live_graph_objects()
    x = _loop(x, 50_000)                                  # 10^5 ops
    assert _live_graph_objects() <= live + 8
    gc.collect()
    tracemalloc.start()
    x = _loop(x, 1000)
    gc.collect()
    base, _ = tracemalloc.get_traced_memory()
    x = _loop(x, 5000)
    gc.collect()
    end, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert end - base < 64 * 1024, f"memory grew by {end - base} bytes over 10^4 ops"


def test_a_deep_unevaluated_chain_evaluates_and_frees_without_recursion():
    x = lf.array([1.0])
    y = x
    for _ in range(20_000):
        y = y + 1.0
    assert y.item() == 20_001.0
    z = x
    for _ in range(20_000):
        z = z * 1.0
    del z  # dropping a deep pending graph must not overflow the C stack
    gc.collect()


def test_in_place_update_of_a_dead_value_reuses_its_buffer(rng):
    x = lf.array(rng.standard_normal(1000))
    lf.eval(x)
    buf = x._data.buffer
    x = x + 1.0            # the old value is dead: the add writes into its buffer
    lf.eval(x)
    assert x._data.buffer is buf


def test_in_place_update_never_touches_a_value_someone_can_still_see(rng):
    xn = rng.standard_normal(1000)
    x = lf.array(xn)
    lf.eval(x)
    keep = x
    x = x + 1.0
    lf.eval(x)
    assert x._data.buffer is not keep._data.buffer
    np.testing.assert_array_equal(np.asarray(keep), xn)


def test_slice_assignment_orders_after_earlier_readers_on_other_lanes(rng):
    s = lf.new_stream(lf.cpu, lanes=4)
    xn = rng.standard_normal((64, 64))
    with lf.stream(s), lf.testing.inject_delays(0.004, seed=5):
        for trial in range(10):
            x = lf.array(xn)
            lf.eval(x)
            readers = [lf.sum(x, axis=0), lf.exp(x), x @ x, lf.max(x)]
            lf.async_eval(*readers)
            x[3:9] = -7.0          # writes in place (no one else holds the old value)
            lf.eval(x, *readers)
            np.testing.assert_array_equal(np.asarray(readers[0]), xn.sum(axis=0))
            np.testing.assert_array_equal(np.asarray(readers[1]), np.exp(xn))
            np.testing.assert_array_equal(np.asarray(readers[2]), xn @ xn)
            expect = xn.copy()
            expect[3:9] = -7.0
            np.testing.assert_array_equal(np.asarray(x), expect)
    s.close()


def test_closed_stream_is_rejected():
    s = lf.new_stream(lf.cpu, lanes=1)
    s.close()
    with pytest.raises(ValueError, match="closed"):
        lf.add(lf.array([1]), 1, stream=s)


def test_a_failing_cross_lane_wait_fails_only_the_command_it_guarded(rng, monkeypatch):
    s1, s2 = lf.new_stream(lf.cpu, lanes=1), lf.new_stream(lf.cpu, lanes=1)
    x = lf.array(rng.standard_normal(4))
    a = lf.exp(x, stream=s1)
    lf.eval(a)
    producer = a._data.buffer.writer.lane

    def broken(seq, timeout=None):
        raise RuntimeError("device lost")

    monkeypatch.setattr(producer, "host_wait", broken)
    b = lf.sin(a, stream=s2)                   # waits on s1's lane: the wait fails
    with pytest.raises(lf.ExecutionError, match="device lost"):
        lf.eval(b)
    monkeypatch.undo()
    c = lf.cos(x, stream=s2)                   # the lane still works
    np.testing.assert_array_equal(np.asarray(c), np.cos(np.asarray(x)))
    s1.close(), s2.close()


def test_evaluating_a_long_graph_leaves_the_cyclic_gc_as_it_found_it():
    # schedule() pauses Python's cyclic GC over graphs of more than 64 nodes (graph/schedule.py)
    x = lf.array(np.ones(4, np.float32))
    lf.eval(x)
    assert gc.isenabled()
    y = x
    for _ in range(200):
        y = y + 1.0
    lf.eval(y)
    assert gc.isenabled() and y.tolist() == [201.0] * 4
    s = lf.new_stream(lf.cpu, lanes=2)
    with lf.stream(s):
        z = x * 2.0
        for _ in range(100):
            z = lf.exp(z) * 0.5
    s.close()
    with pytest.raises(lf.LaneflowError, match="closed"):  # raised while scheduling
        lf.eval(z)
    assert gc.isenabled()
    gc.disable()  # a program that turned the GC off keeps it off
    try:
        w = x
        for _ in range(200):
            w = w * 1.0
        lf.eval(w)
        assert not gc.isenabled()
    finally:
        gc.enable()
