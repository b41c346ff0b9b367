"""Early launch (``graph/early.py``): after every ``EVERY`` matrix products, the next one schedules its
pending operands first, so a long eager forward runs in pieces while Python builds the rest. Results
must equal numpy's and the unlaunched run's; a repeated forward hits the plan cache once per piece;
layout operands are not evaluated on their own; nothing launches inside ``lf.compile``'s trace. CPU
streams do not launch early in normal use; these tests let them (``early.DEVICES``) so the pieces are
checked on every machine."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf
from laneflow.graph import early, eval_cache


@pytest.fixture
def launching(device, monkeypatch):
    monkeypatch.setattr(early, "DEVICES", frozenset({device.type}))
    monkeypatch.setattr(early, "EVERY", 3)
    eval_cache.clear()
    yield device
    eval_cache.clear()


def _mlp(x, ws, xp):
    """A residual stack of products with a nonlinearity and a reshape/transpose round trip."""
    h = x
    for w in ws:
        a = xp.tanh(h @ w)
        b, t, d = a.shape
        a = a.reshape(b, t, 2, d // 2).transpose(0, 2, 1, 3).transpose(0, 2, 1, 3).reshape(b, t, d)
        h = h + 0.5 * a
    return h


def _inputs(rng, device, layers=7):
    from conftest import stack_inputs

    return stack_inputs(rng, device, (2, 3, 8), layers)


def test_a_long_forward_runs_in_pieces_and_equals_numpy(launching, rng):
    st, x, ws, xn, wn = _inputs(rng, launching)
    want = _mlp(xn, wn, np)
    for k in range(6):  # sighted, built, hits (plans per piece), then executors
        launched, hits = eval_cache.STATS["early_launches"], eval_cache.STATS["hits"]
        with lf.stream(st):
            y = _mlp(x, ws, lf)
            # 7 products, a launch at every third: two pieces before the eval
            assert eval_cache.STATS["early_launches"] - launched == 2
        np.testing.assert_allclose(np.asarray(y), want, rtol=1e-12, atol=1e-12)
        if k >= 3:  # every piece hits its plan
            assert eval_cache.STATS["hits"] - hits == 3


def test_early_launch_off_gives_the_same_values_in_one_graph(launching, rng, monkeypatch):
    st, x, ws, xn, wn = _inputs(rng, launching)
    with lf.stream(st):
        on = np.asarray(_mlp(x, ws, lf))
    monkeypatch.setattr(early, "EVERY", 0)
    launched = eval_cache.STATS["early_launches"]
    with lf.stream(st):
        off = np.asarray(_mlp(x, ws, lf))
    assert eval_cache.STATS["early_launches"] == launched
    np.testing.assert_array_equal(on, off)


def test_layout_operands_stay_pending_and_the_next_product_launches(launching, rng, monkeypatch):
    st = lf.new_stream(launching, lanes=1)
    a = lf.array(rng.standard_normal((4, 6)), stream=st)
    lf.eval(a)
    roots = []
    real = eval_cache.schedule
    monkeypatch.setattr(eval_cache, "schedule", lambda rs: roots.append(list(rs)) or real(rs))
    with lf.stream(st):
        p = a @ a.T
        q = p @ p
        v = q.T  # a layout change: the third product's operand, with an evaluated one
        r = v @ a
        assert roots == []  # nothing launched for the view, nor through it
        t = r + 1.0
        s = t @ a.T  # the fourth: its operands are an elementwise result (launched) and a view
        assert len(roots) == 1 and [id(d) for d in roots[0]] == [id(t._data)]
    an = np.asarray(a)
    pn = an @ an.T
    np.testing.assert_allclose(np.asarray(s), ((pn @ pn).T @ an + 1.0) @ an.T, rtol=1e-12)


def test_a_compiled_function_is_traced_whole(launching, rng):
    st, x, ws, xn, wn = _inputs(rng, launching)
    f = lf.compile(lambda x, *ws: _mlp(x, ws, lf))
    for _ in range(3):
        with lf.stream(st):
            y = f(x, *ws)
        np.testing.assert_allclose(np.asarray(y), _mlp(xn, wn, np), rtol=1e-12, atol=1e-12)


def test_other_streams_and_values_held_by_the_program_are_kept(launching, rng):
    st, x, ws, xn, wn = _inputs(rng, launching)
    with lf.stream(st):
        kept = [x @ w for w in ws]  # every third launches its operand (x, evaluated: nothing to do)
        total = kept[0]
        for k in kept[1:]:
            total = total @ ws[0] + k
    want_total = xn @ wn[0]
    for w in wn[1:]:
        want_total = want_total @ wn[0] + xn @ w
    np.testing.assert_allclose(np.asarray(total), want_total, rtol=1e-12, atol=1e-12)
    for k, w in zip(kept, wn):
        np.testing.assert_allclose(np.asarray(k), xn @ w, rtol=1e-12, atol=1e-12)


def test_an_error_while_launching_early_waits_for_the_eval(launching, rng):
    st = lf.new_stream(launching, lanes=1)
    a = lf.array(rng.standard_normal((4, 4)), stream=st)
    w = lf.array(rng.standard_normal((4, 4)))
    lf.eval(a, w)
    h = lf.exp(a, stream=st)
    st.close()
    p = lf.ones((4, 4)) @ w
    for _ in range(3):  # the third launches h's pending work on a closed stream: not here
        p = h @ w
    with pytest.raises(lf.LaneflowError):
        lf.eval(p)


def test_set_early_launch_checks_its_count():
    with pytest.raises(ValueError, match="set_early_launch"):
        lf.set_early_launch(-1)
    with pytest.raises(ValueError, match="set_early_launch"):
        lf.set_early_launch(True)
    old = early.EVERY
    try:
        lf.set_early_launch(0)
        assert early.EVERY == 0
    finally:
        lf.set_early_launch(old)


_ALIKE_PIECES = r'''
import sys
sys.path.insert(0, sys.argv[1])
import fake_cuda
copies = [0]
_copy = fake_cuda.FAKES["cuMemcpyDtoDAsync"]
def copy(*a):
    copies[0] += 1
    return _copy(*a)
fake_cuda.FAKES["cuMemcpyDtoDAsync"] = copy
fake_cuda.install()
import numpy as np
import laneflow as lf
from laneflow.graph import early, eval_cache

early.EVERY = 2
st = lf.new_stream(lf.gpu, lanes=1)
x = lf.array(np.ones((2, 16), np.float32), stream=st)
ws = [lf.array(np.full((16, 16), 0.01 * k, np.float32), stream=st) for k in range(12)]
lf.eval(x, *ws)


def forward():
    h = x
    with lf.stream(st):
        for w in ws:
            h = lf.tanh(h @ w) + h
    lf.eval(h)


for _ in range(6):
    forward()
launches = eval_cache.STATS["early_launches"]
runs = eval_cache.STATS["executor_runs"]
copies[0] = 0
forward()
# a launch at every second product: the pieces are layer 1, layers 2-3, ..., layers 10-11, layer 12
assert eval_cache.STATS["early_launches"] - launches == 6, eval_cache.STATS
assert eval_cache.STATS["executor_runs"] - runs == 7, eval_cache.STATS   # every piece a CUDA graph
# the five middle pieces are one plan over five weight sets: from its second sighting each set has an
# executor of its own reading its weights in place (the plan's first executor copies in what it was
# not first run with); the first and the last piece (one layer each) are another plan, whose last
# piece differs from the first in its weight and its input, which is new at every call: only the
# first gets an executor of its own
units = sorted(len(e.units) for e in eval_cache._entries.values())
assert units == [1, 5], units
# the middle pieces copy in the value passed on from the piece before, the last piece that and its weight
assert copies[0] <= 7, copies
info = lf.plan_cache_info()
assert info["executors"] == 2 + 6, info
assert info["pinned_bytes"] == sum(e.bytes for e in eval_cache._entries.values()) > 0, info

# an extra executor that fails goes alone: the plan's other executors keep running
entry = next(e for e in eval_cache._entries.values() if len(e.units) == 5)
bad = entry.units[2]
def fail(*a, **k):
    raise RuntimeError("capture failed")
bad.run = fail
runs = eval_cache.STATS["executor_runs"]
forward()
forward()
assert entry.plan.unit and len(entry.units) == 4 and all(u is not bad for u in entry.units), entry.units
assert eval_cache.STATS["executor_runs"] - runs >= 12, eval_cache.STATS
print("ok")
'''


def test_pieces_alike_over_other_weights_get_an_executor_each(tmp_path):
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed (pip install -e '.[dev]')")
    from conftest import run_under_fake_driver

    p = run_under_fake_driver(_ALIKE_PIECES, tmp_path, timeout=120)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout + p.stderr


_FRESH_INPUTS = r'''
import sys
sys.path.insert(0, sys.argv[1])
import fake_cuda
fake_cuda.install()
import numpy as np
import laneflow as lf
from laneflow.graph import eval_cache

st = lf.new_stream(lf.gpu, lanes=1)
w = lf.array(np.ones((16, 16), np.float32), stream=st)
lf.eval(w)
for k in range(12):  # every call with new inputs (no weight set that recurs): one executor, staging
    a = lf.array(np.full((4, 16), k, np.float32), stream=st)
    b = lf.array(np.full((4, 16), -k, np.float32), stream=st)
    lf.eval(a, b)
    with lf.stream(st):
        y = lf.tanh(a + b) * 2.0 + a
    lf.eval(y)
assert eval_cache.STATS["executor_runs"] >= 8, eval_cache.STATS
assert [len(e.units) for e in eval_cache._entries.values()] == [0], [len(e.units) for e in eval_cache._entries.values()]
print("ok")
'''


def test_fresh_inputs_at_every_call_keep_one_executor(tmp_path):
    """Leaves that are new at every call (not a recurring weight set) are copied into the plan's one
    executor, as before: no capture per call."""
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed (pip install -e '.[dev]')")
    from conftest import run_under_fake_driver

    p = run_under_fake_driver(_FRESH_INPUTS, tmp_path, timeout=120)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout + p.stderr
