"""``ctape.binary``: a binary elementwise op's common call (an array with an array of its shape or with
a Python float, either order, a signature seen before) made in one C call. It makes the node the Python
op makes, field for field, and declines (None, nothing done) everything else, which the Python op then
takes: broadcasting, numpy scalars, bools, ints over integer arrays, tracing, a stream it must look up."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf
from laneflow.graph.node import ArrayData
from laneflow.ops import core

C = core._binary[0]
needs_c = pytest.mark.skipif(C is None, reason="the tape's C module is not built here")
FIELDS = [f for f in ArrayData.__slots__ if f != "__weakref__"]


def _calls(fn):
    """fn() with the C call counted: (result, calls that made a node, calls declined)."""
    made, declined = [0], [0]

    def counted(state, a, b):
        r = C(state, a, b)
        (made if r is not None else declined)[0] += 1
        return r

    core._binary[0] = counted
    try:
        return fn(), made[0], declined[0]
    finally:
        core._binary[0] = C


def _python(fn):
    core._binary[0] = None
    try:
        return fn()
    finally:
        core._binary[0] = C


CASES = [  # (name, op, taken by C after a first call teaches the Python op the signature)
    ("array + array", lambda x, y: x + y, True),
    ("array * float", lambda x, y: x * 2.5, True),
    ("float - array", lambda x, y: 2.5 - x, True),
    ("array + int", lambda x, y: x + 3, True),
    ("int * array", lambda x, y: 3 * y, True),
    ("array / array", lambda x, y: lf.divide(x, y), True),
    ("broadcast", lambda x, y: x + y[:1], False),
    ("numpy scalar", lambda x, y: x + np.float32(2.0), False),
    ("bool", lambda x, y: x + True, False),
    ("zero", lambda x, y: x + 0.0, False),
    ("nan", lambda x, y: x * float("nan"), False),
    ("int array + int", lambda x, y: x.astype(lf.int32) + 1, None),  # (astype: a unary op first)
]


@needs_c
@pytest.mark.parametrize("name,f,taken", CASES, ids=[c[0] for c in CASES])
def test_the_c_call_makes_the_python_node_or_declines(name, f, taken, rng):
    xs = rng.standard_normal((3, 4)).astype(np.float32)
    ys = rng.standard_normal((3, 4)).astype(np.float32) + 3.0
    x, y = lf.array(xs), lf.array(ys)
    lf.eval(x, y)
    f(x, y)  # (the first two calls teach the Python op the signature, the scalar's primitive, the dtype)
    f(x, y)
    got, made, declined = _calls(lambda: f(x, y))
    want = _python(lambda: f(x, y))
    if taken is not None:
        assert (made, declined) == ((1, 0) if taken else (0, 1)), (made, declined)
    g, w = got._data, want._data
    if taken:  # (a declined call's Python op may make new inputs and primitives each time: values only)
        for k in FIELDS:
            if k == "inputs":
                assert len(g.inputs) == len(w.inputs) and all(a is b for a, b in zip(g.inputs, w.inputs)), k
            else:
                assert getattr(g, k) == getattr(w, k), k
        assert g.prim is w.prim and type(g) is type(w) and type(got) is type(want)
    with np.errstate(all="ignore"):
        ref = f(xs, ys) if name != "int array + int" else xs.astype(np.int32) + 1
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def _state(op):
    """The state tuple ``op``'s C call reads (a cell of the op's closure)."""
    fn = getattr(op, "__wrapped__", op)
    return fn.__closure__[fn.__code__.co_freevars.index("state")].cell_contents


@needs_c
def test_the_c_call_declines_while_tracing_or_watching_and_takes_a_blocks_stream():
    from laneflow.graph import speculate, tracer

    # On the CPU throughout: on a GPU machine the default device is the GPU, and a stream of another device
    # than the operands' declines (the GPU suite of 2026-12-06 failed here before the block)
    x = lf.array(np.arange(4.0), device=lf.cpu)
    lf.eval(x)
    state = _state(lf.add)
    with lf.stream(lf.cpu):
        x + x
        x + x
        assert C(state, x, x) is not None
        for flag in (tracer.ACTIVE, speculate.WATCH):  # (the Python op tells the tracer, or the plan cache)
            old = flag[0]
            flag[0] = 1
            try:
                assert C(state, x, x) is None
            finally:
                flag[0] = old
        assert C(state, x, x) is not None
    other = lf.new_stream(lf.cpu, lanes=2)
    with lf.stream(other):  # (the same device: taken, on the block's stream)
        r, made, _ = _calls(lambda: x + x)
    assert made == 1 and r._data.stream is other
    other.close()
    with pytest.raises(Exception):
        with lf.stream(other):
            x + x
    assert C(state, 1.0, 2.0) is None and C(state, x, "x") is None
    with pytest.raises(TypeError):
        C((1, 2), x, x)


@needs_c
def test_the_c_call_leaks_no_reference():
    import gc
    import sys

    x = lf.array(np.arange(4.0, dtype=np.float32))
    lf.eval(x)
    d = x._data
    for _ in range(3):
        x * 2.5, x + x
    state = _state(lf.multiply)
    counts = lambda: [sys.getrefcount(o) for o in (d, d.shape, d.dtype, d.stream, d.device, *state)]  # noqa: E731
    gc.collect()
    before = counts()
    for _ in range(1000):
        r = x * 2.5
        s = x + x
        del r, s
    gc.collect()
    assert counts() == before


@needs_c
def test_the_c_call_holds_its_operands_while_python_runs_and_passes_its_errors_on(monkeypatch):
    """A device's ``__eq__`` (an equal device that is another object) runs Python inside the C call: an
    operand rebound meanwhile (by another thread in real use) must not be freed under it, and an error
    raised there (a signal handler's, say) must reach the caller."""
    import weakref

    from laneflow.device import Device

    class Equal(Device):  # (devices are one object each; a subclass's is another object, equal to lf.cpu)
        __slots__ = ()

    s = lf.new_stream(Equal("cpu"), lanes=1)
    x = lf.array(np.arange(4.0, dtype=np.float32), device=lf.cpu)
    lf.eval(x)
    with lf.stream(s):
        x * 1.5, x * 1.5  # (the Python op learns the signature and the scalar)
        state = _state(lf.multiply)
        d = x._data
        assert d.device is not s.device and d.device == s.device
        eq, calls = Device.__eq__, []

        def rebinding_eq(self, other):
            if not calls:
                calls.append(1)
                x._data = lf.array(np.zeros(4, np.float32), stream=s)._data  # (x's old node loses its array)
            return eq(self, other)

        monkeypatch.setattr(Device, "__eq__", rebinding_eq)
        alive, users = weakref.ref(d), d.users
        del d
        y = C(state, x, 1.5)
        assert calls and y is not None
        n = y._data.inputs[0]
        assert n is alive() and n.users == users + 1  # (the node the call read, kept alive by it)
        np.testing.assert_array_equal(np.asarray(y), np.arange(4.0, dtype=np.float32) * 1.5)

        monkeypatch.setattr(Device, "__eq__", eq)
        z = lf.array(np.ones(4, np.float32), device=lf.cpu)  # (on the other, equal device again)
        lf.eval(z)
        z * 1.5  # (the first node after an evaluation is the plan cache's to watch: the Python op's)

        def raising_eq(self, other):
            raise KeyError("from __eq__")

        monkeypatch.setattr(Device, "__eq__", raising_eq)
        with pytest.raises(KeyError, match="from __eq__"):
            C(state, z, 1.5)


ARITHMETIC = ["add", "sub", "mul", "truediv", "floordiv", "mod"]


def _frames(fn):
    """fn() and the names of the Python functions it ran."""
    import sys

    names: list = []
    sys.setprofile(lambda frame, event, arg: names.append(frame.f_code.co_name) if event == "call" else None)
    try:
        r = fn()
    finally:
        sys.setprofile(None)
    return r, names


@needs_c
@pytest.mark.parametrize("name", ARITHMETIC)
@pytest.mark.parametrize("form", ["array op array", "array op float", "float op array"])
def test_an_operator_takes_the_c_call_with_no_python_frame_and_makes_the_same_node(name, form, rng):
    """``x + y`` (Array.__add__, a taped C wrapper) calls the op's C call itself (_array_methods.py's
    _shortcuts): no Python frame runs, and the node is the one the Python method makes."""
    import operator

    from laneflow._array_methods import OPERATORS

    assert name in OPERATORS
    f = getattr(operator, name)
    xs = rng.standard_normal((3, 4)).astype(np.float32)
    ys = rng.standard_normal((3, 4)).astype(np.float32) + 3.0
    x, y = lf.array(xs), lf.array(ys)
    lf.eval(x, y)
    call = {"array op array": lambda: f(x, y), "array op float": lambda: f(x, 2.5),
            "float op array": lambda: f(2.5, y)}[form]
    call(), call()  # (the Python op learns the signature and the scalar's primitive)
    got, names = _frames(call)
    want, py_names = _frames(lambda: _python(call))
    assert names == ["<lambda>"], names  # (the test's own lambda alone: the wrapper, then the C call)
    assert f"__{name}__" in py_names or f"__r{name}__" in py_names  # (the toggle off: the method runs)
    g, w = got._data, want._data
    for k in FIELDS:
        if k == "inputs":
            assert all(a is b for a, b in zip(g.inputs, w.inputs)) and len(g.inputs) == len(w.inputs)
        else:
            assert getattr(g, k) == getattr(w, k), k
    assert g.prim is w.prim and type(got) is type(want) is lf.Array
    with np.errstate(all="ignore"):
        ref = {"array op array": lambda: f(xs, ys), "array op float": lambda: f(xs, np.float32(2.5)),
               "float op array": lambda: f(np.float32(2.5), ys)}[form]()
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-6)


@needs_c
def test_an_operator_the_c_call_declines_runs_its_method():
    """What the C call declines (integer arrays with an int, broadcasting, a numpy scalar, a tape's
    recording) goes through the Python method as before, with the same result."""
    import operator

    xi = lf.array(np.arange(6, dtype=np.int32).reshape(2, 3))
    xf = lf.array(np.arange(6.0, dtype=np.float32).reshape(2, 3))
    lf.eval(xi, xf)
    for f, a, b, want in [(operator.and_, xi, 3, np.arange(6).reshape(2, 3) & 3),
                          (operator.add, xi, 1, np.arange(6).reshape(2, 3) + 1),
                          (operator.add, xf, xf[:1], np.arange(6.0).reshape(2, 3) + np.arange(3.0)),
                          (operator.mul, np.float32(2.0), xf, np.arange(6.0).reshape(2, 3) * 2)]:
        f(a, b)
        got, names = _frames(lambda: f(a, b))
        assert names, f  # (declined: the method ran)
        np.testing.assert_array_equal(np.asarray(got), want)
    with pytest.raises(TypeError):
        xf & 1  # (the method's error, as before)


@needs_c
def test_the_memo_of_the_small_caches_gives_what_the_dicts_give(rng):
    """ctape.c's memo of the scalar primitives and result dtypes (by the identity of the key's parts, 32
    slots): many signatures, values and positions in a random order meet in its slots; every call makes
    the node the Python op makes (its primitive, the same object; its dtype)."""
    import operator

    dts = [np.float32, np.float16, np.float64]
    xs = {dt: lf.array(rng.standard_normal(5).astype(dt)) for dt in dts}
    lf.eval(list(xs.values()))
    scalars = [1.5, 2.5, 0.75, -1.25, 7.0]  # (Python floats: what the C call takes over any float dtype)
    fns = [operator.add, operator.mul, operator.sub, operator.truediv]
    cases = [(f, dt, v, left) for f in fns for dt in dts for v in scalars for left in (True, False)]
    assert len(cases) > 32
    for f, dt, v, left in cases:  # (the Python op learns each signature and scalar)
        f(xs[dt], v) if left else f(v, xs[dt])
    order = rng.permutation(len(cases))
    pairs = []
    for k in list(order) * 2:
        f, dt, v, left = cases[k]
        call = (lambda: f(xs[dt], v)) if left else (lambda: f(v, xs[dt]))
        got, made, _ = _calls(call)
        want = _python(call)
        assert made == 1, (f, dt, v, left)
        assert got._data.prim is want._data.prim and got.dtype == want.dtype, (f, dt, v, left)
        pairs.append((got, want))
    lf.eval([a for p in pairs for a in p])  # (once: the first node after an evaluation is the plan cache's)
    for got, want in pairs:
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


_REINSTALL = r"""
import numpy as np
import laneflow as lf
from laneflow.device import Device
from laneflow.ops import core, ctape

mod = ctape.load()
real = lf.multiply._cstate
x = lf.array(np.arange(4.0, dtype=np.float32), device=lf.cpu)
lf.eval(x)
class Equal(Device):  # (an equal device that is another object: its __eq__ runs inside the C call)
    __slots__ = ()
y = lf.array(np.ones(4, np.float32), stream=lf.new_stream(Equal("cpu"), lanes=1))
lf.eval(y)
x * y, x * y  # (the signature learnt)
mod.taped_shortcut(lf.Array.__mul__, tuple(list(real)), False, core._binary)  # a copy the wrapper alone holds
eq = Device.__eq__
def reinstalling_eq(self, other):
    Device.__eq__ = eq
    mod.taped_shortcut(lf.Array.__mul__, real, False, core._binary)  # the copy's last reference goes
    for _ in range(100):
        tuple(range(6))  # (its memory reused)
    return eq(self, other)
Device.__eq__ = reinstalling_eq
r = x * y
print("survived", np.asarray(r).tolist())
"""


@needs_c
def test_an_operator_keeps_its_state_while_python_inside_replaces_it(tmp_path):
    """The operator's C call runs Python inside (a device's __eq__); the wrapper's state replaced meanwhile
    (ctape.taped_shortcut again) must stay alive for the call (a debug allocator makes a use after free crash)."""
    from conftest import run_laneflow_script

    out = run_laneflow_script(_REINSTALL, tmp_path, PYTHONMALLOC="debug")
    assert "survived [0.0, 1.0, 2.0, 3.0]" in out
