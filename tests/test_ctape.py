"""The tape's node maker in C (ops/ctape.c): the nodes and arrays it makes are those the Python steps make,
field for field, with the inputs' user counts raised and no reference leaked; bad arguments raise and
change nothing; without it (no compiler, LANEFLOW_CTAPE=0) the steps make their nodes in Python and say
why. tests/test_tape.py runs every replay case both ways."""

from __future__ import annotations

import gc
import os
import sys

import numpy as np
import pytest

import laneflow as lf
from conftest import run_laneflow_script
from laneflow.array import Array
from laneflow.graph import eval_cache, tape
from laneflow.graph.node import ArrayData
from laneflow.ops import ctape, tape_steps
from laneflow.ops.primitives import Constant

MAKER = ctape.load()
needs_maker = pytest.mark.skipif(MAKER is None, reason=f"the tape's node maker is not built here ({ctape.why_not()})")

FIELDS = ArrayData.__slots__[:-1]  # (all but __weakref__)


def _leaf(st, shape=(2, 3)):
    d = ArrayData(shape, np.dtype("float32"), st, None)
    return d


@needs_maker
def test_a_node_made_in_c_is_the_node_python_makes():
    st = lf.new_stream(lf.cpu, lanes=1)
    a, b = _leaf(st), _leaf(st)
    a.users, b.users = 2, 0
    prim = Constant(np.zeros(3), "x")
    shape, dtype = (2, 3), np.dtype("float32")
    made = []
    r = MAKER.array(made, (shape, dtype, st, st.device, 1), prim, a, b, a)
    n = r._data
    assert type(r) is Array and type(n) is ArrayData and made == [n]
    ref = ArrayData(shape, dtype, st, prim, (a, b, a))  # (raises a's count twice more, b's once)
    ref.arrays = 1
    for f in FIELDS:
        got, want = getattr(n, f), getattr(ref, f)
        assert got == want and type(got) is type(want), f
    assert n.inputs[0] is a and n.inputs[1] is b and n.prim is prim and n.stream is st
    assert (a.users, b.users) == (2 + 2 + 2, 1 + 1)
    # a node without an array
    m = MAKER.node(made, ((4,), dtype, st, st.device, 0), prim)
    assert made == [n, m] and m.inputs == () and m.arrays == 0 and m.users == 0
    # the array lets its node's count go like any Array
    del r
    gc.collect()
    assert n.arrays == 0


@needs_maker
def test_every_ops_node_made_in_c_is_the_node_python_makes():
    """``ctape.fresh``, what ops/core.py's node calls: the node and its one array, as the Python lines
    make them (core._fresh None), and bad arguments raise and change nothing."""
    from laneflow.ops import core

    st = lf.new_stream(lf.cpu, lanes=1)
    a, b = _leaf(st), _leaf(st)
    a.users, b.users = 3, 0
    prim = Constant(np.zeros(3), "x")
    shape, dtype = (2, 3), np.dtype("float32")
    old = core._fresh[0]
    try:
        core._fresh[0] = None
        held = core.node(prim, [a, b, a], [2, 3], dtype, st)  # (lists: made tuples on the way)
        ref = held._data
        core._fresh[0] = MAKER.fresh
        got = core.node(prim, [a, b, a], [2, 3], dtype, st)
    finally:
        core._fresh[0] = old
    n = got._data
    assert type(got) is Array and type(n) is ArrayData
    for f in FIELDS:
        g, w = getattr(n, f), getattr(ref, f)
        assert g == w and type(g) is type(w), f
    assert n.inputs[0] is a and n.inputs[1] is b and n.prim is prim and n.stream is st and n.arrays == 1
    assert (a.users, b.users) == (3 + 2 + 2, 1 + 1)
    for args in [(prim, [a], shape, dtype, st), (prim, (a,), [2, 3], dtype, st), (prim, (a, "x"), shape, dtype, st),
                 (prim, (a,), shape, dtype), (prim, (a,), shape, dtype, object())]:
        with pytest.raises((TypeError, AttributeError)):
            MAKER.fresh(*args)
    assert (a.users, b.users) == (7, 2)
    del got, held
    gc.collect()
    assert n.arrays == 0 and ref.arrays == 0


@needs_maker
def test_making_and_dropping_nodes_leaks_no_reference():
    st = lf.new_stream(lf.cpu, lanes=1)
    a = _leaf(st)
    a.users = 0
    prim, shape = Constant(np.zeros(3), "x"), (2, 3)
    spec = (shape, np.dtype("float32"), st, st.device, 1)
    counts = lambda: [sys.getrefcount(x) for x in (a, prim, shape, st, spec)]  # noqa: E731
    before = counts()
    for _ in range(1000):
        made = []
        r = MAKER.array(made, spec, prim, a)
        MAKER.node(made, spec, prim, r._data, a)
        f = MAKER.fresh(prim, (a,), shape, spec[1], st)
        del r, made, f
    gc.collect()
    assert counts() == before
    assert a.users == 3000  # (counts stay raised: the nodes' inputs are not released by their death)


@needs_maker
def test_bad_arguments_raise_and_change_nothing():
    st = lf.new_stream(lf.cpu, lanes=1)
    a = _leaf(st)
    a.users = 5
    spec = ((2, 3), np.dtype("float32"), st, st.device, 1)
    made = []
    for args in [((), spec, None, a), (made, spec[:4], None, a), (made, list(spec), None, a),
                 (made, spec, None, a, "not a node"), (made, spec), (made, spec, None, object())]:
        with pytest.raises(TypeError):
            MAKER.array(*args)
    unset = ArrayData.__new__(ArrayData)  # (no user count yet)
    with pytest.raises(TypeError):
        MAKER.node(made, spec, None, a, unset)
    assert a.users == 5 and made == []


@needs_maker
def test_init_takes_only_types_with_the_slots():
    class NoSlots:
        pass

    class ReadOnly:
        __slots__ = ("_data",)
    with pytest.raises(TypeError, match="no slot shape"):
        MAKER.init(NoSlots, Array)
    with pytest.raises(TypeError, match="no slot _data"):
        MAKER.init(ArrayData, NoSlots)
    with pytest.raises(TypeError):
        MAKER.init(ArrayData, 3)
    with pytest.raises(TypeError, match="no slot shape"):  # (a built-in type: no crash on 3.12's NULL dict)
        MAKER.init(int, Array)

    class Half:  # the first slots, then not the rest: a failed init keeps the offsets it had
        __slots__ = ("shape", "dtype", "stream")

    class Borrowed:  # a descriptor of ArrayData's in another class's dict is not that class's slot
        pass
    Borrowed.shape = ArrayData.__dict__["shape"]
    for bad in (Half, Borrowed):
        with pytest.raises(TypeError):
            MAKER.init(bad, Array)
    st = lf.new_stream(lf.cpu, lanes=1)
    spec = ((2,), np.dtype("float32"), st, st.device, 0)
    n = MAKER.node([], spec, None)
    assert type(n) is ArrayData and n.shape == (2,) and n.dtype == np.dtype("float32") and n.users == 0
    assert n.stream is st and n.device is st.device and n.buffer is None
    MAKER.init(ArrayData, Array)  # (as loaded)


@needs_maker
def test_a_user_count_past_a_machine_word_is_raised_as_python_would():
    st = lf.new_stream(lf.cpu, lanes=1)
    a, b = _leaf(st), _leaf(st)
    a.users, b.users = sys.maxsize, 2 ** 70
    MAKER.node([], ((2, 3), np.dtype("float32"), st, st.device, 0), None, a, b)
    assert (a.users, b.users) == (sys.maxsize + 1, 2 ** 70 + 1)


@needs_maker
def test_the_compiled_steps_use_the_maker_and_give_numpy_values(monkeypatch):
    eval_cache.clear()
    lf.set_plan_cache(tape=True)
    st = lf.new_stream(lf.cpu, lanes=1)
    rng = np.random.default_rng(3)
    wn = rng.standard_normal((5, 5))
    w = lf.array(wn, stream=st)
    lf.eval(w)
    tape_steps._maker()  # (the maker in the steps' globals before a mode is forced)
    for mode in (True, False):
        eval_cache.clear()
        monkeypatch.setitem(tape_steps._GLOBALS, "C", mode)
        before = tape.STATS["tape_replays"]
        for _ in range(8):
            xn = rng.standard_normal((3, 5))
            x = lf.array(xn, stream=st)
            lf.eval(x)
            with lf.stream(st):
                y = lf.tanh(x @ w) * 2.0 + x
                z = y.sum(axis=1)
            lf.eval(y, z)
            np.testing.assert_allclose(np.asarray(y), np.tanh(xn @ wn) * 2.0 + xn, rtol=1e-12)
            np.testing.assert_allclose(np.asarray(z), (np.tanh(xn @ wn) * 2.0 + xn).sum(axis=1), rtol=1e-12)
        assert tape.STATS["tape_replays"] - before >= 2
        t, = [t for ts in tape.TAPES.values() for t in ts if t.stream is st]
        src = "".join(tape_steps.Steps.source(t, k) for k in range(len(t.calls)))
        assert ("MKA(" in src) == mode and ("NEW(AD)" in src) == (not mode)
    eval_cache.clear()


def _run(code: str, tmp_path, **env) -> str:
    return run_laneflow_script(code, tmp_path, unset=("LANEFLOW_CTAPE", "LANEFLOW_CSTEPS"), **env)


_WHY = """
from laneflow.ops import ctape
from laneflow import info
print(ctape.load() is None, ctape.why_not(), info.collect()["tape node maker"])
"""


def test_without_the_maker_the_steps_run_in_python_and_say_why(tmp_path):
    out = _run(_WHY, tmp_path, LANEFLOW_CTAPE="0")
    assert out.startswith("True LANEFLOW_CTAPE=0 Python (LANEFLOW_CTAPE=0)"), out
    out = _run(_WHY, tmp_path, CC="no-such-compiler-here")
    assert "True no C compiler (no-such-compiler-here)" in out, out
    out = _run(_WHY, tmp_path, CC="false")  # (a compiler that fails without a word: its exit status)
    assert "True building the tape's node maker failed: exit status 1" in out, out
    assert not (tmp_path / "kc").exists() or not [p for p in os.listdir(tmp_path / "kc") if p.startswith("ctape-")]


@needs_maker
def test_a_later_process_loads_the_maker_from_the_signed_cache(tmp_path):
    assert _run(_WHY, tmp_path).startswith("False None C"), "built"
    assert [p for p in os.listdir(tmp_path / "kc") if p.startswith("ctape-")]
    # a later process loads the cached build: its compiler is not called (laneflow loads the module at
    # import, for its op wrapper: the hook goes in before)
    boom = ("import subprocess\nrun = subprocess.run\n"
            "def boom(cmd, *a, **k):\n    assert 'ctape' not in str(cmd), 'built again'\n    return run(cmd, *a, **k)\n"
            "subprocess.run = boom\n")
    assert _run(boom + _WHY, tmp_path).startswith("False None C, steps in C")
    # (the hook sees a build: a process with another cache builds it)
    (tmp_path / "other").mkdir()
    assert _run(boom + _WHY, tmp_path / "other").startswith("True"), "the hook did not see the build"


@needs_maker
def test_same_counts_is_the_python_check_of_a_replays_nodes():
    st = lf.new_stream(lf.cpu, lanes=1)
    made = [_leaf(st) for _ in range(4)]
    for d, u, a in zip(made, (0, 2, 1, 0), (1, 0, 0, 3)):
        d.users, d.arrays = u, a

    def python(made, users, held):  # tape_replay.Replayer.found's check without the maker
        arrays = [d.arrays for d in made]
        return ([d.users for d in made] == users and arrays.count(0) == held.count(0)
                and all(arrays[k] for k, h in enumerate(held) if h))
    users, held = [0, 2, 1, 0], bytes([1, 0, 0, 1])
    assert MAKER.same_counts(made, users, held) and python(made, users, held)
    for u, h in [([0, 2, 2, 0], held), ([0, 2, 1], held), (users, bytes([1, 0, 1, 1])),
                 (users, bytes([0, 0, 0, 1])), (users, bytes([1, 0, 0]))]:
        assert not MAKER.same_counts(made, u, h), (u, h)
    assert not MAKER.same_counts(made[:3] + [object()], users, held)
    unset = ArrayData.__new__(ArrayData)
    assert not MAKER.same_counts(made[:3] + [unset], users, held)
    for bad in [(made, users), (tuple(made), users, held), (made, users, list(held))]:
        with pytest.raises(TypeError):
            MAKER.same_counts(*bad)


# -- the steps in C (ctape.step: a call's Plan interpreted) -----------------------------------------

needs_steps = pytest.mark.skipif(MAKER is None or os.environ.get("LANEFLOW_CSTEPS") == "0",
                                 reason="the steps are not in C here (no node maker, or LANEFLOW_CSTEPS=0)")


@pytest.fixture
def c_steps(monkeypatch):
    """The tape on, its steps in C, the plan cache empty before and after."""
    eval_cache.clear()
    tape.TAPES.clear()
    gc.collect()
    lf.set_plan_cache(tape=True)
    tape_steps._maker()
    monkeypatch.setitem(tape_steps._GLOBALS, "C", True)
    yield
    eval_cache.clear()


def _replayed(st, program, inputs, n=6):
    """Run ``program`` on fresh inputs ``n`` times on ``st``; the tape that replayed it."""
    for _ in range(n):
        xs = [lf.array(x(), stream=st) for x in inputs]
        lf.eval(*xs)
        with lf.stream(st):
            y = program(*xs)
        lf.eval(y)
    t, = [t for ts in tape.TAPES.values() for t in ts if t.stream is st]
    return t


@needs_steps
def test_the_steps_are_c_steps_and_a_call_too_big_for_one_is_a_python_step(c_steps):
    st = lf.new_stream(lf.cpu, lanes=1)
    rng = np.random.default_rng(5)
    w = lf.array(rng.standard_normal((4, 4)), stream=st)
    lf.eval(w)
    seen = {}

    def program(x):
        parts = [x[k:k + 1] * 1.0 for k in range(70)]  # 70 arrays in one call: more than a C step holds
        seen["y"] = lf.concatenate(parts, axis=0).reshape((70, 4)) @ w
        return seen["y"]

    before = dict(tape.STATS)
    t = _replayed(st, program, [lambda: rng.standard_normal((70, 4))], n=8)
    assert tape.STATS["tape_replays"] - before["tape_replays"] >= 3
    kinds = [type(f).__name__ for f in t.steps.funcs]
    big, = [k for k, c in enumerate(t.calls) if c.fn.__name__ == "concatenate"]
    assert kinds.count("Step") == len(kinds) - 1 and kinds[big] == "function", kinds[big - 2:]
    xn = rng.standard_normal((70, 4))
    x = lf.array(xn, stream=st)
    lf.eval(x)
    with lf.stream(st):
        y = program(x)
    np.testing.assert_allclose(np.asarray(y), xn @ np.asarray(w), rtol=1e-12)


@needs_steps
@pytest.mark.parametrize("change", ["none", "shape tuple", "slice", "zero sign", "numpy scalar", "keyword",
                                    "dtype", "stream"])
def test_each_kind_of_static_check_in_a_c_step_replays_or_leaves_the_tape(change, c_steps):
    st, other = lf.new_stream(lf.cpu, lanes=1), lf.new_stream(lf.cpu, lanes=1)
    rng = np.random.default_rng(6)

    def program(x, shape=(3, 8), sl=slice(1, None, 2), zero=0.0, scale=np.float64(2.0), axis=1,
                dtype=np.float32, where=None):
        with lf.stream(st):
            x = x * 1.0  # (the tape's first call, which only says whether a step is this tape's, stays)
        with lf.stream(where or st):
            y = (x.reshape(shape)[:, sl] + zero) * scale
            return lf.sum(y, axis=axis).astype(dtype)

    def numpy(x, shape=(3, 8), sl=slice(1, None, 2), zero=0.0, scale=np.float64(2.0), axis=1, dtype=np.float32,
              where=None):
        return ((x.reshape(shape)[:, sl] * 1.0 + zero) * scale).sum(axis=axis).astype(dtype)

    for _ in range(6):
        x = lf.array(rng.standard_normal((4, 6)), stream=st)
        lf.eval(x)
        lf.eval(program(x))
    t, = [t for ts in tape.TAPES.values() for t in ts if t.stream is st]
    assert {type(f).__name__ for f in t.steps.funcs} == {"Step"}
    kw = {"none": {}, "shape tuple": {"shape": (2, 12)}, "slice": {"sl": slice(0, None, 2)},
          "zero sign": {"zero": -0.0}, "numpy scalar": {"scale": np.float64(3.0)}, "keyword": {"axis": 0},
          "dtype": {"dtype": np.float64}, "stream": {"where": other}}[change]
    before = dict(tape.STATS)
    xn = rng.standard_normal((4, 6))
    x = lf.array(xn, stream=st)
    lf.eval(x)
    y = program(x, **kw)
    lf.eval(y)
    got = np.asarray(y)
    want = numpy(xn, **{k: v for k, v in kw.items() if k != "where"})
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    d = {k: tape.STATS[k] - before[k] for k in tape.STATS}
    if change == "none":
        assert d["tape_replays"] == 1 and d["tape_divergences"] == 0
    else:
        assert d["tape_replays"] == 0 and d["tape_divergences"] == 1, d


@needs_steps
def test_a_bad_step_spec_raises_and_a_dropped_tapes_steps_are_collected(c_steps):
    st = lf.new_stream(lf.cpu, lanes=1)
    rng = np.random.default_rng(7)
    t = _replayed(st, lambda x: lf.tanh(x) + 1.0, [lambda: rng.standard_normal(3)])
    rp = t.replayer
    first = t.steps.first
    assert type(first).__name__ == "Step"
    spec = tape_steps._cspec(tape_steps.plan(t.calls[0], t, set(), True))
    assert type(MAKER.step(rp, None, spec)).__name__ == "Step"
    with pytest.raises(TypeError):
        MAKER.step(object(), None, spec)
    with pytest.raises(TypeError):
        MAKER.step(rp, None, spec[:-1])
    bad_arrays = tuple((pos, sub, how, 5) if how == tape_steps.HERE else (pos, sub, 9, arg)
                       for pos, sub, how, arg in spec[6])
    node = spec[9][0]
    many_inputs = ((node[0], node[1], node[2], (0,) * 100, node[4]),) + spec[9][1:]
    for k, v in [(1, 40), (6, bad_arrays), (7, ((0, -1, (99, None)),)), (9, ((None, False, (), (7,), -1),)),
                 (9, many_inputs), (12, ()), (13, 5)]:
        with pytest.raises(ValueError):
            MAKER.step(rp, None, spec[:k] + (v,) + spec[k + 1:])
    with pytest.raises(TypeError):
        first(1, 2)
    # the steps hold the replayer, which holds the tape, which holds the steps: a cycle the GC collects
    del rp, first, t
    assert _c_steps() > 0
    eval_cache.clear()
    tape.TAPES.clear()
    gc.collect()
    assert _c_steps() == 0


def _c_steps() -> int:
    return sum(type(o).__name__ == "Step" and type(o).__module__ == "_laneflow_ctape" for o in gc.get_objects())


@needs_steps
def test_the_public_ops_are_c_wrappers_that_bind_call_and_raise_like_the_functions():
    assert type(lf.add).__name__ == type(lf.Array.__add__).__name__ == "taped"
    assert repr(lf.add) == repr(lf.add.__wrapped__) and lf.add.__name__ == "add"
    st = lf.new_stream(lf.cpu, lanes=1)
    xn = np.arange(6.0).reshape(2, 3)
    a = lf.array(xn, stream=st)
    for got, want in [(a + a, xn + xn), (lf.Array.__add__(a, 1.0), xn + 1.0), (a.sum(axis=0), xn.sum(axis=0)),
                      (lf.sum(a, axis=1, keepdims=True), xn.sum(axis=1, keepdims=True)), (2.0 * a, 2.0 * xn),
                      (a.T, xn.T), (a.reshape(3, 2), xn.reshape(3, 2))]:
        np.testing.assert_array_equal(np.asarray(got), want)
    bound = a.sum
    assert bound.__self__ is a and float(bound()) == xn.sum()
    with pytest.raises(ValueError, match="reshape"):
        a.reshape(4, 2)
    with pytest.raises(TypeError):
        lf.sum(a, no_such_keyword=1)


def test_with_csteps_off_the_python_wrapper_and_steps_replay(tmp_path):
    code = """
import numpy as np, laneflow as lf
from laneflow.graph import tape
st = lf.new_stream(lf.cpu, lanes=1)
rng = np.random.default_rng(0)
wn = rng.standard_normal((4, 4)); w = lf.array(wn, stream=st); lf.eval(w)
for _ in range(8):
    xn = rng.standard_normal((3, 4)); x = lf.array(xn, stream=st); lf.eval(x)
    with lf.stream(st):
        y = lf.tanh(x @ w).sum(axis=1)
    np.testing.assert_allclose(np.asarray(y), np.tanh(xn @ wn).sum(axis=1), rtol=1e-12)
t, = [t for ts in tape.TAPES.values() for t in ts if t.stream is st]
print(type(lf.tanh).__name__, {type(f).__name__ for f in t.steps.funcs}, tape.STATS["tape_replays"] >= 3)
"""
    out = _run(code, tmp_path, LANEFLOW_CSTEPS="0")
    assert out.split() == ["function", "{'function'}", "True"], out


@needs_maker
def test_an_arrays_finalizer_in_c_counts_its_value_down_and_ignores_an_unbound_array():
    assert type(Array.__del__).__name__ == "method_descriptor"  # (ops/ctape.py put the C one in)
    d = lf.array(np.arange(3.0))._data  # (the array died: nothing binds the value now)
    assert d.arrays == 0
    a, b = Array._wrap(d), Array._wrap(d)
    assert d.arrays == 2
    del a
    assert d.arrays == 1
    Array.__del__(b)  # (called by hand it counts once more, as the Python one does)
    assert d.arrays == 0
    unbound = object.__new__(Array)  # construction failed before _data was set: dies quietly
    del unbound
    gc.collect()


def test_native_keep_leaves_the_built_modules_where_a_profiler_finds_them(tmp_path):
    """LANEFLOW_NATIVE_KEEP=<dir> (native.py, for native profilers): the C modules load from files left in
    that directory, by their module names; without it no file is left."""
    if ctape.load() is None:
        pytest.skip(f"the tape's C module is not built here ({ctape.why_not()})")
    script = "import laneflow as lf\nfrom laneflow.ops import ctape\nprint(ctape.load().__file__)\n"
    keep = tmp_path / "keep"
    out = run_laneflow_script(script, tmp_path, LANEFLOW_NATIVE_KEEP=str(keep)).strip().splitlines()[-1]
    assert out.startswith(str(keep)) and os.path.exists(out) and "_laneflow_ctape" in os.path.basename(out)
    out = run_laneflow_script(script, tmp_path, unset=("LANEFLOW_NATIVE_KEEP",)).strip().splitlines()[-1]
    assert not os.path.exists(out)
