"""Regressions found in review: value semantics (in-place writes nobody may observe), compile caching
and aliasing, DLPack, errors, and host threads racing an assignment, a close or a trace. Checked against numpy."""

from __future__ import annotations

import copy
import threading
import time

import numpy as np
import pytest

import laneflow as lf
from conftest import random_array
from opcheck import assert_same


class _Producer:
    """A foreign DLPack producer over a numpy array (stands in for torch, cupy...)."""

    def __init__(self, host: np.ndarray):
        self.host = host

    def __dlpack__(self, **kw):
        return self.host.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.host.__dlpack_device__()


# -- value semantics --------------------------------------------------------------------------

@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_a_copy_module_copy_is_an_independent_binding_of_the_value(device, rng, copier):
    xn = random_array(rng, (5,), lf.float64)
    with lf.stream(device):
        x = lf.array(xn)
        lf.eval(x)
        y = copier(x)
        del x                    # y still sees the value: it must not be reused in place
        z = y + 1.0
        lf.eval(z)
        assert_same(y, xn)
        assert_same(z, xn + 1.0)
        y[0] = 7.0               # y is its own Array object
    want = xn.copy()
    want[0] = 7.0
    assert_same(y, want)


def test_unary_plus_gives_a_new_array_that_later_assignments_do_not_change(device, rng):
    xn = random_array(rng, (4,), lf.float32)
    with lf.stream(device):
        x = lf.array(xn)
        y = +x                   # numpy: a new array
        x[0] = 5.0
    assert_same(y, xn)
    want = xn.copy()
    want[0] = 5.0
    assert_same(x, want)


def test_lf_array_of_a_dlpack_producer_copies_so_later_producer_writes_do_not_show(rng):
    host = rng.standard_normal(4)
    want = host.copy()
    a = lf.array(_Producer(host), device=lf.cpu)
    lazy = a * 2.0               # not run yet
    host[0] = 42.0               # the producer writes its memory afterwards
    assert_same(a, want)
    assert_same(lazy, want * 2.0)


def test_a_dlpack_export_cannot_be_written_through(rng):
    xn = rng.standard_normal(3)
    with lf.stream(lf.cpu):
        a = lf.array(xn)
        b = a + 0.0
        lf.eval(b)
        view = np.from_dlpack(b)
        if view.flags.writeable:     # a legacy consumer gets a private copy instead
            view[0] = 99.0
        assert_same(b, xn + 0.0)
        c = b * 1.0
        assert_same(c, xn)


# -- compile ----------------------------------------------------------------------------------

def test_compiled_output_returned_twice_gives_independent_values(device, rng):
    xn = random_array(rng, (4,), lf.float64)
    with lf.stream(device):
        f = lf.compile(lambda x: ((x * 2.0),) * 2 + (x * 2.0,))
        f(lf.array(xn))                                  # trace
        p, q, r = f(lf.array(xn))                        # replay: p and q are one traced value
        p[0] = 100.0                                     # may write in place: nobody else sees p's value
        lf.eval(p)
    want = xn * 2.0
    assert_same(q, want)
    assert_same(r, want)
    want_p = want.copy()
    want_p[0] = 100.0
    assert_same(p, want_p)


@pytest.mark.parametrize("xn,op,first,second", [
    (np.array([1, -2, 3]), "mul", 1, 1.0),
    (np.array([True, False]), "add", True, 1),
    (np.array([1.0, -2.0]), "div", 0.0, -0.0),
    (np.array([1, -2, 3]), "mul", 1, np.float32(1.0)),
], ids=["int-float", "bool-int", "zero-negzero", "int-npfloat32"])
def test_static_arguments_equal_in_python_but_of_another_type_or_sign_trace_again(device, xn, op, first, second):
    ops = {"mul": lambda a, b: a * b, "add": lambda a, b: a + b, "div": lambda a, b: a / b}
    with lf.stream(device):
        f = lf.compile(lambda x, s: ops[op](x, s))
        x = lf.array(xn)
        for s in (first, second):
            got = f(x, s)
            with np.errstate(divide="ignore"):
                want = ops[op](xn, s)
            assert got.dtype == want.dtype
            assert_same(got, want)


def test_nan_static_argument_does_not_trace_on_every_call(device):
    with lf.stream(device):
        f = lf.compile(lambda x, s: x + s)
        x = lf.array([1.0, 2.0])
        for _ in range(3):
            r = f(x, float("nan"))
        assert f.cache_size == 1
    assert np.isnan(np.asarray(r)).all()


def test_random_draw_without_a_key_inside_compile_is_refused(device):
    with lf.stream(device):
        f = lf.compile(lambda x: x + lf.random.uniform((3,)))
        with pytest.raises(lf.CompileError, match="random.uniform.*key="):
            f(lf.zeros(3, dtype=lf.float32))
        g = lf.compile(lambda x, k: x + lf.random.uniform((3,), key=k))
        x, k1, k2 = lf.zeros(3, dtype=lf.float32), lf.random.key(1), lf.random.key(2)
        assert_same(g(x, k1), np.asarray(lf.random.uniform((3,), key=k1)))
        assert_same(g(x, k2), np.asarray(lf.random.uniform((3,), key=k2)))


# -- host threads ---------------------------------------------------------------------------

def _in_another_thread_soon(fn, delay=0.1):
    errors = []

    def run():
        time.sleep(delay)
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, errors


def test_host_read_racing_an_assignment_on_another_thread_returns_the_value_it_started_with():
    s = lf.new_stream(lf.cpu, lanes=2)
    xn = np.arange(4.0)
    with lf.stream(s):
        y = lf.array(xn) + 1.0
        lf.eval(y)
        y = y * 3.0              # pending: its command is slow below

        def assign():
            y[0] = 100.0         # the old value has no other holder: tempted to write in place
            lf.eval(y)

        with lf.testing.inject_delays(fixed=0.4):
            t, errors = _in_another_thread_soon(assign)
            view = np.asarray(y)  # starts before the assignment, finishes after it
            t.join()
    assert not errors, errors
    np.testing.assert_array_equal(view, (xn + 1.0) * 3.0)
    want = (xn + 1.0) * 3.0
    want[0] = 100.0
    np.testing.assert_array_equal(np.asarray(y), want)
    s.close()


def test_eval_racing_an_assignment_on_another_thread_does_not_fail():
    s = lf.new_stream(lf.cpu, lanes=2)
    xn = np.arange(4.0)
    with lf.stream(s):
        y = lf.array(xn) + 1.0
        lf.eval(y)
        slow = lf.exp(lf.array(xn))

        def assign():
            y[0] = 100.0
            lf.eval(y)

        with lf.testing.inject_delays(fixed=0.4):
            t, errors = _in_another_thread_soon(assign)
            lf.eval(slow, y)     # waits for slow first; y is assigned meanwhile
            t.join()
    assert not errors, errors
    want = xn + 1.0
    want[0] = 100.0
    np.testing.assert_array_equal(np.asarray(y), want)
    np.testing.assert_array_equal(np.asarray(slow), np.exp(xn))
    s.close()


# -- errors -----------------------------------------------------------------------------------

def _frames(tb) -> int:
    n = 0
    while tb is not None:
        n, tb = n + 1, tb.tb_next
    return n


def test_raising_the_same_execution_error_again_does_not_grow_its_traceback(device):
    with lf.stream(device):
        bad = lf.take(lf.array([1, 2]), lf.array([5]))   # out of range: fails when it runs
        depths = []
        for _ in range(20):
            with pytest.raises(lf.ExecutionError, match="take") as info:
                lf.eval(bad)
            depths.append(_frames(info.value.__traceback__))
        assert depths[-1] == depths[0]                     # frames (and their locals) are not kept
        assert lf.take(lf.array([1, 2]), lf.array([1])).tolist() == [2]


def test_closing_a_stream_while_another_thread_encodes_onto_it_never_strands_a_command():
    from laneflow.runtime.encoder import GreedyPolicy
    from laneflow.runtime.stream import Stream
    from laneflow.defaults import backend_for

    closer: dict = {}

    class CloseWhileEncoding(GreedyPolicy):
        def choose(self, lanes, producers):
            if "thread" not in closer:  # another thread closes the stream in the middle of this encode
                t = closer["thread"] = threading.Thread(target=s.close)
                t.start()
                t.join(0.2)
            return super().choose(lanes, producers)

    s = Stream(lf.cpu, backend_for(lf.cpu), 2, CloseWhileEncoding())
    y = lf.add(lf.array(np.arange(3.0), stream=s), 1.0, stream=s)
    lf.eval(y, timeout=10)        # its command must not be queued behind the lanes' stop
    closer["thread"].join()
    np.testing.assert_array_equal(np.asarray(y), np.arange(3.0) + 1.0)
    with pytest.raises(ValueError, match="closed"):
        lf.add(y, 1.0, stream=s)


def test_tracing_while_another_thread_evaluates_a_captured_array():
    import sys

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)   # switch threads often: the two interleave inside tracing
    try:
        for _ in range(30):
            w = lf.array(np.ones(4), device=lf.cpu)
            for _ in range(30):
                w = w * 1.5            # a pending chain the compiled function captures
            f = lf.compile(lambda x: x + w)
            errors: list = []
            t = threading.Thread(target=lambda: lf.eval(w))
            t.start()
            try:
                r = f(lf.zeros(4, device=lf.cpu))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
            t.join()
            assert not errors, errors
            np.testing.assert_allclose(np.asarray(r), np.full(4, 1.5 ** 30), rtol=1e-12)
    finally:
        sys.setswitchinterval(old)
