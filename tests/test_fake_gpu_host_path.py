"""The uncached eager path's per-command host work on the CUDA backend (issue 15), under the fake
driver (``tests/doubles/fake_cuda.py``): memory only one lane used goes to that lane's free list and
is reused there without a driver call, memory used on several lanes goes back to the pool after
every lane's last use, a lane's list is freed on its stream before the stream goes, and out of
memory or ``memory_stats`` return the lists to the pool; event polling finds finished marks with
few queries. In a subprocess, as the fake driver must never meet a real one."""

from __future__ import annotations

import pytest
from conftest import run_under_fake_driver

pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed (pip install -e '.[dev]')")

_SCRIPT = r'''
import gc, sys
sys.path.insert(0, sys.argv[1])
import fake_cuda
calls = []   # (name, first argument, stream) of allocations, frees and stream destroys, in order
oom = [False]
_alloc = fake_cuda.FAKES["cuMemAllocFromPoolAsync"]
def alloc(n, pool, st):
    if oom[0]:
        oom[0] = False
        from cuda.bindings import driver as cu
        return (cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY, 0)
    r = _alloc(n, pool, st)
    calls.append(("alloc", int(r[1]), int(st)))
    return r
fake_cuda.FAKES["cuMemAllocFromPoolAsync"] = alloc
fake_cuda.FAKES["cuMemFreeAsync"] = lambda p, st: (calls.append(("free", int(p), int(st))), (fake_cuda.OK,))[1]
_destroy = fake_cuda.FAKES["cuStreamDestroy"]
fake_cuda.FAKES["cuStreamDestroy"] = lambda st: (calls.append(("destroy", int(st), int(st))), _destroy(st))[1]
fake_cuda.install()
import numpy as np
import laneflow as lf
from laneflow.graph import eval_cache, fusion
from laneflow.runtime.backend import backend_for

fusion.set_enabled(False)
s = lf.new_stream(lf.gpu, lanes=1)
lane = s.lanes[0]
mem = lane.ctx.memory
x = lf.array(np.ones(64, np.float32), stream=s)
lf.eval(x)


def settle():
    """One command of another size: the next command collects what died, without reusing it."""
    lf.eval(lf.zeros((3,), lf.int8, stream=s) + 1)


def step():
    with lf.stream(s):
        y = lf.exp(x) * 2.0 + x   # exp's and multiply's outputs die: a buffer per command, not donated
    lf.eval(y)
    return y


with eval_cache.bypass():
    for _ in range(3):
        step()
    calls.clear()
    before = lf.stats()["commands"]
    for _ in range(50):
        step()
    n = lf.stats()["commands"] - before
    assert n == 150, n
    assert len(calls) <= 2, calls          # reused from the lane's free list: no driver call per command
    settle()
    assert lane.cached and mem.caching == {lane}, (lane.cached, mem.caching)

    # memory_stats returns every list to the pool, each block freed on its lane's stream
    held = [p for ps in lane.blocks.values() for p in ps]
    assert held
    calls.clear()
    backend_for(lf.gpu).memory_stats()
    assert not lane.blocks and lane.cached == 0 and not mem.caching
    assert sorted(p for c, p, st in calls if c == "free" and st == lane.handle) == sorted(held), calls

    # out of memory: the lists go back to the pool before the one retry
    step()
    settle()
    held = [p for ln in mem.caching for ps in ln.blocks.values() for p in ps]
    assert held
    calls.clear()
    oom[0] = True
    with lf.stream(s):
        big = lf.exp(lf.zeros((1000,), lf.float32))
    lf.eval(big)
    assert set(held) <= {p for c, p, st in calls if c == "free"}, calls   # (and what died meanwhile)
    assert not lane.blocks and not mem.caching

    # read on two lanes: the pool frees it after both (the free stream waits), never a lane's list
    s2 = lf.new_stream(lf.gpu, lanes=2)
    a, b = s2.lanes
    with lf.stream(s2):
        u = lf.exp(x)
        lf.eval(u)
        buf = u._data.buffer
        ptr = buf.data.ptr
        v1 = u * 2.0
        v2 = u * 3.0
        lf.eval(v1, v2)
    assert set(buf.readers) | {buf.writer.lane} == {a, b}, buf.readers
    calls.clear()
    del u, buf
    gc.collect()
    lf.eval(v1 + 1.0)
    assert any(c == "free" and p == ptr for c, p, _ in calls), calls
    assert all(ptr not in ps for ln in (a, b) for ps in ln.blocks.values())

    # a closed lane's list is freed on its stream before the stream is destroyed
    s3 = lf.new_stream(lf.gpu, lanes=1)
    l3 = s3.lanes[0]
    with lf.stream(s3):
        for _ in range(3):
            lf.eval(lf.exp(x) * 2.0)
        lf.eval(lf.zeros((3,), lf.int8) + 1)
    held = [p for ps in l3.blocks.values() for p in ps]
    assert held
    calls.clear()
    s3.close()
    lf.eval(lf.exp(x) * 2.0)                 # the next command destroys the closed lane
    h3 = l3.handle
    order = [c for c in calls if c[2] == h3]
    assert order and order[-1][0] == "destroy", order
    assert sorted(p for c, p, _ in order[:-1]) == sorted(held), order
print("host path ok")
'''


def test_lane_free_lists_reuse_one_lanes_memory_and_return_it_to_the_pool(tmp_path):
    p = run_under_fake_driver(_SCRIPT, tmp_path, timeout=120)
    assert p.returncode == 0 and "host path ok" in p.stdout, p.stdout[-3000:] + p.stderr[-6000:]


def test_finished_marks_are_found_with_few_queries():
    """Events of one stream finish in order: ``_finished`` counts them by bisection, with one query
    for a lane that is behind and two for one that keeps up."""
    from laneflow.backends.cuda import lanes as L

    for n in range(1, 70):
        for k in range(n + 1):
            marks = L.collections.deque((s, s) for s in range(n))
            asked = []

            def query(ev, k=k, asked=asked):
                asked.append(ev)
                return 0 if ev < k else L._NOT_READY

            assert L._finished(marks, query) == k, (n, k)
            if k == 0:
                assert asked == [0]
            elif k == n:
                assert len(asked) <= 2, asked
            else:
                assert len(asked) <= 3 + n.bit_length(), (n, k, asked)


# Launches recorded on the fake driver (kernel, grid, block, arguments), for the differential tests below:
# ``same_launches`` runs ``program(on, seed)`` with a mechanism on, then off, and wants the same outcomes
# and launches (an input's pointer named by its array, any other, a fresh output's, as "mem").
_RECORDING = r"""
import sys
sys.path.insert(0, sys.argv[1])
import fake_cuda
fake_cuda.install()
import numpy as np
import laneflow as lf
from laneflow.backends.cuda.kernels import elementwise, launch, reduce
from laneflow.graph import eval_cache, fusion

fusion.set_enabled(False)
# every launch as the driver gets it: the kernel, grid, block, and its parameter block decoded by the
# kernel's layout (whichever path packed it: Kernel.launch, or the C launch of celementwise.c)
import struct
from laneflow.backends.cuda import driver, fastcall
seen = []
kernels = {}
real_init = launch.Kernel.__init__
def init(self, *a, **k):
    real_init(self, *a, **k)
    kernels[self._argv_addr] = self
launch.Kernel.__init__ = init
calls = fastcall.calls(driver.cu)
real = calls.launch
def record(f, gx, gy, gz, bx, by, bz, smem, stream, argv):
    k = kernels[argv]
    args = struct.unpack_from(launch._layout(k.params)[0], k._block)
    # (a pointer parameter as ("p", address), whatever its magnitude: a host buffer's may be small)
    it = iter(args)
    row = []
    for code in k.params:
        if code == "D":
            row.append(tuple(next(it) for _ in range(8)))
        elif code == "p":
            row.append(("p", next(it)))
        else:
            a = next(it)
            row.append(a.hex() if isinstance(a, float) else a)
    seen.append((k.name, (gx, gy, gz), (bx, by, bz), tuple(row)))
    return real(f, gx, gy, gz, bx, by, bz, smem, stream, argv)
calls.launch = record
s = lf.new_stream(lf.gpu, lanes=1)
from laneflow.backends.cuda import dispatch
from laneflow.backends.cuda.kernels import celementwise
from laneflow.graph import csubmit, schedule
assert csubmit.submitter() is not None and celementwise.load() is not None, (csubmit.why_not(), celementwise.why_not())

from laneflow.backends.cuda import cenqueue
assert cenqueue.fast() is not None, cenqueue.why_not()

def c_paths(on):
    # the C submit path, the C elementwise launch and the lanes' C enqueue on, or every command through Python
    schedule.C_SUBMIT = on
    dispatch.KERNELS["elementwise"] = celementwise.kernel() if on else elementwise.elementwise
    for lane in s.lanes:
        lane.enqueue_fast = cenqueue.fast() if on else None

def inputs(dts, shapes, seed):
    rng = np.random.default_rng(seed)
    arrays = {(dt, shape): lf.array((rng.standard_normal(shape) * 4).astype(dt), stream=s)
              for dt in dts for shape in shapes}
    lf.eval(list(arrays.values()))
    return arrays

def attempt(out, thunk):
    try:
        lf.eval(thunk())
        out.append("ok")
    except Exception as e:
        out.append(type(e).__name__)

def same_launches(arrays, switch, step, n, least):
    def program(on, seed):
        switch(on)
        r = np.random.default_rng(seed)
        out = []
        with eval_cache.bypass(), lf.stream(s):
            for _ in range(n):
                step(r, list(arrays.values()), out)
        return out
    ptrs = {v._data.buffer.data.ptr: k for k, v in arrays.items()}
    def named(rows):
        # an input array's pointer by its name, any other as "mem" with the other arguments of the launch
        # it equals (an output written in place, into its input's memory, is not one written into new
        # memory; which new memory depends on the pool's state, which differs from run to run)
        def name(x, a):
            if isinstance(x, tuple) and len(x) == 2 and x[0] == "p":
                return ptrs.get(x[1]) or ("mem", tuple(j for j, y in enumerate(a) if y == x))
            return x
        return [(n, g, b, tuple(name(x, a) for x in a)) for n, g, b, a in rows]
    for seed in range(3):
        del seen[:]
        a = program(True, seed)
        on = named(seen)
        del seen[:]
        b = program(False, seed)
        off = named(seen)
        assert a == b, (a, b)
        assert len(on) == len(off) > least, (len(on), len(off))
        assert on == off
    print("same", len(on))
"""

_UNROLLED = _RECORDING + r"""
arrays = inputs(("float32", "float16", "int32", "int64", "uint8", "bool"), ((7,), (3, 5), (1, 5)), 5)
scalars = [2, -3, 1.5, True, 2**40, -129, 0.0]
fns = [lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a - b, lambda a, b: a < b,
       lambda a, b: a == b, lambda a, b: lf.maximum(a, b), lambda a, b: a & b if isinstance(b, (bool, int)) else a + b]
def step(r, xs, out):
    f, a = fns[r.integers(len(fns))], xs[r.integers(len(xs))]
    b = xs[r.integers(len(xs))] if r.random() < 0.5 else scalars[r.integers(len(scalars))]
    swap = r.random() >= 0.8 and not isinstance(b, lf.Array)
    attempt(out, lambda: f(b, a) if swap else f(a, b))
c_paths(False)  # (the Python kernel's two forms)
same_launches(arrays, lambda on: setattr(elementwise, "UNROLLED", on), step, 300, 100)
"""


def test_unrolled_binary_launches_equal_the_general_path(tmp_path):
    """x + y and x + 1.0 take an unrolled form of elementwise.run: the same kernels, grids and
    arguments (but the outputs' addresses) as the general loops, over random ops, dtypes and scalars."""
    p = run_under_fake_driver(_UNROLLED, tmp_path, 300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "same" in p.stdout


_REDUCE_REUSE = _RECORDING + r"""
arrays = inputs(("float32", "float16", "int32", "bool"), ((7,), (3, 5), (4, 1, 6), (1, 40000), (300, 70)), 7)
ops = [lf.sum, lf.max, lf.min, lf.prod, lf.mean, lf.any, lf.all, lf.var, lf.std]
def step(r, xs, out):
    f, a = ops[r.integers(len(ops))], xs[r.integers(len(xs))]
    nd = len(a.shape)
    axis = None if r.random() < 0.3 else tuple(sorted(set(int(k) for k in r.integers(0, nd, r.integers(1, nd + 1)))))
    keep = bool(r.random() < 0.5)
    attempt(out, lambda: f(a, axis=axis, keepdims=keep))
same_launches(arrays, lambda on: setattr(reduce, "REUSE", on), step, 200, 150)
"""


_C_PATHS = _RECORDING + r"""
arrays = inputs(("float32", "float16", "int32", "bool"), ((7,), (3, 5), (1, 5), (5, 5)), 9)
scalars = [2, -3, 1.5, True, 0.0, 1e39, float("nan"), 2**40]
fns = [lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a - b, lambda a, b: a < b,
       lambda a, b: lf.maximum(a, b), lambda a, b: a ** b, lambda a, b: a / b]
def step(r, xs, out):
    # a few ops on values made by earlier ones (in-place writes where nothing else sees them), some
    # arrays kept (no donation), reductions, matmuls and views between them, evaluated together
    k = int(r.integers(1, 6))
    vals = [xs[r.integers(len(xs))] for _ in range(2)]
    def thunk():
        made = []
        v = vals[0]
        for _ in range(k):
            f = fns[r.integers(len(fns))]
            b = vals[r.integers(len(vals))] if r.random() < 0.5 else scalars[r.integers(len(scalars))]
            v = f(b, v) if r.random() < 0.2 else f(v, b)
            c = r.random()
            if c < 0.15:
                v = lf.sum(v, axis=-1, keepdims=True)
            elif c < 0.25 and v.shape[-1] == 5 and v.ndim == 2:
                v = v.T
            elif c < 0.3 and v.shape == (5, 5):
                v = v @ v
            elif c < 0.35:
                v = lf.reshape(v, tuple(int(n) for n in v.shape)) * 2.0  # (an equal shape, another tuple)
            if r.random() < 0.3:
                made.append(v)  # still seen: not written in place
            if r.random() < 0.05:
                elementwise._plans.clear()  # (plan.keep empties it when full: the C launch's memo of plans)
        return [v, *made]
    attempt(out, thunk)  # (the fake driver computes nothing: values are compared on GPUs, by the fuzzer)
    out.append(repr(lf.stats()))  # the encoder's counters: hazards, waits, commands per lane
def switch(on):
    c_paths(on)
    lf.reset_stats()
same_launches(arrays, switch, step, 150, 100)
print("stats", lf.stats())
"""


_MEMO = _RECORDING + r"""
arrays = inputs(("float32", "float16", "int32", "bool"), ((5, 5), (1, 5)), 11)
x, z, h, i, b = (arrays[k] for k in [("float32", (5, 5)), ("float32", (1, 5)), ("float16", (5, 5)),
                                      ("int32", (5, 5)), ("bool", (5, 5))])
w = arrays[("float32", (1, 5))]
# pairs of launches that share all but one part of the plan key, one after the other: the memo (one slot:
# every key meets the last one) must tell them apart, the Python launches being the reference
SEQ = [lambda: x + x, lambda: x + z,          # the second operand's shape
       lambda: z + x, lambda: x + x,          # the first operand's shape
       lambda: x + 1.5, lambda: h + 1.5,      # the dtype (and the result's)
       lambda: i + 1.5, lambda: b + 1.5,      # the dtype alone (float64 results both)
       lambda: x + 1.5, lambda: x + 2,        # the scalar's type
       lambda: x * x, lambda: x + x,          # the function
       lambda: lf.reshape(x, (5, 5)) + 1.5, lambda: x + 1.5]  # (an equal shape, another tuple: a hit)
def step(r, xs, out):
    for f in SEQ:
        attempt(out, f)
kid = {}  # (each launch's kernel object too, numbered as first seen: add and multiply pack alike)
inner = calls.launch
def record_kernel(f, *rest):
    r = inner(f, *rest)
    seen[-1] = seen[-1][:3] + (seen[-1][3] + (kid.setdefault(id(kernels[rest[-1]]), len(kid)),),)
    return r
calls.launch = record_kernel
celementwise.load().memo_slots(1)
same_launches(arrays, c_paths, step, 2, 20)
celementwise.load().memo_slots(16)
"""


def test_the_c_launchs_plan_memo_tells_keys_apart(tmp_path):
    """celementwise.c keeps the last plans by their key's parts: with one slot, launches that differ in one
    part (a shape, a dtype, the scalar's type, the function) one after the other launch what Python does."""
    p = run_under_fake_driver(_MEMO, tmp_path, 300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "same" in p.stdout


_MEMO_FINALIZER = r"""
import sys
sys.path.insert(0, sys.argv[1])
import fake_cuda
fake_cuda.install()
import numpy as np
import laneflow as lf
from laneflow.backends.cuda.kernels import celementwise, elementwise as E
from laneflow.graph import fusion
from laneflow.ops.primitives import Elementwise

fusion.set_enabled(False)
cel = celementwise.load()
s = lf.new_stream(lf.gpu, lanes=1)
lane = s.lanes[0]
arrs = [lf.array(np.full(8, k + 1.0, np.float32), stream=s) for k in range(4)]
lf.eval(arrs)
a, b, o1, o2 = (t._data.buffer.data for t in arrs)
A, B, C = (Elementwise(n, n, (0, 1)) for n in ("add", "multiply", "subtract"))
def launch(p, out):
    cel.ew(lane, p, [a, b], [out])
for p in (A, B, C):  # (the Python launch makes each plan and kernel; the next one is C's)
    launch(p, o1); launch(p, o1)
cel.memo_slots(1)
key = lambda fn: next(k for k in E._plans if k[0] == fn)
launch(A, o1)  # the one slot: A's plan
plan_a = E._plans.pop(key("add"))  # (as plan.keep's clear would): the memo holds A's plan alone
class Finalizer:
    def __del__(self):
        E._plans.pop(key("multiply"))  # B's plan leaves _plans (plan.keep's clear, say) ...
        launch(C, o2)  # ... and C's launch takes the slot, letting B's plan go
plan_a.build = Finalizer()
del plan_a
launch(B, o1)  # a miss: B's plan found in _plans; the slot's old parts let go run the finalizer
print("survived")
cel.memo_slots(16)
"""


def test_the_plan_memo_keeps_its_plan_while_a_finalizer_replaces_the_slot(tmp_path, monkeypatch):
    """Storing a plan in celementwise.c's memo lets the slot's old parts go, which may run a finalizer
    that empties _plans and launches another key into the same slot: the launch must own its plan first
    (a debug allocator makes a use after free crash)."""
    monkeypatch.setenv("PYTHONMALLOC", "debug")
    p = run_under_fake_driver(_MEMO_FINALIZER, tmp_path, 300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "survived" in p.stdout


def test_c_paths_launch_what_python_launches(tmp_path):
    """The C submit path (graph/csubmit.c), the C elementwise launch (celementwise.c) and the lanes' C
    enqueue (cenqueue.c) launch the same
    kernels, grids, blocks and arguments (but the outputs' addresses), with the same encoder counters,
    as the Python path, over random chains of elementwise ops (scalars of every kind, integer powers, values
    still seen by the program, in-place writes), reductions, transposes and matmuls."""
    p = run_under_fake_driver(_C_PATHS, tmp_path, 300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "same" in p.stdout


def test_reused_reduction_launches_equal_planned_ones(tmp_path):
    """A one-pass reduction's launch is kept per (op, shape, axes, dtypes) and reused by the next
    command of that key: the same kernels, grids, blocks and arguments (but the outputs' addresses) as
    planning each launch, over random reductions, including split ones and var / std."""
    p = run_under_fake_driver(_REDUCE_REUSE, tmp_path, 300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "same" in p.stdout


_C_ENQUEUE_ANY = r"""
import sys
sys.path.insert(0, sys.argv[1])
import fake_cuda
fake_cuda.install()
import numpy as np
import laneflow as lf
from laneflow.backends.cuda import cenqueue, dispatch
from laneflow.graph import csubmit, eval_cache, fusion

fusion.set_enabled(False)
assert csubmit.submitter() is not None and cenqueue.fast() is not None, (csubmit.why_not(), cenqueue.why_not())
s = lf.new_stream(lf.gpu, lanes=1)
(lane,) = s.lanes
fast = cenqueue.fast()
taken = []
def spy(ln, cmd):
    pending = len(ln.ctx.memory.pending)
    r = fast(ln, cmd)
    taken.append((cmd.op, r, pending, len(ln.ctx.memory.pending)))
    return r
allocs = [0]  # allocations from the pool (the free lists' misses)
_alloc = fake_cuda.FAKES["cuMemAllocFromPoolAsync"]
def alloc(*a):
    allocs[0] += 1
    return _alloc(*a)
fake_cuda.FAKES["cuMemAllocFromPoolAsync"] = alloc
x = lf.array(np.arange(20, dtype=np.float32).reshape(4, 5), stream=s)
w = lf.array(np.eye(5, dtype=np.float32), stream=s)
lf.eval(x, w)

def program():
    # a matmul, a reduction, elementwise ops, a gather with indices computed on the device (it registers
    # a device-side check), values dying between commands (their frees pending at the next enqueue)
    with lf.stream(s), eval_cache.bypass():
        v = x
        for _ in range(3):
            v = (v @ w) * 0.5
            v = v - lf.sum(v, axis=0, keepdims=True)
        idx = lf.arange(4, dtype=lf.int64) * 3  # 0, 3, 6, 9: 6 and 9 out of range for 5 columns
        g = lf.take(v, idx, axis=1)
        lf.async_eval(g)  # (no host wait: it would read the check)
    return g

def run(on):
    lane.enqueue_fast = spy if on else None
    program()  # (its values die after its evaluation: their frees are pending at the next one's first command)
    del taken[:]
    base, allocs[0] = lane.fence._last, 0
    g = program()
    (chk,) = g._data.buffer.checks
    got = (chk.seq - base, chk.lane is lane, chk.where,  # (the command's place in the program)
           lane.cached, sorted((n, len(b)) for n, b in lane.blocks.items()), allocs[0])  # free lists, pool
    chk.slots.words(chk.slot)[:2] = (1, 9)  # the kernel's flag and the index it read, as a GPU would write them
    try:
        np.asarray(g)
        err = None
    except lf.ExecutionError as e:
        err = str(e)
    return got, err

on = run(True)
taken_on = list(taken)
off = run(False)
assert not taken  # (off: the Python path only)
taken = taken_on
ops = [t[0] for t in taken]
print("ops", ops)
assert all(t[1] is True for t in taken), taken                      # every command taken in C
assert {"matmul", "sum", "take"} <= set(ops), ops                    # not only elementwise ones
assert any(t[2] for t in taken) and not any(t[3] for t in taken), taken  # frees pending: collected
assert on == off, (on, off)                                          # the check bound alike, the same error
assert on[0][-1] == 0, on                       # (every output's memory came from the lane's free lists)
assert on[1] and "take" in on[1] and "index 9 is out of bounds" in on[1], on

# a kernel that raises: the outputs carry the same error either way, and the lane goes on
real = dispatch.KERNELS["reduce"]
def broken(*a, **k):
    raise RuntimeError("injected")
errs = []
for on in (True, False):
    lane.enqueue_fast = spy if on else None
    dispatch.KERNELS["reduce"] = broken
    try:
        with lf.stream(s), eval_cache.bypass():
            y = lf.sum(x * 2.0, axis=1)
            lf.eval(y)
        errs.append(None)
    except lf.ExecutionError as e:
        errs.append(str(e))
    finally:
        dispatch.KERNELS["reduce"] = real
    with lf.stream(s):
        np.asarray(x + 1.0)
assert errs[0] is not None and errs[0] == errs[1] and "injected" in errs[0], errs
# a closure's command (no primitive) is declined
from laneflow.runtime.lane import Command
assert fast(lane, Command("host", lambda ln: None, [], [])) is False
print("same", on, errs[0])
"""


def test_the_c_enqueue_takes_any_kernels_command_and_binds_its_checks_as_python_does(tmp_path):
    """The lanes' C enqueue (cenqueue.c) takes a matmul's, a reduction's and a gather's command too, with
    frees pending (it collects them) and outputs' memory from the lane's free lists as Memory.take takes
    it (the same lists left, the same allocations from the pool): the gather's device-side check is bound to the same command, lane
    and shapes as the Python path binds it, and a failure it reports raises the same error; a kernel
    that raises fails the outputs with the same error; a closure's command is declined."""
    p = run_under_fake_driver(_C_ENQUEUE_ANY, tmp_path, 300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "same" in p.stdout
