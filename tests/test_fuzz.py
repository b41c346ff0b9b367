"""Differential fuzzing: random programs run on laneflow and on numpy must agree.

Each program (5-40 steps: elementwise ops, reductions, matmul (whose adds may become epilogues),
lf.nn norms and activations, row programs written as plain ops (reductions with their elementwise
neighbours), reshape/transpose, slicing, slice
assignment, rebinding that frees old values (so buffers are reused in place), aliasing, evals at
random points, and uses across 1-3 streams of 1-4 lanes) runs three ways:

* on numpy, with laneflow's value semantics (slices are copies; ``x[i] = v`` changes the object);
* on laneflow with one stream of one lane;
* on laneflow with the drawn streams and lanes, with random delays injected into every command.

The many-lane run repeats the program three times on its streams, with new input values each time,
so that its graphs hit the plan cache (``graph/eval_cache.py``: the second sighting builds a plan, the
third replays it; with the executor after no hits, that third run is a CUDA graph or one command),
and two programs in three launch early (``graph/early.py``: after every first or second matrix
product, the next one's pending operands are scheduled on their own, on the CPU too). Some programs
run seven times, three of them from the same input values and one from them with an input
rewritten in place, so that speculative launches (``graph/speculate.py``) are made, taken and
dropped, on the CPU too;
the one-lane run has the cache off and, on the GPU, elementwise fusion off too. The many-lane runs
must equal numpy, and their first run the one-lane run bit for bit (on the CPU; within float
tolerance on the GPU, where fused kernels and library calls may differ in the last bits). ``LANEFLOW_FUZZ_PROGRAMS`` (or
pytest's ``--fuzz-programs``) sets the number of programs (default 300; e.g. 10000).

Where two GPUs are visible, programs also run with their streams alternating between gpu:0 and gpu:1
(arrays spread over both devices); with fewer GPUs that test skips, saying so.
"""

from __future__ import annotations

import math
import os
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import laneflow as lf

PROGRAMS = int(os.environ.get("LANEFLOW_FUZZ_PROGRAMS", "300"))

UNARY_F = ["tanh", "sin", "abs", "negative", "square", "exp"]
UNARY_I = ["abs", "negative", "square"]
BINARY = ["add", "subtract", "multiply", "maximum", "minimum"]
REDUCE = ["sum", "max", "min"]
#: lf.nn steps (float programs): a reduction with its elementwise neighbours in one kernel, activations
NN = ["layer_norm", "rms_norm", "gelu_tanh", "silu"]


def _nn_ref(name: str, x: np.ndarray) -> np.ndarray:
    """numpy's value of an lf.nn step, computed as the CPU kernels compute it (bit for bit: statistics
    of a C-contiguous copy, whatever the input's layout)."""
    t = x.dtype.type
    x = np.ascontiguousarray(x)
    if name == "layer_norm":
        xc = x - x.mean(axis=-1, keepdims=True)
        return xc / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + t(1e-5))
    if name == "rms_norm":
        return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + t(1e-6))
    if name == "silu":
        return x / (t(1.0) + np.exp(-x))
    return t(0.5) * x * (t(1.0) + np.tanh(t(math.sqrt(2 / math.pi)) * (x + t(0.044715) * x * x * x)))


#: Row programs written as plain ops (graph/rowfusion.py fuses each into one kernel): a reduction over
#: the last axis with elementwise producers and consumers.
ROWS = ["centre_scale", "softmax_masked", "normalise_abs", "layer_norm_plain"]


def _row_step(xp, name: str, x, y, softmax):
    """The row program ``name`` over ``x`` (and ``y``, broadcast against it) in namespace ``xp``."""
    if name == "centre_scale":
        return (x * 0.5 - x.mean(axis=-1, keepdims=True)) * x.max(axis=-1, keepdims=True)
    if name == "softmax_masked":
        return softmax(x * 0.25 + y, axis=-1)
    if name == "normalise_abs":
        return x / (xp.abs(x) + 1).sum(axis=-1, keepdims=True)
    xc = x - x.mean(axis=-1, keepdims=True)
    return xc / xp.sqrt((xc * xc).mean(axis=-1, keepdims=True) + 1e-5) * y + 0.5


#: Largest row condition ``max|x| / std(x)`` a layer norm is compared at, per dtype: it divides
#: ``x - mean`` by the row's std, so the input's rounding (a few ulps of ``max|x|``, from the ops before
#: it and the summation order) comes out amplified by that ratio; at the comparison's tolerance (1e-5
#: for float32, 1e-12 for float64) and about 2 ulps of input error, float32 allows ~50, float64 ~2,000.
_LAYER_NORM_CONDITION = {np.dtype(np.float32): 32.0, np.dtype(np.float64): 1000.0}


def _flat_rows(x: np.ndarray) -> bool:
    """Rows a layer norm cannot be compared on: (almost) no spread against their size, so ``x - mean``
    is mostly the rounding of the steps before, amplified by up to ``max|x| / std`` (the GPU fuzz found
    it twice: ``maximum(x, col)`` made a constant row, 0.5 came out as 0.50005; and a float32 row of
    spread 1.4 % after a matmul, condition 197, was 4e-5 off numpy's)."""
    limit = _LAYER_NORM_CONDITION.get(x.dtype, 32.0)
    with np.errstate(all="ignore"):
        xx = x.astype(np.float64)
        size = np.abs(xx).max(axis=-1)
        std = xx.std(axis=-1)
    return bool(np.any(~(std * limit >= size)))


def _np_softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return (e / np.sum(e, axis=axis, keepdims=True)).astype(x.dtype)


def _nn_step(name: str, x, stream):
    if name in ("layer_norm", "rms_norm"):
        return getattr(lf.nn, name)(x, stream=stream)
    return lf.nn.gelu(x, approximate="tanh", stream=stream) if name == "gelu_tanh" else lf.nn.silu(x, stream=stream)

#: The step grammar: kind -> the ranges of its integer fields (the last picks the stream).
STEP_KINDS = {
    "unary": [(0, 5), (0, 99), (0, 2)],
    "binary": [(0, 4), (0, 99), (0, 99), (0, 2)],
    "scalar": [(0, 2), (0, 99), (-3, 3), (0, 2)],
    "reduce": [(0, 2), (0, 99), (0, 1), (0, 2)],
    "matmul": [(0, 99), (0, 99), (0, 2)],
    "transpose": [(0, 99), (0, 2)],
    "reshape": [(0, 99), (0, 2)],
    "getitem": [(0, 99), (0, 6), (0, 6), (0, 2)],
    "setitem": [(0, 99), (0, 99), (0, 6), (0, 6), (0, 2)],
    "rebind": [(0, 5), (0, 99), (0, 2)],
    "alias": [(0, 99)],
    "concat": [(0, 99), (0, 99), (0, 2)],
    "nn": [(0, 3), (0, 99), (0, 2)],
    "rows": [(0, 3), (0, 99), (0, 99), (0, 2)],
    "eval": [(0, 99), (0, 99)],
    "async_eval": [(0, 99)],
}

step = st.one_of(*[st.tuples(st.just(k), *[st.integers(lo, hi) for lo, hi in r]) for k, r in STEP_KINDS.items()])

program = st.fixed_dictionaries({
    "dtype": st.sampled_from(["float64", "float32", "int32"]),
    "n": st.integers(2, 6),
    "inputs": st.integers(1, 3),
    "streams": st.lists(st.integers(1, 4), min_size=1, max_size=3),
    "steps": st.lists(step, min_size=5, max_size=40),
    "seed": st.integers(0, 2**32 - 1),
})


def random_program(rnd) -> dict:
    """A program from the same grammar as ``program``, drawn from a seeded ``random.Random`` (for
    runs outside hypothesis: ``tests/test_fake_gpu_races.py``)."""
    def one():
        kind = rnd.choice(list(STEP_KINDS))
        return (kind, *[rnd.randint(lo, hi) for lo, hi in STEP_KINDS[kind]])
    return {"dtype": rnd.choice(["float64", "float32", "int32"]), "n": rnd.randint(2, 6),
            "inputs": rnd.randint(1, 3), "streams": [rnd.randint(1, 4) for _ in range(rnd.randint(1, 3))],
            "steps": [one() for _ in range(rnd.randint(5, 40))], "seed": rnd.randint(0, 2**32 - 1)}


class Pool:
    """Parallel lists of laneflow arrays and numpy references, applied step by step."""

    def __init__(self, inputs, streams):
        self.lf = [lf.array(x, stream=streams[0]) for x in inputs]
        self.np = [x.copy() for x in inputs]
        self.streams = streams

    def pick(self, i):
        return i % len(self.lf)

    def push(self, a, r):
        self.lf.append(a)
        self.np.append(r)


def _ufunc(name):
    return getattr(lf, name), getattr(np, name if name != "abs" else "absolute")


def run_steps(pool: Pool, steps, dtype) -> None:
    is_int = dtype == "int32"
    for s in steps:
        kind = s[0]
        stream = pool.streams[s[-1] % len(pool.streams)] if kind not in ("alias", "eval", "async_eval") else None
        if kind == "unary" or kind == "rebind":
            names = UNARY_I if is_int else UNARY_F
            f, g = _ufunc(names[s[1] % len(names)])
            i = pool.pick(s[2])
            if g is np.exp:
                a, r = f(lf.tanh(pool.lf[i], stream=stream), stream=stream), np.exp(np.tanh(pool.np[i]))
            else:
                a, r = f(pool.lf[i], stream=stream), g(pool.np[i])
            if kind == "rebind":  # the old value dies: its buffer may be reused in place
                pool.lf[i], pool.np[i] = a, r
            else:
                pool.push(a, r)
        elif kind == "binary":
            f, g = _ufunc(BINARY[s[1]])
            i, j = pool.pick(s[2]), pool.pick(s[3])
            try:
                np.broadcast_shapes(pool.np[i].shape, pool.np[j].shape)
            except ValueError:
                continue
            pool.push(f(pool.lf[i], pool.lf[j], stream=stream), g(pool.np[i], pool.np[j]))
        elif kind == "scalar":
            i = pool.pick(s[2])
            c = s[3] if is_int else s[3] * 0.5
            f, g = _ufunc(("add", "multiply", "subtract")[s[1]])
            pool.push(f(pool.lf[i], c, stream=stream), g(pool.np[i], c))
        elif kind == "reduce":
            i = pool.pick(s[2])
            x, r = pool.lf[i], pool.np[i]
            if r.ndim == 0 or r.shape[s[3] % r.ndim] == 0:
                continue
            ax = s[3] % r.ndim
            name = REDUCE[s[1]]
            pool.push(getattr(lf, name)(x, axis=ax, keepdims=True, stream=stream),
                      getattr(np, name)(np.ascontiguousarray(r), axis=ax, keepdims=True))  # (as the CPU sums)
        elif kind == "matmul":
            i, j = pool.pick(s[1]), pool.pick(s[2])
            a, b = pool.np[i], pool.np[j]
            if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
                continue
            pool.push(lf.matmul(pool.lf[i], pool.lf[j], stream=stream), a @ b)
        elif kind == "transpose":
            i = pool.pick(s[1])
            pool.push(lf.transpose(pool.lf[i], stream=stream), pool.np[i].T.copy())
        elif kind == "reshape":
            i = pool.pick(s[1])
            r = pool.np[i]
            flat = lf.reshape(pool.lf[i], (-1,), stream=stream)
            pool.push(lf.reshape(flat, r.shape[::-1], stream=stream), r.reshape(-1).reshape(r.shape[::-1]).copy())
        elif kind == "getitem":
            i = pool.pick(s[1])
            r = pool.np[i]
            if r.ndim == 0:
                continue
            sl = slice(s[2], s[3])
            pool.push(pool.lf[i][sl], r[sl].copy())
        elif kind == "setitem":
            i, j = pool.pick(s[1]), pool.pick(s[2])
            r = pool.np[i]
            if r.ndim == 0:
                continue
            sl = slice(s[3], s[4])
            target = r[sl].shape
            v_np = pool.np[j]
            try:
                ok = np.broadcast_shapes(v_np.shape, target) == target
            except ValueError:
                ok = False
            with lf.stream(stream):
                if ok:
                    pool.lf[i][sl] = pool.lf[j]
                    r[sl] = v_np
                else:
                    c = s[3] - 2 if is_int else (s[3] - 2) * 0.25
                    pool.lf[i][sl] = c
                    r[sl] = c
        elif kind == "alias":
            i = pool.pick(s[1])
            pool.push(pool.lf[i], pool.np[i])
        elif kind == "concat":
            i, j = pool.pick(s[1]), pool.pick(s[2])
            a, b = pool.np[i], pool.np[j]
            if a.ndim != b.ndim or a.ndim == 0 or a.shape[1:] != b.shape[1:]:
                continue
            pool.push(lf.concatenate([pool.lf[i], pool.lf[j]], axis=0, stream=stream), np.concatenate([a, b]))
        elif kind == "nn":
            i = pool.pick(s[2])
            r = pool.np[i]
            if is_int or r.ndim == 0 or r.shape[-1] == 0:
                continue
            name = NN[s[1]]
            if name == "layer_norm" and _flat_rows(r):
                continue
            pool.push(_nn_step(name, pool.lf[i], stream), _nn_ref(name, r))
        elif kind == "rows":
            i, j = pool.pick(s[2]), pool.pick(s[3])
            r, q = pool.np[i], pool.np[j]
            if is_int or r.ndim == 0 or r.shape[-1] == 0 or q.ndim > r.ndim:
                continue
            try:
                if np.broadcast_shapes(r.shape, q.shape) != r.shape:
                    continue
            except ValueError:
                continue
            name = ROWS[s[1]]
            if name == "layer_norm_plain" and _flat_rows(r):
                continue
            with lf.stream(stream):
                a = _row_step(lf, name, pool.lf[i], pool.lf[j], lf.softmax)
            with np.errstate(all="ignore"):
                pool.push(a, _row_step(np, name, np.ascontiguousarray(r), q if q.flags.c_contiguous else
                                       np.ascontiguousarray(q), _np_softmax))  # (the CPU reduces C-contiguous data)
        elif kind == "eval":
            lf.eval(pool.lf[pool.pick(s[1])], pool.lf[pool.pick(s[2])])
        elif kind == "async_eval":
            lf.async_eval(pool.lf[pool.pick(s[1])])


def make_inputs(prog, rep: int = 0):
    rng = np.random.default_rng(prog["seed"] + rep)
    n = prog["n"]
    shapes = [(n, n), (n, 1), (1, n)]
    out = []
    for k in range(prog["inputs"]):
        shape = shapes[k % 3]
        if prog["dtype"] == "int32":
            out.append(rng.integers(-9, 10, size=shape).astype(np.int32))
        else:
            out.append(rng.uniform(-2, 2, size=shape).astype(prog["dtype"]))
    return out


def run_laneflow(prog, device, lanes_per_stream, delays, repeats: int = 1, cache: bool = True,
                 fuse: bool = True, early_every: int = 0, same_inputs: frozenset = frozenset(),
                 doubled: frozenset = frozenset()):
    """The program ``repeats`` times on one set of streams (new inputs each time): a list of
    (laneflow results, numpy references) per repetition. ``device``: a Device, or a list of them
    that the streams take in turn (arrays spread over several GPUs). ``early_every``: early launch
    after every so many matrix products, on every device (0: off). ``same_inputs``: repetitions that
    start from the very input values of the repetition before them (the same leaves, so that a
    speculative launch, ``graph/speculate.py``, which guesses on every device here, can be taken).
    ``doubled``: of those, repetitions whose first input is first replaced by its double, with every
    array of the old value dropped, so that the product may be written into its buffer in place (a
    guess made on the last repetition's values must then not be taken)."""
    from laneflow.array import Array
    from laneflow.graph import early, eval_cache, fusion, speculate

    devices = device if isinstance(device, list) else [device]
    streams = [lf.new_stream(devices[k % len(devices)], lanes=n) for k, n in enumerate(lanes_per_stream)]
    out = []
    was_fuse = fusion._enabled
    fusion.set_enabled(fuse)
    saved_after = eval_cache.EXECUTOR_AFTER
    eval_cache.configure(executor_after=0)  # the third run uses the backend's executor
    saved_early = early.EVERY, early.DEVICES, speculate.DEVICES
    early.EVERY, early.DEVICES = early_every, frozenset({"cpu", "gpu"})
    speculate.DEVICES = frozenset({"cpu", "gpu"})
    first: list = []
    try:
        for rep in range(repeats):
            if rep in same_inputs:
                pool = Pool([], streams)
                pool.lf = [Array._wrap(a._data) for a in first]
                pool.np = [x.copy() for x in first_np]
                if rep in doubled:
                    first = None  # (the old value's last arrays go: its buffer may be reused in place)
                    pool.lf[0] = pool.lf[0] * 2
                    lf.eval(pool.lf[0])
                    pool.np[0] = pool.np[0] * 2
                    first_np = [x.copy() for x in pool.np]
            else:
                first_np = make_inputs(prog, rep)
                pool = Pool(first_np, streams)
                if same_inputs:  # (leaves from the start: the repetitions' graphs are alike)
                    lf.eval(*pool.lf)
            first = [Array._wrap(a._data) for a in pool.lf] if same_inputs else []  # (held: never reused in place)
            with (eval_cache.bypass() if not cache else _nothing()):
                if delays:
                    with lf.testing.inject_delays(0.0005, seed=prog["seed"] + rep):
                        run_steps(pool, prog["steps"], prog["dtype"])
                        lf.eval(*pool.lf)
                else:
                    run_steps(pool, prog["steps"], prog["dtype"])
                    lf.eval(*pool.lf)
            out.append(([np.array(a) for a in pool.lf], pool.np))
    finally:
        fusion.set_enabled(was_fuse)
        eval_cache.configure(executor_after=saved_after)
        early.EVERY, early.DEVICES, speculate.DEVICES = saved_early
    for st in streams:
        st.close()
    return out


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


def _agree(a, r, device, k, what):
    assert a.dtype == r.dtype and a.shape == r.shape, f"value {k}: {a.dtype}{a.shape} vs {what} {r.dtype}{r.shape}"
    if device.type == "cpu" or r.dtype.kind in "iub":
        np.testing.assert_array_equal(a, r, err_msg=f"value {k}: differs from {what}")
    else:
        tol = 1e-5 if r.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(a, r, rtol=tol, atol=tol, err_msg=f"value {k}: differs from {what}")


def check_program(prog, device, spread: list | None = None):
    """The program on one lane of ``device``, and three times (plan cache) on the drawn streams, with
    delays: each equals numpy, the first many-lane run the one-lane run. ``spread``: devices the
    drawn streams take in turn instead (at least one stream each)."""
    ((one, ref),) = run_laneflow(prog, device, [1], delays=False, cache=False, fuse=device.type == "cpu")
    streams = prog["streams"]
    if spread:
        streams = streams + [2] * (len(spread) - len(streams))
    runs = run_laneflow(prog, spread or device, streams, delays=True, repeats=3, early_every=prog["seed"] % 3)
    assert len(one) == len(ref)
    for k, (a, r) in enumerate(zip(one, ref)):
        _agree(a, r, device, k, "numpy (one lane, no plan cache)")
    for rep, (many, refs) in enumerate(runs):
        assert len(many) == len(refs)
        for k, (b, r) in enumerate(zip(many, refs)):
            _agree(b, r, device, k, f"numpy (many lanes, run {rep} of the plan cache)")
    for k, (a, b) in enumerate(zip(one, runs[0][0])):
        _agree(b, a, device, k, "one lane")


@settings(max_examples=PROGRAMS, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(prog=program)
def test_random_programs_match_numpy_on_one_lane_and_many(device, prog):
    check_program(prog, device)


@settings(max_examples=max(20, PROGRAMS // 10), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(prog=program)
def test_random_programs_give_the_same_values_through_the_c_and_python_submit_paths(device, prog):
    """One lane, no plan cache (every command submitted one by one): through the C submit path
    (graph/csubmit.c, and on a GPU the C elementwise launch) and through Python, bit for bit, and both
    equal numpy."""
    from laneflow.graph import csubmit, schedule

    if csubmit.submitter() is None:
        pytest.skip(f"the C submit path is not built here: {csubmit.why_not()}")
    ((c, ref),) = run_laneflow(prog, device, [1], delays=False, cache=False, fuse=device.type == "cpu")
    assert schedule.C_SUBMIT
    schedule.C_SUBMIT = False
    try:
        ((py, _),) = run_laneflow(prog, device, [1], delays=False, cache=False, fuse=device.type == "cpu")
    finally:
        schedule.C_SUBMIT = True
    for k, (a, b, r) in enumerate(zip(c, py, ref)):
        np.testing.assert_array_equal(a, b, err_msg=f"value {k}: the C submit path differs from Python's")
        _agree(a, r, device, k, "numpy (one lane, the C submit path)")


@settings(max_examples=max(20, PROGRAMS // 10), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(prog=program)
def test_random_programs_with_speculative_launches(device, prog):
    """Seven repetitions on the drawn streams, with delays: the third to fifth from the same input values
    (a hit from the third on, a trigger learnt at the fourth, whose guess the fifth may take), the
    sixth from them with the first input doubled in place (a guess on the old value dropped), the
    seventh from new ones (a guess dropped). Each must equal numpy."""
    runs = run_laneflow(prog, device, prog["streams"], delays=True, repeats=7, same_inputs=frozenset({3, 4, 5}),
                        doubled=frozenset({5}))
    for rep, (many, refs) in enumerate(runs):
        assert len(many) == len(refs)
        for k, (b, r) in enumerate(zip(many, refs)):
            _agree(b, r, device, k, f"numpy (run {rep}, speculative launches)")


def test_fuzzer_catches_a_missing_wait(monkeypatch):
    """The fuzzer must be able to fail: with waits switched off, a known racy program diverges."""
    from laneflow.runtime.lane import Lane

    monkeypatch.setattr(Lane, "wait", lambda self, point: None)
    prog = {"dtype": "float64", "n": 6, "inputs": 1, "streams": [4], "seed": 1,
            "steps": [("unary", k, 0, 0) for k in range(4)] + [("binary", 0, 1, 2, 0), ("binary", 2, 3, 4, 0)]}
    with pytest.raises(AssertionError):
        for trial in range(20):
            streams = [lf.new_stream(lf.cpu, lanes=4)]
            pool = Pool(make_inputs(prog), streams)
            with lf.testing.inject_delays(0.01, seed=trial):
                run_steps(pool, prog["steps"], prog["dtype"])
                lf.eval(*pool.lf)
            for a, r in zip(pool.lf, pool.np):
                np.testing.assert_array_equal(np.array(a), r)
            streams[0].close()


@settings(max_examples=max(20, PROGRAMS // 10), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(prog=program)
def test_random_programs_with_the_sticky_lane_policy(device, prog):
    with mock.patch.dict(os.environ, {"LANEFLOW_LANE_POLICY": "sticky"}):
        check_program(prog, device)


def test_the_fuzzers_repeated_runs_do_hit_the_plan_cache_and_its_executor(device):
    """The differential fuzzer only tests the plan cache if its programs' graphs hit it."""
    import random

    from laneflow.graph import eval_cache

    before = dict(eval_cache.STATS)
    rnd = random.Random(7)
    for _ in range(20):
        check_program(random_program(rnd), device)
    hits = eval_cache.STATS["hits"] - before["hits"]
    runs = eval_cache.STATS["executor_runs"] - before["executor_runs"]
    assert hits >= 20 and runs >= 10, (hits, runs, eval_cache.STATS)


def test_the_fuzzers_repeated_runs_do_replay_tapes(device):
    """Trace-guided replay (graph/tape.py) under the fuzzer's programs: seven repetitions each (new
    inputs every time), the later ones answered from tapes, must match numpy. A program that
    evaluates mid-way is taped piece by piece, and a piece reading a value the piece before left
    pending is not taped: the programs here evaluate only at their end, so that most are taped whole."""
    import random

    from laneflow.graph import tape

    before = dict(tape.STATS)
    rnd = random.Random(11)
    for _ in range(max(12, PROGRAMS // 25)):  # (more with LANEFLOW_FUZZ_PROGRAMS: 2000 gives 80 programs)
        prog = random_program(rnd)
        prog["steps"] = [s for s in prog["steps"] if s[0] not in ("eval", "async_eval")]
        for rep, (many, refs) in enumerate(run_laneflow(prog, device, prog["streams"], delays=False, repeats=7)):
            for k, (b, r) in enumerate(zip(many, refs)):
                _agree(b, r, device, k, f"numpy (run {rep}, tapes)")
    replays = tape.STATS["tape_replays"] - before["tape_replays"]
    assert replays >= 20, (replays, tape.STATS)  # (29 on the CPU, 2026-12-04)


def mixed_pool(prog, devices: tuple = (lf.gpu, lf.cpu)) -> tuple:
    """A program's inputs on streams that take ``devices`` in turn (one more stream than the program
    asks for; by default GPU and CPU): the race model's tests (test_fake_gpu_races.py) run programs so.
    Returns (pool, streams)."""
    streams = [lf.new_stream(devices[k % len(devices)], lanes=n) for k, n in enumerate(prog["streams"] + [2])]
    return Pool(make_inputs(prog), streams), streams


@settings(max_examples=max(20, PROGRAMS // 3), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(prog=program)
def test_random_programs_spread_over_two_gpus_match_numpy(two_gpus, prog):
    """Issue 21: the programs' streams alternate between gpu:0 and gpu:1, so ops mix arrays of both
    (peer copies on the consumer's lane, fences across devices, frees of memory another GPU read)."""
    check_program(prog, two_gpus[0], spread=list(two_gpus))
