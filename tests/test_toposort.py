"""The scheduler's search (``schedule.toposort``): its C version (``graph/csubmit.c``) gives the Python
search's order, node for node, on random graphs; it declines (None) what it does not cover."""

from __future__ import annotations

import random

import numpy as np
import pytest

import laneflow as lf
from laneflow.graph import csubmit, schedule
from laneflow.graph.node import ArrayData, LazyData

C = csubmit.load()
needs_c = pytest.mark.skipif(C is None, reason=f"the C submit path is not built here ({csubmit.why_not()})")


def _python(roots):
    old = schedule._c_toposort[0]
    schedule._c_toposort[0] = None
    try:
        return schedule.toposort(roots)
    finally:
        schedule._c_toposort[0] = old


def _graph(rnd: random.Random, st, n: int):
    """n nodes over a few leaves: evaluated ones (a buffer), LazyData ones, pending ones with random
    inputs (repeats too); returns all nodes."""
    nodes: list = []
    for _ in range(rnd.randint(1, 4)):
        kind = rnd.random()
        if kind < 0.4:
            d = LazyData.__new__(LazyData)  # (never pending; not searched)
            d.users, d.shape, d.buffer = 0, (2,), object()
        else:
            d = ArrayData((2,), np.dtype("float32"), st, None)
            d.buffer = object() if kind < 0.8 else None  # (a pending node without inputs: a leaf op)
        nodes.append(d)
    for _ in range(n):
        ins = tuple(rnd.choice(nodes) for _ in range(rnd.randint(0, 3)))
        d = ArrayData((2,), np.dtype("float32"), st, None, ins)
        if rnd.random() < 0.1:
            d.buffer = object()  # evaluated already: its inputs are not searched
        nodes.append(d)
    return nodes


@needs_c
@pytest.mark.parametrize("seed", range(40))
def test_the_c_search_gives_the_python_order(seed):
    rnd = random.Random(seed)
    st = lf.new_stream(lf.cpu, lanes=1)
    nodes = _graph(rnd, st, rnd.randint(1, 60))
    roots = [rnd.choice(nodes) for _ in range(rnd.randint(1, 6))]  # (repeats and LazyData roots too)
    got = C.toposort(roots, LazyData)
    want = _python(roots)
    assert got is not None and len(got) == len(want)
    assert all(a is b for a, b in zip(got, want))
    assert schedule.toposort(roots) == want


@needs_c
def test_a_deep_chain_is_searched_without_recursion():
    st = lf.new_stream(lf.cpu, lanes=1)
    d = ArrayData((2,), np.dtype("float32"), st, None)
    d.buffer = object()
    chain = [d]
    for _ in range(20000):
        chain.append(ArrayData((2,), np.dtype("float32"), st, None, (chain[-1], chain[-1])))
    got = C.toposort([chain[-1]], LazyData)
    assert len(got) == 20000 and all(a is b for a, b in zip(got, chain[1:]))


@needs_c
def test_what_the_c_search_does_not_cover_goes_to_python():
    st = lf.new_stream(lf.cpu, lanes=1)
    d = ArrayData((2,), np.dtype("float32"), st, None)
    odd = ArrayData((2,), np.dtype("float32"), st, None, (d,))
    odd.inputs = [d]  # (a list: not a node the C search reads)
    assert C.toposort([odd], LazyData) is None
    stranger = ArrayData((2,), np.dtype("float32"), st, None)
    stranger.inputs = ("not a node",)
    assert C.toposort([stranger], LazyData) is None
    assert schedule.toposort([odd]) == [d, odd]  # (the Python search)
    with pytest.raises(TypeError):
        C.toposort([d], "not a type")


def test_a_real_graph_evaluates_the_same_through_either_search():
    x = lf.array(np.arange(6.0))
    y = (x + 1.0) * (x - 2.0)
    z = y.sum() + (y * y).sum()
    old = schedule._c_toposort[0]
    schedule._c_toposort[0] = None
    try:
        w = (x + 1.0) * (x - 2.0)
        ref = float((w.sum() + (w * w).sum()).item())
    finally:
        schedule._c_toposort[0] = old
    v = np.arange(6.0)
    want = ((v + 1) * (v - 2)).sum() + (((v + 1) * (v - 2)) ** 2).sum()
    assert float(z.item()) == ref == want


def _order(make):
    """The pending nodes of the arrays make() returns, inputs first."""
    return _python([a._data for a in make()])


PROGRAMS = {  # (name: arrays; the kinds among their pending nodes)
    "adds": (lambda x, m: [x + 1.0 + x], {"elementwise"}),
    "matmul": (lambda x, m: [(x @ m) + 1.0], {"matmul", "elementwise"}),
    "layout": (lambda x, m: [x.reshape(4, 2).T * 2.0], {"reshape", "transpose", "elementwise"}),
    "reduce": (lambda x, m: [lf.sum(x * x, axis=1), x[1:]], {"elementwise", "reduce", "getitem"}),
}


@needs_c
@pytest.mark.parametrize("name", PROGRAMS)
def test_kinds_names_the_kinds_of_the_pending_primitives(name, rng):
    f, want = PROGRAMS[name]
    x, m = lf.array(rng.standard_normal((2, 4)).astype(np.float32)), lf.array(np.eye(4, dtype=np.float32))
    lf.eval(x, m)
    order = _order(lambda: f(x, m))
    assert C.kinds(order) == want == {d.prim.kind for d in order}
    assert C.kinds(order + [object()]) is None  # (an item that is not a node: not known)
    assert C.kinds([]) == set()
    with pytest.raises(TypeError):
        C.kinds(tuple(order))


@needs_c
@pytest.mark.parametrize("name", PROGRAMS)
def test_passes_skipped_by_kind_give_the_items_of_every_pass(name, rng, monkeypatch):
    """A pass skipped because none of its kinds is there would have changed nothing: the items (kinds and
    members) match those of every pass run, and so do the values."""
    f, _ = PROGRAMS[name]
    xs = rng.standard_normal((2, 4)).astype(np.float32)
    x, m = lf.array(xs), lf.array(np.eye(4, dtype=np.float32) * 3)
    lf.eval(x, m)

    def items(on):
        monkeypatch.setattr(schedule, "_c_kinds", [schedule._UNSET if on else None])
        outs = f(x, m)
        order = _order(lambda: outs)
        got = schedule.passes(order)
        return [(type(i).__name__, getattr(i, "prim", None).__class__.__name__) for i in (got or order)], outs

    (a, outs_a), (b, outs_b) = items(True), items(False)
    assert a == b
    for p, q in zip(outs_a, outs_b):
        np.testing.assert_allclose(np.asarray(p), np.asarray(q), rtol=1e-6)
