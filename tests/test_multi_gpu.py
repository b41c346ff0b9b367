"""Several GPUs in one process (issue 21): ``lf.Device("gpu", i)`` for every visible GPU; a use of an
array on another GPU is a peer copy (``cuMemcpyPeerAsync``) on the consumer's lane, after a wait on an
event of the producer's lane (never a host wait), with peer access enabled once per pair of GPUs.

Two halves. On the fake driver with two devices (``tests/doubles/fake_cuda.py``, any machine; in a
subprocess, as the fake driver must never meet a real one) the structure is checked from the calls it
logs: the peer copy, the wait across devices, no host synchronisation, peer access once, every call
with its device's context current, the error for a GPU index that does not exist. On a machine with
two GPUs the values are compared with numpy; elsewhere those tests skip, saying why.
"""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest
from conftest import random_array, run_under_fake_driver

import laneflow as lf

_HOST_SYNCS = ("cuEventSynchronize", "cuStreamSynchronize", "cuCtxSynchronize", "cuMemcpyDtoH")

_FAKE = r'''
import gc, json, sys, threading
sys.path.insert(0, sys.argv[1])
import fake_cuda as F
F.CAN_ACCESS_PEER = {peer}
F.install(devices=2)
import numpy as np
import laneflow as lf
import laneflow.graph.plan as P
from laneflow.backends.cuda.driver import DeviceContext
from laneflow.runtime.backend import backend_for
P.GRAPH_MODE = "strict"
if {no_context_switch}:                          # the model must see a call made in the wrong context
    DeviceContext.ensure_current = lambda self: None
out = {{}}
g0, g1 = lf.Device("gpu", 0), lf.Device("gpu", 1)
if {other_library}:                              # another library enabled gpu:1 -> gpu:0 access first
    F.FAKES["cuCtxSetCurrent"](F._CTX0 + 1)
    F.FAKES["cuCtxEnablePeerAccess"](F._CTX0, 0)
s0, s1 = lf.new_stream(g0, lanes=2), lf.new_stream(g1, lanes=3)
x = lf.array(np.ones(64, np.float32), stream=s0)
lf.eval(x)
F.LOG = []
y = lf.tanh(x * 2.0, stream=s0)                  # the producer, on gpu:0
z = lf.add(y, 1.0, stream=s1)                    # the consumer, on gpu:1: y comes by a peer copy
lf.async_eval(z)
out["log"] = F.LOG
F.LOG = []
for k in range(3):                               # back and forth: peer access once per direction
    z = lf.multiply(z, 0.5, stream=s0 if k % 2 == 0 else s1)
    lf.eval(z)
out["peer_log"] = F.LOG

def other_thread():                              # a new host thread: no context current yet
    a = lf.array(np.ones(8, np.float32), stream=s1)
    lf.eval(lf.add(a, lf.sin(x, stream=s0), stream=s1))
t = threading.Thread(target=other_thread)
t.start(); t.join()

f = lf.compile(lambda a, b: lf.add(a * 2.0, b, stream=s1))   # steps on both GPUs
b = lf.array(np.ones(64, np.float32), stream=s1)
for _ in range(4):
    lf.eval(f(x, b))
out["compiled"] = f.stats()[0]
with lf.stream(s1):
    h = lf.compile(lambda a: lf.exp(a) * 3.0)     # one GPU, not the default one: a CUDA graph there
    for _ in range(4):
        lf.eval(h(b))
out["graph_on_gpu1"] = h.stats()[0]["mode"]
for _ in range(4):                               # the plan cache over both GPUs
    lf.eval(lf.add(lf.tanh(x, stream=s0), b, stream=s1))
out["cache_hits"] = lf.plan_cache_info()["hits"]

keep = lf.add(lf.exp(x, stream=s0), 1.0, stream=s1)          # gpu:0 memory a gpu:1 lane read
del y, z
gc.collect()
for _ in range(3):                               # the frees run at the next commands of each GPU
    lf.eval(lf.add(x, 1.0, stream=s0), lf.add(b, 1.0, stream=s1), keep)
out["stats"] = [backend_for(d).memory_stats(d)["pending_frees"] for d in (g0, g1)]
for what, make in (("array", lambda: lf.array([1.0], device="gpu:2")),
                   ("new_stream", lambda: lf.new_stream(lf.Device("gpu", 5)))):
    try:
        make()
        out[what] = "no error"
    except ValueError as e:
        out[what] = str(e)
out["context_errors"] = F.CONTEXT_ERRORS[:5] + ([len(F.CONTEXT_ERRORS)] if F.CONTEXT_ERRORS else [])
print(json.dumps(out))
'''


def _fake(tmp_path, peer: bool = True, no_context_switch: bool = False, other_library: bool = False) -> dict:
    script = _FAKE.format(peer=peer, no_context_switch=no_context_switch, other_library=other_library)
    p = run_under_fake_driver(script, tmp_path, timeout=240)
    if no_context_switch:
        return {"returncode": p.returncode, "out": p.stdout + p.stderr}
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _first(log: list, name: str, **fields) -> int:
    """The position of the first ``name`` call with ``fields`` in ``log`` (-1: none)."""
    for k, (n, f) in enumerate(log):
        if n == name and all(f.get(key) == v for key, v in fields.items()):
            return k
    return -1


pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed (pip install -e '.[dev]')")


def test_a_use_on_another_gpu_is_a_peer_copy_after_a_device_side_wait_on_the_fake_driver(tmp_path):
    out = _fake(tmp_path)
    log = [tuple(e) for e in out["log"]]
    produced = _first(log, "cuLaunchKernel", device=0)
    waited = _first(log, "cuStreamWaitEvent", stream=1, event=0)
    copied = _first(log, "cuMemcpyPeerAsync", dst=1, src=0, stream=1)
    consumed = _first(log, "cuLaunchKernel", device=1)
    assert 0 <= produced < waited < copied < consumed, log
    assert not [e for e in log if e[0] in _HOST_SYNCS], log   # async_eval: the host waited for nothing
    assert out["context_errors"] == [], out["context_errors"]


@pytest.mark.parametrize("peer", [True, False], ids=["peer access", "no peer access"])
def test_peer_access_is_enabled_once_per_pair_where_the_hardware_allows_on_the_fake_driver(tmp_path, peer):
    out = _fake(tmp_path, peer=peer)
    log = out["log"] + out["peer_log"]
    enabled = sorted((f["device"], f["peer"]) for n, f in log if n == "cuCtxEnablePeerAccess")
    asked = sorted((f["device"], f["peer"]) for n, f in log if n == "cuDeviceCanAccessPeer")
    copies = {(f["src"], f["dst"]) for n, f in log if n == "cuMemcpyPeerAsync"}
    assert copies == {(0, 1), (1, 0)}, log                  # both directions copied, peer access or not
    assert asked == [(0, 1), (1, 0)], log                   # asked once per ordered pair
    assert enabled == ([(0, 1), (1, 0)] if peer else []), log
    assert out["context_errors"] == [], out["context_errors"]


def test_peer_access_another_library_enabled_first_is_tolerated_on_the_fake_driver(tmp_path):
    out = _fake(tmp_path, other_library=True)   # gpu:1 -> gpu:0 answers PEER_ACCESS_ALREADY_ENABLED
    assert _first([tuple(e) for e in out["log"]], "cuMemcpyPeerAsync", dst=1, src=0) >= 0, out["log"]
    assert out["context_errors"] == [], out["context_errors"]


def test_compile_streams_threads_frees_and_the_plan_cache_over_two_gpus_on_the_fake_driver(tmp_path):
    out = _fake(tmp_path)
    assert out["compiled"]["mode"] == "commands", out["compiled"]      # strict mode, yet no error
    assert out["compiled"]["note"] == "steps on several devices run as commands", out["compiled"]
    assert out["graph_on_gpu1"] == "cuda graph", out
    assert out["cache_hits"] >= 2, out
    assert out["stats"] == [0, 0], out                                  # every free was issued
    assert out["context_errors"] == [], out["context_errors"]          # each on its own GPU's stream


def test_a_gpu_index_past_the_visible_ones_names_the_op_the_index_the_count_and_cuda_visible_devices(tmp_path):
    out = _fake(tmp_path)
    for op, index in (("array", 2), ("new_stream", 5)):
        msg = out[op]
        assert msg.startswith(f"{op}: no GPU {index} (gpu:{index})"), msg
        assert "sees 2 GPU(s)" in msg and "CUDA_VISIBLE_DEVICES" in msg and "below 2" in msg, msg


def test_the_fake_driver_reports_a_call_made_with_another_gpus_context_current(tmp_path):
    """The checks above can fail: with contexts never switched, calls on gpu:1's streams run with
    gpu:0's context current and the fake driver refuses them."""
    out = _fake(tmp_path, no_context_switch=True)
    assert out["returncode"] != 0 and "CUDA_ERROR_INVALID_CONTEXT" in out["out"], out["out"][-3000:]


# -- on two real GPUs: values against numpy ---------------------------------------------------------


@pytest.fixture(params=[1, 4], ids=["1 lane", "4 lanes"])
def lanes(request) -> int:
    return request.param


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_ops_mixing_arrays_of_two_gpus_match_numpy(two_gpus, lanes, dtype, rng):
    g0, g1 = two_gpus
    s0, s1 = lf.new_stream(g0, lanes=lanes), lf.new_stream(g1, lanes=lanes)
    a, b = random_array(rng, (16, 16), dtype), random_array(rng, (16, 16), dtype)
    x, y = lf.array(a, stream=s0), lf.array(b, stream=s1)
    got = [lf.add(x, y, stream=s0), lf.multiply(x, y, stream=s1), lf.matmul(x, y, stream=s1),
           lf.concatenate([x, y], axis=0, stream=s0), lf.sum(lf.subtract(y, x, stream=s1), axis=0, stream=s0)]
    want = [a + b, a * b, a @ b, np.concatenate([a, b]), (b - a).sum(axis=0)]
    assert [r.device for r in got] == [g0, g1, g1, g0, g0]
    for r, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(r), w, rtol=1e-5 if dtype == "float32" else 1e-12)


def test_a_chain_bouncing_between_two_gpus_matches_numpy_with_delays(two_gpus, lanes, rng):
    """Each step runs on the other GPU than the last, so every step is a peer copy after a wait across
    devices; random delays in every command would expose a missing wait."""
    streams = [lf.new_stream(d, lanes=lanes) for d in two_gpus]
    a = rng.uniform(-1, 1, (64, 64))
    x, r = lf.array(a, stream=streams[0]), a.copy()
    with lf.testing.inject_delays(0.002, seed=int(rng.integers(1 << 30))):
        for k in range(24):
            x = lf.tanh(x * 1.5 + 0.25, stream=streams[k % 2])
            r = np.tanh(r * 1.5 + 0.25)
        lf.eval(x)
    assert x.device == two_gpus[1]
    np.testing.assert_allclose(np.asarray(x), r, rtol=1e-12, atol=1e-12)


def test_several_streams_on_each_of_two_gpus_match_numpy(two_gpus, rng):
    streams = [lf.new_stream(d, lanes=k) for d in two_gpus for k in (1, 3)]
    hosts = [rng.uniform(-1, 1, (32, 32)) for _ in streams]
    xs = [lf.array(h, stream=s) for h, s in zip(hosts, streams)]
    refs = list(hosts)
    with lf.testing.inject_delays(0.001, seed=int(rng.integers(1 << 30))):
        for k in range(12):
            i, j, s = k % 4, (k + 1) % 4, streams[(k + 2) % 4]
            xs[i] = lf.add(lf.matmul(xs[i], xs[j], stream=s) * 0.1, xs[j], stream=s)
            refs[i] = (refs[i] @ refs[j]) * 0.1 + refs[j]
        lf.eval(*xs)
    for x, r in zip(xs, refs):
        np.testing.assert_allclose(np.asarray(x), r, rtol=1e-10, atol=1e-12)


def test_results_after_the_other_gpus_inputs_were_freed_match_numpy(two_gpus, rng):
    """Memory of one GPU that the other read through a peer copy is freed once that copy ran; reusing
    it at once (new arrays of the same size on its GPU) must not change what the copy read."""
    g0, g1 = two_gpus
    s0, s1 = lf.new_stream(g0, lanes=2), lf.new_stream(g1, lanes=2)
    outs, refs = [], []
    for k in range(8):
        h = rng.uniform(-1, 1, (256, 256))
        src = lf.exp(lf.array(h, stream=s0), stream=s0)
        outs.append(lf.add(src, float(k), stream=s1))
        refs.append(np.exp(h) + k)
        del src
        gc.collect()
        lf.async_eval(outs[-1])
        lf.async_eval(lf.full((256, 256), -1.0, stream=s0))   # may take the freed memory
    lf.synchronize()
    for o, r in zip(outs, refs):
        np.testing.assert_allclose(np.asarray(o), r, rtol=1e-12)


def test_compiled_functions_over_two_gpus_equal_numpy(two_gpus, rng):
    g0, g1 = two_gpus
    s1 = lf.new_stream(g1, lanes=2)
    f = lf.compile(lambda a, b: lf.matmul(lf.tanh(a), b, stream=s1) + 1.0)
    for _ in range(4):   # traced, planned, then replayed
        a, b = rng.uniform(-1, 1, (16, 16)), rng.uniform(-1, 1, (16, 16))
        got = f(lf.array(a, device=g0), lf.array(b, device=g1))
        np.testing.assert_allclose(np.asarray(got), np.tanh(a) @ b + 1.0, rtol=1e-12)
    assert f.stats()[0]["note"] == "steps on several devices run as commands", f.stats()
