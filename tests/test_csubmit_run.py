"""``csubmit.run``: schedule.execute's loop in C. It submits plain nodes one by one through
``submit_one``, skips nodes a sibling produced already, and stops where Python must schedule: a group or
fused node, or a node the C path declines. The values are numpy's either way."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf
from laneflow.graph import csubmit, schedule
from laneflow.graph.node import ArrayData

C = csubmit.load()
needs_c = pytest.mark.skipif(C is None, reason=f"the C submit path is not built here ({csubmit.why_not()})")


@needs_c
def test_run_submits_plain_nodes_and_stops_where_python_must():
    st = lf.new_stream(lf.cpu, lanes=1)
    with lf.stream(st):
        x = lf.array(np.arange(4.0))
        lf.eval(x)
        a = x + 1.0
        b = a * 2.0
    done = ArrayData((4,), np.dtype("float64"), st, None)
    done.buffer = x._data.buffer  # (produced already: skipped)
    marker = object()  # (not a node: Python's)
    items = [a._data, done, b._data, marker, b._data]
    assert C.run(items, 0) == 3
    assert a._data.buffer is not None and b._data.buffer is not None
    assert C.run(items, 4) == 5  # (b is evaluated now: skipped)
    assert C.run(items, 5) == 5
    np.testing.assert_array_equal(np.asarray(b), (np.arange(4.0) + 1) * 2)
    for bad in [(items,), ((), 0), (items, -1), (items, "0")]:
        with pytest.raises((TypeError, ValueError)):
            C.run(*bad)


@needs_c
def test_a_node_the_c_path_declines_is_left_to_python():
    st = lf.new_stream(lf.cpu, lanes=2)  # (several lanes: submit_one declines every node)
    with lf.stream(st):
        x = lf.array(np.arange(4.0))
        lf.eval(x)
        a = x + 1.0
    assert C.run([a._data], 0) == 0 and a._data.buffer is None
    schedule.execute([a._data])  # (Python schedules it)
    np.testing.assert_array_equal(np.asarray(a), np.arange(4.0) + 1)


def test_execute_gives_the_same_values_with_and_without_the_c_loop():
    def program():
        x = lf.array(np.arange(12.0).reshape(3, 4))
        y = (x + 1.0) * (x - 2.0)
        z = y.reshape(4, 3) @ lf.ones((3, 2))
        return np.asarray(z.sum(axis=0) + 0.5)

    got = program()
    old = schedule.C_SUBMIT
    schedule.C_SUBMIT = False
    try:
        want = program()
    finally:
        schedule.C_SUBMIT = old
    v = np.arange(12.0).reshape(3, 4)
    ref = (((v + 1) * (v - 2)).reshape(4, 3) @ np.ones((3, 2))).sum(axis=0) + 0.5
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, ref)
