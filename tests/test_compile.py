"""lf.compile: traced once per signature, replayed without rebuilding the graph, equal to eager."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import laneflow as lf
from test_fuzz import PROGRAMS, Pool, make_inputs, program, run_steps


def experts(x, ws):
    outs = [lf.tanh(x @ w) for w in ws]
    return lf.stack(outs).mean(axis=0), [o.max() for o in outs]


def test_compiled_equals_eager_and_traces_once(device, rng):
    with lf.stream(device):
        x = lf.array(rng.standard_normal((8, 16)))
        ws = [lf.array(rng.standard_normal((16, 16))) for _ in range(4)]
        calls = []

        def fn(x, ws):
            calls.append(1)
            return experts(x, ws)

        f = lf.compile(fn)
        eager = experts(x, ws)
        for _ in range(3):
            got = f(x, ws)
        assert len(calls) == 1 and f.cache_size == 1
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(eager[0]))
        for a, b in zip(got[1], eager[1]):
            assert a.item() == b.item()


def test_replay_submits_only_the_recorded_commands(device, rng, no_fusion):
    with lf.stream(device):
        f = lf.compile(lambda a, b: lf.exp(a) + lf.sin(b) * 2.0)
        a, b = lf.array(rng.standard_normal(32)), lf.array(rng.standard_normal(32))
        lf.eval(a, b)
        f(a, b)
        f(a, b)
        lf.reset_stats()
        out = f(a, b)
        lf.eval(out)
        # exp, sin, multiply, add: one command, which launches them as a CUDA graph on the GPU and
        # runs their four numpy kernels in turn on the CPU
        assert lf.stats()["commands"] == 1, (lf.stats(), f.stats())
        assert f.stats()[0]["steps"] == 4, f.stats()


def test_a_failed_call_does_not_poison_later_calls(device, rng):
    """The plan's memory regions are the same buffers every call: an error one call left in them
    must not be raised by the next good call."""
    with lf.stream(device):
        f = lf.compile(lambda x: lf.exp(x * 2.0) + 1.0)
        good = rng.standard_normal((3, 3))
        for _ in range(2):
            np.testing.assert_allclose(np.asarray(f(lf.array(good))), np.exp(good * 2.0) + 1.0, rtol=1e-12)
        bad = lf.linalg.inv(lf.array(np.ones((3, 3))))   # singular: an error at run time
        with pytest.raises(lf.LinAlgError):
            lf.eval(f(bad))
        for _ in range(2):
            np.testing.assert_allclose(np.asarray(f(lf.array(good))), np.exp(good * 2.0) + 1.0, rtol=1e-12)


def test_calling_on_a_closed_stream_is_refused(device, rng):
    s = lf.new_stream(device, lanes=2)
    f = lf.compile(lambda x: x + 1.0)
    with lf.stream(s):
        x = lf.array(rng.standard_normal(4))
        f(x)
        f(x)              # on the GPU: the CUDA graph
        s.close()         # while it is still the current stream
        with pytest.raises(lf.CompileError, match="closed"):
            f(x)


def test_new_signature_traces_again(device, rng):
    with lf.stream(device):
        f = lf.compile(lambda x, k: x * k)
        f(lf.array(rng.standard_normal(3)), 2.0)
        f(lf.array(rng.standard_normal(4)), 2.0)        # new shape
        f(lf.array(rng.standard_normal(4)).astype(lf.float32), 2.0)  # new dtype
        r = f(lf.array([1.0, 2.0]), 3.0)                # new static argument
        assert f.cache_size == 4 and r.tolist() == [3.0, 6.0]


def test_outputs_stay_valid_after_the_next_call(device, rng):
    with lf.stream(device):
        f = lf.compile(lambda x: x + 1.0)
        a, b = rng.standard_normal(5), rng.standard_normal(5)
        ra = f(lf.array(a))
        rb = f(lf.array(b))
        np.testing.assert_array_equal(np.asarray(ra), a + 1.0)
        np.testing.assert_array_equal(np.asarray(rb), b + 1.0)


def test_replay_outputs_are_whole_evaluated_values(device, rng):
    # _replay builds output values with __new__ and slot stores (jit.py): every slot of an
    # evaluated ArrayData must hold what ArrayData.__init__ would give it, and the array count its one Array
    from laneflow.graph.node import ArrayData

    with lf.stream(device):
        x = lf.array(rng.standard_normal((4, 3)).astype(np.float32))
        f = lf.compile(lambda x: (x * 2.0, lf.exp(x)))
        for _ in range(3):  # trace, then replays (a CUDA graph from the second call on the GPU)
            a, b = f(x)
        for out, want in ((a, np.asarray(x) * np.float32(2)), (b, np.exp(np.asarray(x)))):
            d = out._data
            for slot in ArrayData.__slots__:
                if slot != "__weakref__":
                    assert hasattr(d, slot), slot
            assert (d.prim, d.inputs, d.siblings, d.users, d.arrays) == (None, (), None, 0, 1)
            assert d.shape == (4, 3) and d.dtype == np.float32 and d.device == x._data.device
            assert d.buffer is not None
            np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6)


def test_captured_arrays_and_constants_are_computed_once_and_kept(device, rng):
    with lf.stream(device):
        wn = rng.standard_normal((4, 4))
        w = lf.array(wn) * 2.0     # lazy, captured by the closure

        @lf.compile
        def f(x):
            return x @ w + lf.array([1.0, 2.0, 3.0, 4.0])

        xn = rng.standard_normal((2, 4))
        f(lf.array(xn))
        r = f(lf.array(xn))
        np.testing.assert_allclose(np.asarray(r), xn @ (wn * 2.0) + [1, 2, 3, 4], rtol=1e-12)


def test_argument_returned_unchanged_and_nested_compile(device):
    with lf.stream(device):
        inner = lf.compile(lambda x: x * 2)
        f = lf.compile(lambda x, y: (x, inner(y) + 1))
        x, y = lf.array([1, 2]), lf.array([3, 4])
        a, b = f(x, y)
        assert a.tolist() == [1, 2] and b.tolist() == [7, 9]


def test_host_read_inside_a_compiled_function_is_refused_naming_it(device):
    with lf.stream(device):
        f = lf.compile(lambda x: x * x.sum().item())
        with pytest.raises(lf.CompileError, match="compile: <lambda> needs the value of argument 0"):
            f(lf.array([1.0, 2.0]))


def test_assigning_into_an_argument_is_refused(device):
    def g(x):
        x[0] = 1
        return x

    with lf.stream(device), pytest.raises(lf.CompileError, match="assigns into its argument 0"):
        lf.compile(g)(lf.array([5, 6]))


def test_compile_rejects_non_callables_and_unhashable_statics():
    with pytest.raises(TypeError, match="compile"):
        lf.compile(42)
    f = lf.compile(lambda x, opts: x)
    with pytest.raises(lf.CompileError, match="hashable"):
        f(lf.array([1]), {1, 2})  # a set is not hashable


def test_execution_error_in_a_replay_is_raised_at_eval(device):
    with lf.stream(device):
        f = lf.compile(lambda x, e: lf.power(x, e))
        f(lf.array([2, 3]), lf.array([1, 2]))
        bad = f(lf.array([2, 3]), lf.array([1, -1]))
        with pytest.raises(lf.ExecutionError, match="power"):
            lf.eval(bad)
        assert f(lf.array([2, 3]), lf.array([2, 2])).tolist() == [4, 9]


@settings(max_examples=max(50, PROGRAMS // 6), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(prog=program)
def test_fuzz_programs_compiled_equal_eager(device, prog):
    steps = [s for s in prog["steps"] if s[0] not in ("eval", "async_eval")]
    inputs = make_inputs(prog)
    streams = [lf.new_stream(device, lanes=k) for k in prog["streams"]]

    def body(*xs):
        pool = Pool([], streams)
        pool.lf = [lf.array(x) for x in xs]   # new Array objects: assignments rebind these, not the caller's
        pool.np = [np.array(x) for x in inputs]
        run_steps(pool, steps, prog["dtype"])
        return pool.lf

    compiled = lf.compile(body)
    args = [lf.array(x, stream=streams[0]) for x in inputs]
    eager = body(*args)
    lf.eval(eager)
    fresh = [lf.array(x, stream=streams[0]) for x in inputs]
    with lf.testing.inject_delays(0.0005, seed=prog["seed"]):
        first = compiled(*args)     # commands
        second = compiled(*args)    # on the GPU: a CUDA graph reading the arguments where they are
        third = compiled(*fresh)    # new argument buffers (staged); the earlier outputs are still alive
        lf.eval(first, second, third)
    for e, a, b, c in zip(eager, first, second, third):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))
        np.testing.assert_array_equal(np.asarray(b), np.asarray(e))
        np.testing.assert_array_equal(np.asarray(c), np.asarray(e))
    for s in streams:
        s.close()


def test_assigning_into_a_captured_array_is_refused(device):
    with lf.stream(device):
        state = lf.array([0, 0])

        def bump(x):
            state[0] = 1                      # a captured array: the change would happen once, at tracing
            return x + 1

        def accumulate(x):
            nonlocal state
            s = state
            s += x                            # the same, through an in-place operator
            return s

        with pytest.raises(lf.CompileError, match="assigns into an array it did not create"):
            lf.compile(bump)(lf.array([1, 2]))
        with pytest.raises(lf.CompileError, match="assigns into an array it did not create"):
            lf.compile(accumulate)(lf.array([1, 2]))
        assert state.tolist() == [0, 0]


def test_arrays_created_inside_the_function_may_be_assigned_into(device):
    with lf.stream(device):
        captured = lf.array([5.0, 6.0])

        @lf.compile
        def f(x):
            y = lf.array(captured)            # a new array object bound to the captured value
            y[0] = x[1]
            z = x * 2
            z += 1
            return y, z

        a, b = f(lf.array([1.0, 2.0]))
        assert a.tolist() == [2.0, 6.0] and b.tolist() == [3.0, 5.0]
        assert captured.tolist() == [5.0, 6.0]


def test_intermediates_live_in_a_static_arena_sized_by_liveness(rng, no_fusion):
    with lf.stream(lf.new_stream(lf.cpu, lanes=2)):
        def chain(x):
            for _ in range(20):
                x = lf.tanh(x) * 0.5
            return x

        f = lf.compile(chain)
        xn = rng.standard_normal(1000)
        r1 = f(lf.array(xn))
        r2 = f(lf.array(xn * 2))
        (plan,) = f._plans.values()
        # 39 intermediates of 8000 bytes, never two live at once along a chain: two regions suffice
        assert len(plan.memory.region_bytes) == 2 and plan.memory.arena_bytes == 2 * 8192
        ref1, ref2 = xn, xn * 2
        for _ in range(20):
            ref1, ref2 = np.tanh(ref1) * 0.5, np.tanh(ref2) * 0.5
        np.testing.assert_array_equal(np.asarray(r1), ref1)
        np.testing.assert_array_equal(np.asarray(r2), ref2)


def test_back_to_back_calls_reuse_the_arena_only_after_earlier_readers(rng):
    s = lf.new_stream(lf.cpu, lanes=4)
    with lf.stream(s), lf.testing.inject_delays(0.003, seed=11):
        def branches(x):
            parts = [lf.sin(x * (k + 1)) + lf.cos(x) for k in range(4)]
            return lf.stack(parts).sum(axis=0)

        f = lf.compile(branches)
        inputs = [rng.standard_normal(500) for _ in range(6)]
        outs = [f(lf.array(a)) for a in inputs]      # queued back to back, never waited for in between
        lf.eval(*outs)
    for a, o in zip(inputs, outs):
        ref = np.stack([np.sin(a * (k + 1)) + np.cos(a) for k in range(4)]).sum(axis=0)
        np.testing.assert_array_equal(np.asarray(o), ref)
    s.close()


def test_equal_devices_from_different_spellings_share_one_trace(rng):
    # lf.cpu and a device parsed from "cpu" are equal objects, not the same one: one signature
    s, s2 = lf.new_stream(lf.cpu, lanes=1), lf.new_stream("cpu", lanes=1)
    f = lf.compile(lambda x: x * 2.0)
    with lf.stream(s):
        a = lf.array(rng.standard_normal(4))
        b = lf.array(rng.standard_normal(4), stream=s2)
        np.testing.assert_array_equal(np.asarray(f(a)), np.asarray(a) * 2.0)
        np.testing.assert_array_equal(np.asarray(f(b)), np.asarray(b) * 2.0)
    assert f.cache_size == 1
    s.close(), s2.close()
