"""The CUDA backend checked for races without a GPU: ``tests/doubles/race_cuda.py`` runs the CUDA
backend on the fake driver with a happens-before model of the device (streams as vector clocks,
events, stream-ordered memory that is never reused, a GPU that finishes work only when the host
learns it did) and reports any two accesses to the same bytes, one a write, that nothing orders, any
use after free and any free not ordered after every use. The differential fuzzer's programs run
eagerly over several multi-lane streams, GPU only and GPU with CPU; random programs mix what users do with a compiled
function's outputs: drop them, keep them (so they move), feed them back, assign into them,
read them on another stream, export them by DLPack, change arguments (staged or bound in place).
Checks with the cross-lane waits, or the output region's reader bookkeeping, turned off show the
model catches a missing wait.
In a subprocess, because the fake driver must never meet a real one."""

from __future__ import annotations

import pytest
from conftest import run_under_fake_driver

pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed (pip install -e '.[dev]')")

_SCRIPT = r'''
import gc, random, sys
sys.path.insert(0, sys.argv[1])
import race_cuda as R
R.install()
import numpy as np
import laneflow as lf
import laneflow.graph.plan as C
from laneflow.backends.cuda.cudagraph import binding, outputs
C.GRAPH_MODE = "strict"
SEED, BROKEN = {seed}, {broken}
if BROKEN:
    outputs.OutSet.drain = lambda self: self.dead.clear()   # forget the readers of dropped outputs
rnd = random.Random(SEED)
if rnd.random() < 0.3:
    binding.STAGE_LIMIT = 0                                  # arguments bound in place, re-captured
s = lf.new_stream(lf.gpu, lanes=rnd.choice([1, 2, 3]))
t = lf.new_stream(lf.gpu, lanes=rnd.choice([1, 2]))
consumer = R.st(987654)[0]                             # another library's stream
with lf.stream(s):
    w = lf.array(np.ones((8, 8), np.float32))
    x = lf.array(np.ones((4, 8), np.float32))
    f = lf.compile(lambda x, w: [x @ w, x * 2.0, (x + 1.0).sum()])
    g = lf.compile(lambda a, y: y * 0.5 + a)
    y = x * 1.0
    pool, caps = [], []
    for step in range({steps}):
        r = rnd.random()
        if r < 0.2:
            ys = f(x, w)
        elif r < 0.35:
            y = g(x, y)
            ys = [y]
        elif r < 0.5:
            src = rnd.choice(pool)[0] if pool else x
            ys = [g(src, x if rnd.random() < 0.5 else y)]
        elif r < 0.6:
            ys = f(x * float(step), w)
        else:
            ys = f(x, w) if rnd.random() < 0.5 else [g(x, y)]
        act = rnd.random()
        if act < 0.3:
            pool.append(ys)
        if act < 0.1 and pool:
            a = rnd.choice(pool)[0]
            cap = a.__dlpack__(stream=consumer, max_version=(1, 0))
            b = a._data.buffer
            R.consumer_read(consumer, b.data.ptr, b.nbytes)
            caps.append(cap)
            del b, cap, a
        if rnd.random() < 0.3:
            with lf.stream(t):
                lf.async_eval(ys[0] * 2.0)
        if rnd.random() < 0.15:
            ys[0][:1] = 7.0
            lf.async_eval(ys[0])
        if rnd.random() < 0.1 and pool:
            lf.eval(rnd.choice(pool)[0])
        if rnd.random() < 0.2 and pool:
            pool.pop(rnd.randrange(len(pool)))
        if rnd.random() < 0.1 and caps:
            caps.pop(0)
        if rnd.random() < 0.05:
            gc.collect()
        del ys
    del pool, caps
    src = None
    gc.collect()
    for _ in range(3):
        lf.eval(f(x, w))
R.finish()
print("errors", len(R.errors), "evacuated", f.stats()[0]["evacuated"] + g.stats()[0]["evacuated"])
'''


def _run(tmp_path, seed: int, broken: bool = False, steps: int = 150):
    p = run_under_fake_driver(_SCRIPT.format(seed=seed, broken=broken, steps=steps), tmp_path, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    last = p.stdout.strip().splitlines()[-1].split()
    return int(last[1]), int(last[3]), p.stdout


@pytest.mark.parametrize("seed", range(6))
def test_random_uses_of_compiled_outputs_are_ordered_on_the_modelled_gpu(tmp_path, seed):
    errors, evacuated, out = _run(tmp_path, seed)
    assert errors == 0, out[-4000:]
    assert evacuated > 0, out[-500:]   # outputs were kept long enough to move: that path ran too


def test_the_model_reports_a_launch_that_does_not_wait_for_readers_of_dropped_outputs(tmp_path):
    found = [_run(tmp_path, seed, broken=True)[0] for seed in range(3)]
    assert any(found), found


_EAGER = r'''
import gc, os, random, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.dirname(sys.argv[1]))  # tests/, for test_fuzz
import race_cuda as R
R.install()
import numpy as np
import laneflow as lf
import test_fuzz as TF
import laneflow.backends.cuda.lanes as L
L.MARK_EVERY = {mark_every}
if {broken}:
    from laneflow.backends.cuda.lanes import CudaLane
    CudaLane._enqueue_wait = lambda self, point: None   # no cross-lane waits at all
rnd = random.Random({seed})
done = 0
for _ in range({programs}):
    prog = TF.random_program(rnd)
    with np.errstate(all="ignore"):
        TF.run_laneflow(prog, lf.gpu, prog["streams"], delays=False)
    done += 1
    gc.collect()
R.finish()
print("errors", len(R.errors), "programs", done)
'''


def _eager(tmp_path, seed: int, programs: int, broken: bool = False, mark_every: int | None = None):
    from laneflow.backends.cuda import lanes

    script = _EAGER.format(seed=seed, programs=programs, broken=broken, mark_every=mark_every or lanes.MARK_EVERY)
    p = run_under_fake_driver(script, tmp_path, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    last = p.stdout.strip().splitlines()[-1].split()
    assert int(last[3]) == programs, p.stdout[-2000:]
    return int(last[1]), p.stdout


@pytest.mark.parametrize("seed,mark_every", [(0, None), (1, None), (2, None), (3, 1)])
def test_the_differential_fuzzers_programs_are_ordered_on_the_modelled_gpu(tmp_path, seed, mark_every):
    """The programs of ``tests/test_fuzz.py`` (several streams of up to 4 lanes, in-place writes,
    cross-stream uses), eagerly on the CUDA backend: every access ordered in the model. With lazy
    events (the default) and with an event after every command (``LANEFLOW_MARK_EVERY=1``)."""
    errors, out = _eager(tmp_path, seed, programs=40, mark_every=mark_every)
    assert errors == 0, out[-4000:]


def test_the_model_reports_missing_cross_lane_waits(tmp_path):
    errors, out = _eager(tmp_path, 0, programs=10, broken=True)
    assert errors > 0, out[-2000:]


_ONE_LANE_FREES = r'''
import gc, sys
sys.path.insert(0, sys.argv[1])
import race_cuda as R
R.install()
import numpy as np
import laneflow as lf
from laneflow.backends.cuda import memory as M
from laneflow.graph import eval_cache, fusion
fusion.set_enabled(False)
if {broken}:  # every free at once on the free stream, waiting for no one
    def bad_free(self, ptr, writer, readers, nbytes):
        self.raw_free(ptr, self.free_stream)
        return True
    M.Memory._free = bad_free
s = lf.new_stream(lf.gpu, lanes=1)
with lf.stream(s), eval_cache.bypass():
    x = lf.array(np.ones((8, 8), np.float32))
    w = lf.array(np.eye(8, dtype=np.float32))
    lf.eval(x, w)
    for _ in range(4):
        y = lf.sum(x @ w, axis=0)  # x @ w dies once the sum is enqueued: its free is pending
        lf.async_eval(y)
        del y
        gc.collect()
    lf.eval(x @ w)
print("errors", len(R.errors))
'''


def test_the_model_sees_a_one_lane_streams_commands_and_reports_an_early_free(tmp_path):
    """On a one-lane stream (the C submit path's), matmuls and reductions whose memory is freed too
    early are reported: the model records every command's accesses (the lanes' C enqueue would run
    kernels without ``Command.run``, where it records them, so race_cuda turns it off)."""
    for broken in (False, True):
        p = run_under_fake_driver(_ONE_LANE_FREES.format(broken=broken), tmp_path, timeout=240)
        assert p.returncode == 0, p.stderr[-3000:]
        errors = int(p.stdout.split("errors")[-1])
        assert (errors > 0) == broken, p.stdout[-3000:]


_WORKSPACES = r'''
import sys
sys.path.insert(0, sys.argv[1])
import race_cuda as R
R.install()
import numpy as np
import laneflow as lf
from laneflow.graph import grouping
from laneflow.runtime import handle_pool as hp
if {broken}:  # every lane handed the first lane's workspace
    shared = {{}}
    grow = hp.HandlePool._grow
    def one_workspace(self, e, lane, old, need):
        first = shared.setdefault(self.library.name, grow(self, e, lane, old, need))
        e.workspaces[lane] = first
        return first
    hp.HandlePool._grow = one_workspace
lf.cuda.set_handle_policy("{policy}")
grouping.set_enabled(False)  # separate matmuls, spread over the lanes
s = lf.new_stream(lf.gpu, lanes=4)
rng = np.random.default_rng(0)
with lf.stream(s):
    xs = [lf.array(rng.standard_normal((16, 16)).astype(np.float32)) for _ in range(8)]
    for r in range(20):
        lf.eval(*[lf.tanh(x @ xs[(k + r) % 8]) for k, x in enumerate(xs)])
R.finish()
print("errors", len(R.errors), "handles", lf.cuda.handle_stats()["handles_created"].get("cublasLt", 0))
'''


@pytest.mark.parametrize("policy", ["device", "thread", "stream"])
def test_lanes_sharing_a_matmul_handle_never_share_a_workspace_on_the_modelled_gpu(tmp_path, policy):
    """Issue 4's rule, checked in the model: 160 matmuls over 4 lanes, through one cuBLASLt handle per
    device (or per thread, or per lane); each call writes its workspace on its lane's stream, and no
    two of those writes are unordered. Handing every lane one workspace is reported."""
    for broken in (False, True):
        p = run_under_fake_driver(_WORKSPACES.format(policy=policy, broken=broken), tmp_path, timeout=240)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
        words = p.stdout.strip().splitlines()[-1].split()
        errors, handles = int(words[1]), int(words[3])
        assert handles == (4 if policy == "stream" else 1), p.stdout[-500:]
        assert (errors > 0) == broken, p.stdout[-3000:]


_MIXED = r'''
import gc, os, random, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.dirname(sys.argv[1]))  # tests/, for test_fuzz
import fake_cuda as F
import race_cuda as R
R.install(devices={gpus})
F.LOG = []
import numpy as np
import laneflow as lf
import test_fuzz as TF
from laneflow.backends.cuda.lanes import CudaLane
if {broken} and {gpus} == 1:
    CudaLane.host_wait = lambda self, seq, timeout=None: True   # the host never waits for the GPU
if {broken} and {gpus} > 1:                                     # no waits for another GPU's lanes
    wait = CudaLane._enqueue_wait
    CudaLane._enqueue_wait = lambda self, p: None if getattr(p.lane, "ctx", self.ctx) is not self.ctx else wait(self, p)
rnd = random.Random({seed})
done = 0
devices = (lf.gpu, lf.cpu) if {gpus} == 1 else (lf.Device("gpu", 0), lf.Device("gpu", 1))
for _ in range({programs}):
    prog = TF.random_program(rnd)
    pool, streams = TF.mixed_pool(prog, devices)
    with np.errstate(all="ignore"):
        TF.run_steps(pool, prog["steps"], prog["dtype"])
        lf.eval(*pool.lf)
        [np.array(a) for a in pool.lf]
    for s in streams:
        s.close()
    done += 1
    gc.collect()
R.finish()
for e in F.CONTEXT_ERRORS[:5]:
    print("CONTEXT", e)
peer = sum(1 for name, _ in F.LOG if name == "cuMemcpyPeerAsync")
cross = sum(1 for name, _ in F.LOG if name == "cuStreamWaitEvent")
print("errors", len(R.errors), "programs", done, "context", len(F.CONTEXT_ERRORS), "peer", peer, "cross", cross)
'''


def _mixed(tmp_path, seed: int, programs: int, broken: bool, gpus: int = 1) -> tuple[dict, str]:
    p = run_under_fake_driver(_MIXED.format(seed=seed, programs=programs, broken=broken, gpus=gpus), tmp_path,
                              timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    words = p.stdout.strip().splitlines()[-1].split()
    return {words[k]: int(words[k + 1]) for k in range(0, len(words), 2)}, p.stdout


@pytest.mark.parametrize("seed", range(2))
def test_programs_mixing_cpu_and_gpu_streams_are_ordered_on_the_modelled_gpu(tmp_path, seed):
    """The fuzzer's programs over GPU and CPU streams alternately: CPU lanes copying GPU values (after
    a host wait on the GPU), GPU streams waiting for CPU lanes (a pinned word, cuStreamWaitValue64)
    before writing memory a CPU lane reads. Every access ordered in the model; a host that never
    waits for the GPU is reported."""
    for broken in (False, True):
        got, out = _mixed(tmp_path, seed, 25, broken)
        assert got["programs"] == 25 and (got["errors"] > 0) == broken, out[-3000:]


@pytest.mark.parametrize("seed", range(2))
def test_programs_spread_over_two_gpus_are_ordered_on_the_modelled_gpus(tmp_path, seed):
    """Issue 21: the fuzzer's programs with their streams alternating between gpu:0 and gpu:1 on a
    fake driver of two devices: every use of the other GPU's array is a peer copy that waits for the
    producer's lane by an event of the other device, every access is ordered in the model (frees of
    memory the other GPU read included), and every driver call ran with its device's context current.
    Without the waits for the other GPU's lanes the model reports races."""
    for broken in (False, True):
        got, out = _mixed(tmp_path, seed, 25, broken, gpus=2)
        assert got["programs"] == 25 and got["context"] == 0, out[-3000:]
        assert got["peer"] > 0 and (got["cross"] > 0 or broken), out[-3000:]
        assert (got["errors"] > 0) == broken, out[-3000:]


# -- hangs: the model with the device's progress (race_cuda.install(execute_streams=True)) -----------

_CPU_WAIT_RACE = r'''
import os, sys, threading
os.environ["RACE_HANG_S"] = "2"
sys.path.insert(0, sys.argv[1])
import race_cuda as R
R.install(execute_streams=True)
import numpy as np
import laneflow as lf
from laneflow.backends.cuda import hostsync as HS

g = lf.new_stream(lf.gpu, lanes=1)
c = lf.new_stream(lf.cpu, lanes=1)
fence = g.lanes[0].fence
queued = threading.Event()   # the GPU stream's wait for the CPU lane is enqueued
gpu_wait = HS.HostSignals.gpu_wait

def gpu_wait_then_tell(self, stream, point):
    gpu_wait(self, stream, point)
    queued.set()

HS.HostSignals.gpu_wait = gpu_wait_then_tell
fired = []

class Window:
    """The GPU lane's fence lock. The CPU worker takes it in EventFence.wait after finding the point
    not yet known finished; just before, once the GPU stream also waits for that worker's lane, the GPU
    runs what it can and another host thread polls the fence (as the encoder's lane choice does)."""
    def __init__(self, inner):
        self.inner = inner
    def __enter__(self):
        if not fired and threading.current_thread().name.startswith("laneflow-cpu"):
            fired.append(fence.known(2))
            queued.wait(10)
            R.advance(1.0)
            fence.value
        return self.inner.__enter__()
    def __exit__(self, *a):
        return self.inner.__exit__(*a)

fence._lock = Window(fence._lock)
x = lf.add(lf.array(np.ones(4, np.float32), stream=g), 1.0, stream=g)   # GPU lane: commands 1, 2
a = lf.array(np.ones(4, np.float32), stream=c)
y = lf.add(x, a, stream=c)     # CPU lane: waits for GPU command 2, copies x, adds
z = lf.add(y, 1.0, stream=g)   # GPU lane: a wait for the CPU lane (pinned word), then a copy of y
try:
    lf.eval(z)
except lf.LaneflowError as e:
    print("raised", type(e).__name__, e)
print(R.hangs[0] if R.hangs else "no hang")
print("window", fired, "hangs", len(R.hangs))
'''


def test_a_cpu_lane_waiting_for_a_point_another_thread_just_learned_finished_does_not_hang(tmp_path):
    """The H200 suite's hang (docs/perf/suite-b-hang-h200-2026-12-04-ee661c0.txt), replayed on the
    modelled device: a CPU worker waiting for GPU command 2 finds it not known finished; before it
    takes the fence's lock another thread polls the fence, learns command 2 finished and recycles its
    event. The worker must then return, not wait for an event recorded at the stream's tail now, which
    is behind the stream's wait for that worker's own later command (that wait never ended)."""
    p = run_under_fake_driver(_CPU_WAIT_RACE, tmp_path, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    last = p.stdout.strip().splitlines()[-1]
    assert last == "window [False] hangs 0", p.stdout[-6000:]   # the window was hit; nothing hung


_MIXED_DELAYS = r'''
import gc, os, random, sys
os.environ["RACE_HANG_S"] = "3"
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.dirname(sys.argv[1]))  # tests/, for test_fuzz
import race_cuda as R
R.install(execute_streams=True)
import numpy as np
import laneflow as lf
import test_fuzz as TF
sys.setswitchinterval(1e-5)  # host threads interleave far more often than they would
rnd = random.Random({seed})
done = 0
for _ in range({programs}):
    prog = TF.random_program(rnd)
    pool, streams = TF.mixed_pool(prog)
    try:
        with np.errstate(all="ignore"), lf.testing.inject_delays(0.0005, seed=prog["seed"]):
            TF.run_steps(pool, prog["steps"], prog["dtype"])
            lf.eval(*pool.lf)
            [np.array(a) for a in pool.lf]
    except lf.LaneflowError as e:
        print("raised", e)
    for s in streams:
        s.close()
    done += 1
    gc.collect()
    if R.hangs:
        break
print(R.hangs[0] if R.hangs else "no hang")
print("hangs", len(R.hangs), "programs", done)
'''


@pytest.mark.parametrize("seed", range(2))
def test_programs_mixing_cpu_and_gpu_streams_with_delays_never_hang_on_the_modelled_gpu(tmp_path, seed):
    """The mixed programs with random delays and frequent thread switches, on a device that really
    waits (events, cuStreamWaitValue64 on the CPU lanes' words): no blocking wait is left waiting for
    work that can never run. Before the fix above about a third of such 60-program runs hung."""
    p = run_under_fake_driver(_MIXED_DELAYS.format(seed=seed, programs=60), tmp_path, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    assert p.stdout.strip().splitlines()[-1] == "hangs 0 programs 60", p.stdout[-6000:]


_MODULE_LOAD = r"""
import os, sys
os.environ["RACE_HANG_S"] = "2"
sys.path.insert(0, sys.argv[1])
import race_cuda as R
R.install(execute_streams=True)
import numpy as np
import laneflow as lf
from laneflow.defaults import backend_for

a = np.arange(4096, dtype=np.float32)
gpu = lf.new_stream(lf.gpu, lanes=2)
cpu = lf.new_stream(lf.cpu, lanes=1)
lf.eval(lf.add(lf.array(a, stream=gpu), 1.0, stream=gpu))
backend_for(lf.gpu).context(0).modules._kernels.clear()   # the in-place write's kernel: a module load
f = lf.compile(lambda v: lf.multiply(v, 2.0, stream=cpu))
for _ in range({warm}):   # {warm} > 0: the CPU read is a compiled CPU plan's one command (a HostCommand)
    with lf.stream(cpu):
        lf.eval(f(lf.array(a, stream=gpu)))
if {warm}:
    print("plan", f.stats()[0]["mode"])
try:
    with lf.testing.inject_delays(fixed=0.05):
        x = lf.add(lf.array(a, stream=gpu), 1.0, stream=gpu)
        if {warm}:
            lf.eval(lf.multiply(x, 1.0, stream=cpu))   # the CPU lane's clock now covers x's writer: no wait
            with lf.stream(cpu):
                on_cpu = f(x)
        else:
            on_cpu = lf.multiply(x, 1.0, stream=cpu)   # the CPU lane copies x to the host (delayed)
        lf.async_eval(on_cpu)
        x[0:100] = 0.0                             # waits for that copy, then loads its kernel
        lf.eval(x, on_cpu)
except lf.LaneflowError as e:
    print("raised", type(e).__name__, str(e)[:300])
print(R.hangs[0][:3000] if R.hangs else "no hang")
print("hangs", len(R.hangs))
"""


@pytest.mark.parametrize("warm", [0, 3], ids=["kernel", "compiled plan"])
def test_a_module_load_while_a_stream_waits_for_a_cpu_lane_copying_from_the_gpu_does_not_hang(tmp_path, warm):
    """The H200 suite's hang at 89cadf0 and be5c7ac (test_cuda_backend's write after a CPU read): a GPU
    write must wait for a CPU lane's copy of its buffer to the host, and its kernel is loaded right
    after. Had the stream waited on the device (a word the CPU lane's helper writes), the load would
    wait for that stream while holding the lock the CPU lane's cuMemcpyDtoH needs. The encoder waits on
    the host for a CPU lane whose work calls the driver (``ThreadLane.driver_seq``), also when the copy
    is inside a compiled CPU plan whose lane already waited for the GPU (found in review)."""
    p = run_under_fake_driver(_MODULE_LOAD.replace("{warm}", str(warm)), tmp_path, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    assert p.stdout.strip().splitlines()[-1] == "hangs 0", p.stdout[-6000:]
    if warm:
        assert "plan one command" in p.stdout, p.stdout[-3000:]   # the copy ran inside a CPU plan


_NEVER_ENQUEUED = r"""
import ctypes, sys, threading, time
sys.path.insert(0, sys.argv[1])
import race_cuda as R
R.install(execute_streams=True)
import numpy as np
import laneflow as lf
from laneflow.backends.cuda.lanes import CudaLane

g = lf.new_stream(lf.gpu, lanes=1)
c = lf.new_stream(lf.cpu, lanes=1)
gate = ctypes.c_uint64(0)                      # the GPU stream waits for this word before going on
R.x_wait_value(g.lanes[0].handle, ctypes.addressof(gate), 1, 0)
x = lf.add(lf.array(np.ones(4, np.float32), stream=g), 1.0, stream=g)
lf.async_eval(x)                               # queued behind the gate
buf = x._data.buffer
enqueue = CudaLane._enqueue
CudaLane._enqueue = lambda self, cmd: (_ for _ in ()).throw(RuntimeError("submission failed"))
try:
    g.encoder.encode("overwrite", lambda lane: None, (), (buf,))   # buf's writer: a point never enqueued
except RuntimeError as e:
    print("submit:", e)
CudaLane._enqueue = enqueue
ran = []
out = c.backend.allocate(c.device, (4,), np.dtype(np.float32), "read")
c.encoder.encode("read", lambda lane: ran.append(1), (buf,), (out,))   # a CPU lane reads buf
time.sleep(0.5)
print("before the GPU ran:", c.lanes[0].fence.value, ran)
gate.value = 1
c.synchronize()
print("after:", c.lanes[0].fence.value, ran, type(out.error).__name__, out.error)
"""


def test_a_cpu_lane_waiting_for_a_gpu_command_that_was_never_enqueued_fails_its_command(tmp_path):
    """A CPU worker's wait for a GPU point whose command never reached the stream (its submission
    raised) returns False. The worker must still wait for what the lane had enqueued before it (the
    point implies those, and the encoder elides later waits on them), and the command after the wait
    must not run on data nobody wrote: its outputs carry the error."""
    p = run_under_fake_driver(_NEVER_ENQUEUED, tmp_path, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    out = p.stdout.strip().splitlines()
    assert out[0] == "submit: submission failed", p.stdout
    assert out[1] == "before the GPU ran: 0 []", p.stdout          # still waiting for the GPU's add
    assert out[2].startswith("after: 1 [] ExecutionError") and "never enqueued" in out[2], p.stdout
