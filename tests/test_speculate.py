"""Speculative launch (``graph/speculate.py``): a repeated step's executor starts at its first op, and
its ``lf.eval`` takes the outputs only if it would have launched exactly the same. Every case checks
values against numpy; the counters say whether a guess was taken or dropped. CPU streams do not guess
in normal use; these tests let them (``speculate.DEVICES``), so the checks run on every machine."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf
from laneflow.graph import eval_cache, speculate


@pytest.fixture
def guessing(device, monkeypatch):
    monkeypatch.setattr(speculate, "DEVICES", frozenset({device.type}))
    monkeypatch.setattr(speculate, "ENABLED", True)
    eval_cache.clear()
    old = eval_cache.EXECUTOR_AFTER
    eval_cache.configure(executor_after=0)
    yield device
    eval_cache.configure(executor_after=old)
    eval_cache.clear()


def _forward(x, ws, xp, scale=0.5):
    """A residual stack: its first node reads the input x (the trigger), later ones the weights."""
    h = xp.tanh(x @ ws[0])
    for w in ws[1:]:
        h = h + scale * xp.tanh(h @ w)
    return h.sum(axis=-1)


def _setup(rng, device, layers=4):
    from conftest import stack_inputs

    return stack_inputs(rng, device, (3, 8), layers)


def _warmed(rng, device):
    """``_setup``, then the step four times: sighted, built, a hit, a hit that learns its trigger."""
    st, x, ws, xn, wn = _setup(rng, device)
    for _ in range(4):
        _run(st, x, ws)
    return st, x, ws, xn, wn


def _counts() -> tuple:
    s = speculate.STATS
    return s["speculated"], s["speculation_used"], s["speculation_wasted"]


def _run(st, x, ws, **kw):
    with lf.stream(st):
        y = _forward(x, ws, lf, **kw)
    lf.eval(y)
    return np.asarray(y)


def test_a_repeated_step_launches_at_its_first_op_and_its_eval_takes_the_outputs(guessing, rng):
    st, x, ws, xn, wn = _setup(rng, guessing)
    want = _forward(xn, wn, np)
    for _ in range(4):  # sighted, built, hit (learns to watch), hit (learns the trigger)
        np.testing.assert_allclose(_run(st, x, ws), want, rtol=1e-12, atol=1e-12)
    for _ in range(3):
        made, used, wasted = _counts()
        with lf.stream(st):
            h = lf.tanh(x @ ws[0])
            assert _counts()[0] == made + 1  # launched at the first node, before the rest is built
            for w in ws[1:]:
                h = h + 0.5 * lf.tanh(h @ w)
            y = h.sum(axis=-1)
            del h  # (a value the program still holds is an output of another plan)
        np.testing.assert_allclose(np.asarray(y), want, rtol=1e-12, atol=1e-12)
        assert _counts() == (made + 1, used + 1, wasted)


def test_a_step_reading_an_exported_buffer_is_not_guessed(guessing, rng):
    """A leaf whose memory another library may hold (exported: a host view, DLPack) can change outside
    laneflow's ordering, so no launch is made ahead of the evaluation; the step still computes right."""
    st, x, ws, xn, wn = _warmed(rng, guessing)
    made = _counts()[0]
    _run(st, x, ws)
    assert _counts()[0] == made + 1  # guessed while nothing is exported
    ws[2]._data.buffer.exported = True  # (as interop/dlpack.py's export marks it)
    made = _counts()[0]
    for _ in range(2):
        np.testing.assert_allclose(_run(st, x, ws), _forward(xn, wn, np), rtol=1e-12, atol=1e-12)
    assert _counts()[0] == made


def test_a_new_input_read_by_the_first_op_is_taken_too(guessing, rng):
    st, x, ws, xn, wn = _warmed(rng, guessing)
    for _ in range(3):
        xn2 = rng.standard_normal(xn.shape)
        x2 = lf.array(xn2, stream=st)
        lf.eval(x2)
        made, used, wasted = _counts()
        np.testing.assert_allclose(_run(st, x2, ws), _forward(xn2, wn, np), rtol=1e-12, atol=1e-12)
        assert _counts() == (made + 1, used + 1, wasted)


def test_another_weight_later_in_the_step_drops_the_guess_and_stops_after_a_few(guessing, rng):
    st, x, ws, xn, wn = _warmed(rng, guessing)
    made, used, wasted = _counts()
    for k in range(speculate.MAX_MISSES + 2):
        wn2 = [*wn[:2], rng.standard_normal((8, 8)) / 3, *wn[3:]]
        ws2 = [*ws[:2], lf.array(wn2[2], stream=st), *ws[3:]]
        lf.eval(ws2[2])
        np.testing.assert_allclose(_run(st, x, ws2), _forward(xn, wn2, np), rtol=1e-12, atol=1e-12)
    # each new weight: the guess (made with the last one) is dropped; after MAX_MISSES no more guesses
    assert _counts() == (made + speculate.MAX_MISSES, used, wasted + speculate.MAX_MISSES)
    np.testing.assert_allclose(_run(st, x, ws), _forward(xn, wn, np), rtol=1e-12, atol=1e-12)
    assert _counts()[0] == made + speculate.MAX_MISSES


def test_another_scalar_value_drops_the_guess(guessing, rng):
    st, x, ws, xn, wn = _warmed(rng, guessing)
    made, used, wasted = _counts()
    np.testing.assert_allclose(_run(st, x, ws, scale=0.25), _forward(xn, wn, np, scale=0.25), rtol=1e-12, atol=1e-12)
    assert _counts()[1:] == (used, wasted + 1)
    np.testing.assert_allclose(_run(st, x, ws), _forward(xn, wn, np), rtol=1e-12, atol=1e-12)


def test_a_weight_rewritten_in_place_after_the_launch_drops_the_guess(guessing, rng):
    st, x, ws, xn, wn = _warmed(rng, guessing)
    made, used, wasted = _counts()
    with lf.stream(st):
        h = lf.tanh(x @ ws[0])  # launches, reading every weight as it is now
        assert _counts()[0] == made + 1
        # rebinding drops the old value, so the product may be written into its buffer in place
        ws[2] = ws[2] * 2.0
        lf.eval(ws[2])
        for w in ws[1:]:
            h = h + 0.5 * lf.tanh(h @ w)
        y = h.sum(axis=-1)
        del h
    wn[2] = wn[2] * 2.0
    np.testing.assert_allclose(np.asarray(y), _forward(xn, wn, np), rtol=1e-12, atol=1e-12)
    assert _counts()[1] == used  # whatever buffer the new weight has, the guess read the old value


def test_a_guess_left_by_another_program_is_taken_only_while_its_leaves_are_unchanged(guessing, rng):
    st, x, ws, xn, wn = _warmed(rng, guessing)
    made, used, wasted = _counts()
    with lf.stream(st):
        h = lf.tanh(x @ ws[0])
        y = (h @ ws[1]).max(axis=0)  # the same first op, then another program
    an = np.tanh(xn @ wn[0])
    np.testing.assert_allclose(np.asarray(y), (an @ wn[1]).max(axis=0), rtol=1e-12, atol=1e-12)
    assert _counts()[:2] == (made + 1, used)
    # the guess waits; the plan's next evaluation, on the same leaves, takes it (nothing wrote them)
    np.testing.assert_allclose(_run(st, x, ws), _forward(xn, wn, np), rtol=1e-12, atol=1e-12)
    assert _counts() == (made + 1, used + 1, wasted)
    # a guess that waits while its input is rewritten in place is dropped
    with lf.stream(st):
        h = lf.tanh(x @ ws[0])
        del h
    assert _counts()[0] == made + 2
    x = x + 1.0  # the old x dies: the add may write into its buffer
    lf.eval(x)
    xn = xn + 1.0
    np.testing.assert_allclose(_run(st, x, ws), _forward(xn, wn, np), rtol=1e-12, atol=1e-12)
    assert _counts()[1:] == (used + 1, wasted + 1)


def test_two_steps_built_at_once_each_get_their_own_values(guessing, rng):
    st, x, ws, xn, wn = _warmed(rng, guessing)
    xn2 = rng.standard_normal(xn.shape)
    x2 = lf.array(xn2, stream=st)
    lf.eval(x2)
    with lf.stream(st):
        a = _forward(x, ws, lf)  # launches a guess for x
        b = _forward(x2, ws, lf)
    lf.eval(b)  # b's graph hits the plan with x2: the guess (for x) is not its
    lf.eval(a)
    np.testing.assert_allclose(np.asarray(a), _forward(xn, wn, np), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(b), _forward(xn2, wn, np), rtol=1e-12, atol=1e-12)


def test_a_step_that_donates_never_guesses(guessing, rng):
    st, x, ws, xn, wn = _setup(rng, guessing)
    f = lf.compile(lambda c, v: c + v, donate_argnums=0)
    c = lf.zeros((3, 8), stream=st)
    for _ in range(6):
        with lf.stream(st):
            c = f(c, x)
    np.testing.assert_allclose(np.asarray(c), 6 * xn, rtol=1e-12)


def test_turning_it_off_stops_every_guess(guessing, rng):
    st, x, ws, xn, wn = _warmed(rng, guessing)
    try:
        lf.set_plan_cache(speculate=False)
        assert lf.plan_cache_info()["speculate"] is False
        made = _counts()[0]
        for _ in range(3):
            np.testing.assert_allclose(_run(st, x, ws), _forward(xn, wn, np), rtol=1e-12, atol=1e-12)
        assert _counts()[0] == made
    finally:
        lf.set_plan_cache(speculate=True)


def test_an_unhashable_primitive_is_passed_over(guessing):
    class Odd:
        __hash__ = None

    class D:
        prim = Odd()

    speculate.first_node(D())  # no error: nothing can be armed for it
    assert speculate.WATCH[0] is False


def test_a_weight_rewritten_in_place_between_steps_is_never_read_stale(guessing, rng):
    """The last hit's values, which a guess may run on, can die and have their buffers written in
    place before the next step (same buffer, and a layout copy a CPU plan keeps by value): the guess
    must be dropped. Found by review: a transposed weight, doubled in place between steps."""
    st = lf.new_stream(guessing, lanes=1)
    xn, w0n, w1n = rng.standard_normal((3, 8)), rng.standard_normal((8, 8)) / 3, rng.standard_normal((8, 8)) / 3
    x, w0, w1 = (lf.array(a, stream=st) for a in (xn, w0n, w1n))
    lf.eval(x, w0, w1)

    def fwd(x, w0, w1, xp):
        return (xp.tanh(x @ w0) @ w1.T).sum(axis=-1)  # w1.T: a layout step of a leaf

    def run():
        with lf.stream(st):
            y = fwd(x, w0, w1, lf)
        return np.asarray(y)

    for _ in range(5):
        np.testing.assert_allclose(run(), fwd(xn, w0n, w1n, np), rtol=1e-12)
    for _ in range(3):
        w1 = w1 * 2.0  # the old w1 dies: the product may be written into its buffer
        lf.eval(w1)
        w1n = w1n * 2.0
        np.testing.assert_allclose(run(), fwd(xn, w0n, w1n, np), rtol=1e-12)
        np.testing.assert_allclose(run(), fwd(xn, w0n, w1n, np), rtol=1e-12)


def test_turned_off_and_on_again_it_learns_again(guessing, rng):
    st, x, ws, xn, wn = _warmed(rng, guessing)
    lf.set_plan_cache(speculate=False)
    _run(st, x, ws)
    lf.set_plan_cache(speculate=True)
    made = _counts()[0]
    for _ in range(4):  # a hit that watches, one that learns, then guesses
        np.testing.assert_allclose(_run(st, x, ws), _forward(xn, wn, np), rtol=1e-12, atol=1e-12)
    assert _counts()[0] > made


_STALE_SCALARS = r'''
import gc, sys
sys.path.insert(0, sys.argv[1])
import fake_cuda
fake_cuda.install()
import numpy as np
import laneflow as lf
from laneflow.graph import eval_cache, speculate
from laneflow.backends.cuda.cudagraph import capture as cap

seen = []
real = cap.capture
def spy(g, o):
    seen.append([s.value for st in g.steps for s in st.prim.scalars()])
    return real(g, o)
cap.capture = spy
eval_cache.configure(executor_after=0)
st = lf.new_stream(lf.gpu, lanes=1)
x = lf.array(np.ones((3, 8), np.float32), stream=st)
ws = [lf.array(np.full((8, 8), 0.1, np.float32), stream=st) for _ in range(3)]
lf.eval(x, *ws)

def step(scale):
    with lf.stream(st):
        h = lf.tanh(x @ ws[0])
        for w in ws[1:]:
            h = h + scale * lf.tanh(h @ w)
        y = h.sum(axis=-1)
        del h
    lf.eval(y)
    return y

for _ in range(5):
    step(0.5); gc.collect()
keep = step(0.5)          # an output of one output set stays alive
junk = x + 1.0            # (the first node after that eval is not the trigger)
step(0.25); gc.collect()  # other scalar values: commands, which set the plan's Scalars to 0.25
n = len(seen)
y = step(0.5)             # the guess needs a new output set: a capture, which must see 0.5
assert speculate.STATS["speculated"] >= 1, speculate.STATS
assert seen[n:] and all(0.25 not in v for v in seen[n:]), seen[n:]
print("ok")
'''


def test_a_guess_that_captures_a_graph_holds_the_executors_scalar_values(tmp_path):
    """Found by review: a hit with other scalar values runs as commands but leaves its values in the
    plan's Scalars; a guess that then captured a new output set's graph baked them in."""
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed (pip install -e '.[dev]')")
    from conftest import run_under_fake_driver

    p = run_under_fake_driver(_STALE_SCALARS, tmp_path, timeout=120)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout + p.stderr


def test_steps_repeated_on_several_host_threads_each_get_their_own_values(guessing, rng):
    """Four threads, each repeating the step on a stream of its own with weights of its own: the
    triggers (one per stream, under one primitive), the watch and the guesses are shared state."""
    from conftest import repeat_in_threads

    xn = rng.standard_normal((3, 8))
    wn = [rng.standard_normal((8, 8)) / 3 for _ in range(4)]
    st = lf.new_stream(guessing, lanes=1)
    with lf.stream(st):  # the reference: this device's own bits (compared exactly below)
        want = np.asarray(_forward(lf.array(xn), [lf.array(w) for w in wn], lf))
    np.testing.assert_allclose(want, _forward(xn, wn, np), rtol=1e-12, atol=1e-12)

    def prepare(s):
        x = lf.array(xn, stream=s)
        ws = [lf.array(w, stream=s) for w in wn]
        lf.eval(x, *ws)

        def step():
            with lf.stream(s):
                return [_forward(x, ws, lf)]
        return step

    repeat_in_threads(guessing, prepare, [want], reps=30, check_every=1)
