"""lf.distributed: launcher variables, the rendezvous, a group of one on every backend, and real
multi-process collectives through MPI (mpiexec -n 2 and 4, tests/dist_worker.py) checked against numpy."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import laneflow as lf
from laneflow import distributed as dist
from laneflow.distributed import mpi, rendezvous
from laneflow.distributed.launch import detect

WORKER = Path(__file__).with_name("dist_worker.py")


# -- launchers ---------------------------------------------------------------------------------------

def test_torchrun_variables_give_rank_world_local_rank_and_the_master():
    info = detect({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                   "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500"})
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == ("torchrun", 3, 8, 1, 2)
    assert (info.master_addr, info.master_port, info.under_mpi) == ("10.0.0.5", 29500, False)


@pytest.mark.parametrize("env, want", [
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, ("openmpi", 2, 4, 0, 2)),
    ({"PMI_RANK": "1", "PMI_SIZE": "3", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "3"}, ("mpich", 1, 3, 1, 3)),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2(x3)"},
     ("slurm", 5, 6, 1, 2)),
    ({}, ("none", 0, 1, 0, 1)),
])
def test_mpi_and_slurm_variables_and_no_launcher(env, want):
    info = detect(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == want
    assert info.under_mpi == (want[0] in ("openmpi", "mpich"))


@pytest.mark.parametrize("env, words", [
    ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK=4"),
    ({"RANK": "x", "WORLD_SIZE": "4"}, "RANK='x' is not an integer"),
    ({"RANK": "1", "WORLD_SIZE": "2"}, "MASTER_ADDR and MASTER_PORT"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, "MASTER_PORT=70000"),
])
def test_malformed_launcher_variables_are_named(env, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        detect(env)


# -- rendezvous ----------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("version, root_env", [("mpiexec (Open MPI) 4.1.6", True),
                                                ("HYDRA build details:\n    Version: 4.2.0", False)])
def test_the_launch_lets_open_mpi_start_as_root_and_leaves_mpich_alone(tmp_path, monkeypatch, version, root_env):
    exe = tmp_path / "mpiexec"
    exe.write_text(f"#!/bin/sh\necho '{version}'\n")
    exe.chmod(0o755)
    monkeypatch.setattr(mpi, "mpiexec", lambda: str(exe))
    monkeypatch.setattr(mpi, "_VENDOR", {})
    head, _ = mpi.launch(3)
    assert head == [str(exe), "-n", "3"]
    for k in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "OMPI_MCA_rmaps_base_oversubscribe",
              "PRTE_MCA_rmaps_default_mapping_policy"):
        monkeypatch.delenv(k, raising=False)
    want = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "true",
            "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe"} if root_env else {}
    assert mpi.launch(3)[1] == want
    monkeypatch.setenv("OMPI_MCA_rmaps_base_oversubscribe", "false")  # the caller's own setting stays
    assert "OMPI_MCA_rmaps_base_oversubscribe" not in mpi.launch(3)[1]
    assert mpi.describe() == f"{exe} (" + ("Open MPI: may start as root and oversubscribe" if root_env
                                            else "MPICH or other") + ")"
    monkeypatch.setattr(mpi, "mpiexec", lambda: None)
    assert mpi.launch(2) is None
    assert mpi.describe().startswith("none (pip install")


def test_rendezvous_gives_rank_zeros_bytes_to_every_rank():
    port, n = _free_port(), 4
    payload = os.urandom(128)
    got: dict = {}

    def rank(r):
        got[r] = rendezvous.exchange("127.0.0.1", port, r, n, payload if r == 0 else None, key="t", timeout=20)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (3, 1, 2, 0)]  # rank 0 not first
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(30)
    assert got == {r: payload for r in range(n)}


def test_rendezvous_ignores_a_stranger_and_names_the_missing_rank():
    port = _free_port()
    err: list = []

    def root():
        try:
            rendezvous.exchange("127.0.0.1", port, 0, 3, b"id", timeout=1.5)
        except rendezvous.RendezvousError as e:
            err.append(e)

    t = threading.Thread(target=root)
    t.start()
    time.sleep(0.2)
    with socket.create_connection(("127.0.0.1", port)) as s:  # not one of ours
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
    t0 = time.monotonic()
    t.join(10)
    assert err and "ranks [1, 2] did not reach rank 0" in str(err[0]), err
    assert time.monotonic() - t0 < 5


def test_a_rank_without_rank_zero_fails_within_its_timeout():
    t0 = time.monotonic()
    with pytest.raises(rendezvous.RendezvousError, match="could not get the id from rank 0"):
        rendezvous.exchange("127.0.0.1", _free_port(), 2, 3, None, timeout=0.8)
    assert time.monotonic() - t0 < 5


# -- a group of one -------------------------------------------------------------------------------------

@pytest.fixture
def world():
    dist.destroy()
    g = dist.init(env={})
    yield g
    dist.destroy()


def test_a_group_of_one_copies_on_every_backend(device, rng, world):
    assert (world.rank, world.size, world.backend) == (0, 1, "local")
    s = lf.new_stream(device, lanes=2)
    a = rng.standard_normal((4, 3)).astype(np.float32)
    with lf.stream(s):
        x = lf.array(a)
        outs = [dist.all_reduce(x), dist.all_reduce(x, "avg"), dist.all_gather(x, axis=1),
                dist.reduce_scatter(x), dist.broadcast(x, 0), dist.all_reduce(x * 2) + 1]
    for got, want in zip(outs, [a, a, a, a, a, a * 2 + 1]):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    dist.barrier(stream=s)
    f = lf.compile(lambda v: dist.all_reduce(v, "max") - v)
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(f(x)), np.zeros_like(a))
    # a copy is no call between processes: the whole plan becomes the backend's executor
    assert f.stats()[0]["mode"] == ("cuda graph" if device.type == "gpu" else "one command")
    s.close()


def _nccl_or_skip():
    if not lf.gpu_available():
        pytest.skip("no GPU: NCCL needs one")
    try:
        from laneflow.distributed import nccl
        return nccl.version()
    except dist.DistributedError as e:
        pytest.skip(f"NCCL unavailable: {str(e)[:120]}")


@pytest.fixture
def nccl_world():
    _nccl_or_skip()
    dist.destroy()
    g = dist.init(gpu="nccl", env={})
    yield g
    dist.destroy()


def test_nccl_group_of_one_equals_numpy_eager_and_in_a_cuda_graph(nccl_world, rng):
    """NCCL on one GPU, rank 0 of 1: every collective, every dtype NCCL moves, on laneflow's streams;
    then the same collectives captured into lf.compile's CUDA graph, mixed with eager ones."""
    s = lf.new_stream(lf.gpu, lanes=2)
    for dtype in ("float32", "bfloat16", "float16", "float64", "int32", "int64", "int8", "uint8", "complex64"):
        a = (rng.standard_normal((6, 4)) * 10).astype(np.float32)
        a = a.astype(dtype) if dtype != "bfloat16" else a
        with lf.stream(s):
            x = lf.array(a).astype(dtype)
            ref = np.asarray(x)
            outs = [dist.all_reduce(x), dist.all_gather(x, axis=1), dist.reduce_scatter(x), dist.broadcast(x, 0)]
            if np.dtype(ref.dtype).kind == "f" or dtype == "bfloat16":
                outs.append(dist.all_reduce(x, "avg"))
            if np.dtype(ref.dtype).kind != "c":
                outs += [dist.all_reduce(x, "max"), dist.all_reduce(x, "min"), dist.all_reduce(x, "prod")]
        for got in outs:
            np.testing.assert_array_equal(np.asarray(got), ref, err_msg=dtype)
    t = nccl_world.transports[lf.gpu.type]
    assert t.name == "nccl" and t.seq >= 9 * 4
    flags = lf.array(rng.standard_normal(5) > 0)
    np.testing.assert_array_equal(np.asarray(dist.all_reduce(flags, "max")), np.asarray(flags))
    dist.barrier(stream=s)

    f = lf.compile(lambda v, w: dist.all_reduce(v * 2, "sum") + dist.all_gather(w, axis=0).sum())
    for _ in range(4):
        v = rng.standard_normal((8, 16)).astype(np.float32)
        w = rng.standard_normal((3,)).astype(np.float32)
        with lf.stream(s):
            eager = dist.all_reduce(lf.array(v))  # an eager collective between graph launches
            got = f(lf.array(v), lf.array(w))
        want = v * 2 + w.sum()
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        np.testing.assert_array_equal(np.asarray(eager), v)
    st = f.stats()[0]
    assert st["mode"] == "cuda graph" and st["launches"] >= 2, st
    assert nccl_world.broken is None and not t.failed
    s.close()


_STUCK = r'''
import laneflow as lf
from laneflow import distributed as dist
g = dist.init(gpu="nccl", timeout=0.5, env={})
spin = lf.cuda.kernel("""extern "C" __global__ void spin(float* out, int seconds) {
    for (int i = 0; i < 2 * seconds; ++i) {  // half a second at most clock rates, each turn
        long long t0 = clock64();
        while (clock64() - t0 < 1000000000LL) { }
    }
    out[0] = 1.0f;
}""", "spin", num_inputs=0, scalars=("int32",))
s = lf.new_stream(lf.gpu, lanes=1)


def step(seconds):
    with lf.stream(s):
        flag = spin(outputs=[((1,), lf.float32)], grid=1, block=1, scalars=(seconds,))
        y = dist.all_reduce(x + flag.sum())  # behind the spinning kernel
        return y * 3


x = lf.ones((4,), dtype=lf.float32, stream=s)
lf.eval(step(0))  # the communicator and every kernel exist before the clock starts
z = step(2)  # about 2 s
try:
    lf.eval(z)
    print("EVAL PASSED")
except Exception as e:
    print("EVAL RAISED", type(e).__name__, e)
print("BROKEN", g.broken)
try:
    dist.all_reduce(x)
except Exception as e:
    print("AFTER", type(e).__name__, e)
'''


def test_a_nccl_collective_stuck_past_the_timeout_fails_its_values_and_breaks_the_group():
    """The watchdog: a collective queued behind a kernel that spins longer than the group's timeout
    is failed, the communicator aborted, and its value (and what is computed from it) raises at the
    host wait naming the op; the group then refuses new collectives. In a process of its own: an
    aborted communicator may leave the CUDA context unusable."""
    _nccl_or_skip()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(lf.__file__).parents[1]),
                                                         os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", _STUCK], capture_output=True, text=True, timeout=120, env=env)
    out = r.stdout + r.stderr
    assert "EVAL RAISED DistributedError all_reduce (collective #2)" in out and "within 0.5 s" in out, out
    assert "BROKEN all_reduce (collective #2) failed" in out, out
    assert "AFTER DistributedError all_reduce: this group is broken" in out, out


def test_nccl_errors_say_what_to_do(monkeypatch):
    from laneflow.distributed import nccl
    monkeypatch.setattr(nccl, "_lib", None)
    for name in ("nccl", "nccl.bindings", "nccl.bindings.nccl"):
        monkeypatch.setitem(sys.modules, name, None)  # nccl4py absent (or imported already)
    with pytest.raises(dist.DistributedError, match=r"need nccl4py.*pip install 'laneflow\[nccl\]'"):
        nccl.bindings()
    with pytest.raises(ValueError, match="gpu must be one of"):
        dist.init(gpu="gloo", env={})
    with pytest.raises(dist.DistributedError, match="gpu='local' is one process"):
        dist.init(gpu="local", env={"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"})
    info = detect({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    assert rendezvous.port(info, {}) == 29501 and rendezvous.port(info, {"LANEFLOW_RDZV_PORT": "4000"}) == 4000
    with pytest.raises(rendezvous.RendezvousError, match="LANEFLOW_RDZV_PORT='x' is not a port"):
        rendezvous.port(info, {"LANEFLOW_RDZV_PORT": "x"})
    g = dist.Group(detect({}), 1.0, "local", transports={"gpu": type("T", (), {"device": lf.Device("gpu", 0)})()})
    assert g.transport(lf.Device("gpu", 0), "all_reduce") is g.transports["gpu"]
    with pytest.raises(dist.DistributedError, match=r"all_reduce: the array is on gpu:1, but this rank's "
                                                    r"communicator is on gpu:0 .*x.to_device\('gpu:0'\)"):
        g.transport(lf.Device("gpu", 1), "all_reduce")
    assert nccl._NCCL_DTYPE[np.dtype(lf.bfloat16)] == 9 and nccl._NCCL_DTYPE[np.dtype("float32")] == 7


def test_collectives_run_on_the_groups_communication_lane(world):
    s = lf.new_stream(lf.cpu, lanes=2)
    with lf.stream(s):
        y = dist.all_reduce(lf.arange(4.0))
    lane = world._lanes[lf.cpu]
    assert lane not in s.lanes and lane.submitted >= 1  # issued at the call, on its own lane
    np.testing.assert_array_equal(np.asarray(y + 1), np.arange(4.0) + 1)
    world.synchronize()


@pytest.mark.parametrize("call, exc, words", [
    (lambda x: dist.all_reduce(x, "mean"), ValueError, "op must be one of"),
    (lambda x: dist.all_reduce(x > 0), TypeError, "reduction 'sum' of a bool array; use 'max'"),
    (lambda x: dist.all_reduce(x.astype(lf.complex64), "max"), TypeError, "complex numbers have no order"),
    (lambda x: dist.all_reduce(x.astype(lf.int32), "avg"), TypeError, "'avg' of a int32 array"),
    (lambda x: dist.broadcast(x, 1), ValueError, "root 1 is not a rank of the group"),
    (lambda x: dist.all_gather(x[0, 0]), ValueError, "all_gather: x is 0-d"),
    (lambda x: dist.reduce_scatter(x, axis=2), ValueError, "axis 2 is out of bounds"),
    (lambda x: dist.send(x, 0), ValueError, "send: dst 0 is this rank"),
    (lambda x: dist.recv((2,), "float32", 3), ValueError, "src 3 is not a rank"),
    (lambda x: dist.all_reduce(x, group="world"), TypeError, "group must be an lf.distributed.Group"),
])
def test_bad_collective_arguments_name_the_op(world, call, exc, words):
    with pytest.raises(exc, match=words):
        call(lf.ones((4, 3), dtype=lf.float32))


def test_collectives_before_init_and_bad_init_arguments_say_what_to_do():
    dist.destroy()
    cpu_ones = lf.array(np.ones(3), device=lf.cpu)
    with pytest.raises(dist.DistributedError, match=r"all_reduce: lf.distributed.init\(\) has not been called"):
        dist.all_reduce(cpu_ones, stream=lf.cpu)
    with pytest.raises(ValueError, match="backend must be one of"):
        dist.init("gloo")
    with pytest.raises(ValueError, match="timeout must be positive"):
        dist.init(timeout=0, env={})
    with pytest.raises(dist.DistributedError, match="backend 'local' is one process"):
        dist.init("local", env={"PMI_RANK": "0", "PMI_SIZE": "2"})
    g = dist.init(env={"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    try:  # a torchrun launch without MPI: no CPU transport, and the error says what would give one
        with pytest.raises(dist.DistributedError, match="CPU collectives between processes need an MPI launch"):
            dist.all_reduce(cpu_ones, stream=lf.cpu)
        assert dist.get_world_size() == 2 and dist.get_rank() == 0 and dist.init() is g
    finally:
        dist.destroy()


# -- many processes, through MPI --------------------------------------------------------------------------

def _launch(n: int, scenario: str, seed: int = 0, timeout: float = 120, env: dict | None = None):
    how = mpi.launch(n)
    if how is None:
        pytest.skip("mpi4py or mpiexec missing: pip install 'laneflow[distributed]'")
    head, extra = how
    e = dict(os.environ)
    e.update(extra)
    e.update(env or {})
    e.setdefault("LANEFLOW_DIST_TIMEOUT", "60")
    src = str(Path(lf.__file__).resolve().parents[1])
    e["PYTHONPATH"] = src + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run([*head, sys.executable, str(WORKER), scenario, str(seed)],
                          capture_output=True, text=True, timeout=timeout, env=e)


def _oks(p, n: int, words: str) -> None:
    for r in range(n):
        assert f"rank {r} ok: {words}" in p.stdout, (p.returncode, p.stdout[-2000:], p.stderr[-3000:])


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("scenario, words", [("collectives", "collectives of 8 dtypes"), ("p2p", "ring"),
                                             ("compiled", "compiled data-parallel step"),
                                             ("gpt2_tp", "tensor-parallel GPT-2")])
def test_collectives_across_processes_equal_numpy(n, scenario, words):
    seed = int(np.random.default_rng().integers(1 << 20))
    p = _launch(n, scenario, seed)
    _oks(p, n, words)
    assert p.returncode == 0, p.stderr[-3000:]


def test_ranks_calling_different_shapes_fail_naming_both_and_stay_usable():
    p = _launch(3, "mismatch")
    _oks(p, 3, "mismatch: all_reduce: rank")
    _oks(p, 3, "usable after the mismatch")
    assert p.returncode == 0, p.stderr[-3000:]


def test_a_recv_of_another_shape_fails_naming_both_and_the_sender_is_not_left_waiting():
    p = _launch(2, "recv_mismatch", timeout=60)
    _oks(p, 1, "sent")
    assert "rank 1 ok: recv mismatch" in p.stdout, (p.stdout[-2000:], p.stderr[-2000:])
    assert p.returncode == 0, p.stderr[-3000:]


def test_a_peer_that_never_comes_fails_the_others_within_the_timeout():
    t0 = time.monotonic()
    p = _launch(3, "absent", env={"LANEFLOW_DIST_TIMEOUT": "3"}, timeout=60)
    for r in (0, 1):
        assert f"rank {r} ok: timed out after" in p.stdout, (p.stdout[-2000:], p.stderr[-2000:])
    assert "not every rank of the group took part within 3 s" in p.stdout
    assert time.monotonic() - t0 < 40


def test_bench_distributed_quick_runs_and_every_rank_agrees(tmp_path):
    if mpi.mpiexec() is None:
        pytest.skip("mpi4py or mpiexec missing: pip install 'laneflow[distributed]'")
    import json
    out = tmp_path / "d.json"
    src = str(Path(lf.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "laneflow", "bench", "distributed", "--quick", "--repeat", "3",
                        "--json", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    names = {r["impl"] for r in rows}
    assert {"laneflow all_reduce", "mpi4py Allreduce", "laneflow step", "laneflow compute alone"} <= names, names
    assert all(r["error"] is None for r in rows), rows
    assert all(r["matches"] for r in rows if r["impl"] in ("laneflow all_reduce", "laneflow step")), rows
    step = next(r for r in rows if r["impl"] == "laneflow step")
    assert "hidden_fraction" in step["extra"] and step["repeats"] == 3


def test_tensor_parallel_gpt2_shards_and_errors():
    """One process: the shards of every rank, put back together, are the whole model's parameters;
    a head count the ranks do not divide is refused naming both."""
    from laneflow.models import gpt2, gpt2_tp
    cfg = gpt2.GPT2Config.tiny()
    full = gpt2.numpy_params(cfg, seed=3)
    parts = [gpt2_tp.shard_params(full, cfg, r, 2) for r in range(2)]
    p = gpt2.PREFIX + "h.1."
    d = cfg.n_embd
    qkv = np.concatenate([np.concatenate([q[p + "attn.c_attn.weight"][:, k * d // 2:(k + 1) * d // 2] for q in parts],
                                         axis=1) for k in range(3)], axis=1)
    np.testing.assert_array_equal(qkv, full[p + "attn.c_attn.weight"])
    np.testing.assert_array_equal(np.concatenate([q[p + "mlp.c_proj.weight"] for q in parts]), full[p + "mlp.c_proj.weight"])
    np.testing.assert_array_equal(parts[1][p + "mlp.c_proj.bias"], full[p + "mlp.c_proj.bias"])  # added once, after the sum
    assert parts[0][p + "mlp.c_fc.weight"].shape == (d, 2 * d)
    with pytest.raises(ValueError, match="4 heads do not split over 3 ranks"):
        gpt2_tp.shard_params(full, cfg, 0, 3)
    lf_parts = gpt2_tp.shard_params(gpt2.to_laneflow(full), cfg, 1, 2)  # lf.Arrays shard the same way
    np.testing.assert_array_equal(np.asarray(lf_parts[p + "attn.c_attn.weight"]), parts[1][p + "attn.c_attn.weight"])


def test_tensor_parallel_gpt2_on_nccl_equals_the_whole_model_eager_and_in_a_cuda_graph(nccl_world):
    """A group of one through NCCL: the split model's two all-reduces per block run on the GPU's
    communication lane eagerly and inside lf.compile's CUDA graph, and the logits equal the model's."""
    from laneflow.models import gpt2, gpt2_tp
    cfg = gpt2.GPT2Config.tiny()
    full = gpt2.numpy_params(cfg, seed=1)
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 8))
    params = gpt2.to_laneflow(full, device=lf.gpu)
    want = np.asarray(gpt2.forward(params, lf.array(ids), cfg))
    local = gpt2.to_laneflow(gpt2_tp.shard_params(full, cfg, 0, 1), device=lf.gpu)
    got = np.asarray(gpt2_tp.forward(local, lf.array(ids), cfg))
    f = lf.compile(lambda p, i: gpt2_tp.forward(p, i, cfg))
    for _ in range(3):
        compiled = np.asarray(f(local, lf.array(ids)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    np.testing.assert_allclose(compiled, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert f.stats()[0]["mode"] == "cuda graph"
    assert nccl_world.transports["gpu"].seq >= 3 * 2 * cfg.n_layer  # two all-reduces per block, each call


# -- NCCL's host logic on the fake driver (tests/doubles/fake_nccl.py): runs without a GPU -------------

_FAKE_NCCL = r'''
import json, sys, time
sys.path.insert(0, sys.argv[1])
import fake_cuda
fake_cuda.install()
import numpy as np
import laneflow as lf
from laneflow import distributed as dist
import fake_nccl
fake_nccl.install()
MODE = "%s"
if MODE == "calls":
    g = dist.init(gpu="nccl", env={})
    s = lf.new_stream(lf.gpu, lanes=2)
    with lf.stream(s):
        x = lf.ones((6, 4), dtype=lf.float32)
        z = lf.ones((3,), dtype=lf.complex64)
        outs = [dist.all_reduce(x), dist.all_reduce(x.astype(lf.bfloat16), "max"), dist.all_gather(x, axis=0),
                dist.reduce_scatter(x, "avg"), dist.broadcast(x, 0), dist.all_reduce(z), dist.all_reduce(x[:0])]
    lf.eval(outs)
    dist.barrier(stream=s)
    comm = g._lanes[lf.gpu].handle
    eager = [(n, a) for n, a in fake_nccl.CALLS if n != "comm_init_rank"]
    f = lf.compile(lambda v: dist.all_reduce(v * 2) + dist.all_reduce(v, "min"))
    order = []  # (call, stream, event) of event records, waits and graph launches, in order
    calls = dict(fake_cuda.FAKES)
    def rec(ev, st, _f=calls["cuEventRecord"]):
        order.append(("record", int(st), int(ev)))
        return _f(ev, st)
    def wait(st, ev, flags, _f=calls["cuStreamWaitEvent"]):
        order.append(("wait", int(st), int(ev)))
        return _f(st, ev, flags)
    def launch(g, st, _f=calls.get("cuGraphLaunch", lambda *a: (fake_cuda.OK,))):
        order.append(("launch", int(st), 0))
        return _f(g, st)
    fake_cuda.FAKES.update(cuEventRecord=rec, cuStreamWaitEvent=wait, cuGraphLaunch=launch)
    for _ in range(3):
        with lf.stream(s):
            y = f(x)
        lf.eval(y)
    # around each launch: an event recorded on the communication lane and waited for by the launch's
    # stream before it; one recorded on the launch's stream and waited for by the lane after it
    def recorded_on(e, j):  # the stream event e was last recorded on before position j
        return next((t for c, t, x in reversed(order[:j]) if c == "record" and x == e), None)
    launches = [i for i, o in enumerate(order) if o[0] == "launch"]
    pinned = []
    for n, i in enumerate(launches):
        st = order[i][1]
        lo, hi = (launches[n - 1] + 1 if n else 0), (launches[n + 1] if n + 1 < len(launches) else len(order))
        waited_before = any(c == "wait" and t == st and recorded_on(e, j) == comm
                            for j, (c, t, e) in enumerate(order[lo:i], lo))
        waited_after = any(c == "wait" and t == comm and recorded_on(e, j) == st
                           for j, (c, t, e) in enumerate(order[i + 1:hi], i + 1))
        pinned.append([waited_before, waited_after])
    print(json.dumps({"pinned": pinned, "eager": [[n, list(a[2:5]) if n != "broadcast" else list(a[2:5]), a[-1] == comm] for n, a in eager],
                      "init": [list(a) for n, a in fake_nccl.CALLS if n == "comm_init_rank"],
                      "graph": f.stats()[0]["mode"], "stats": {k: v for k, v in f.stats()[0].items() if isinstance(v, (int, str))}, "seq": g.transports["gpu"].seq,
                      "compiled_calls": [n for n, a in fake_nccl.CALLS[len(eager) + 1:]]}))
else:
    g = dist.init(gpu="nccl", timeout=0.1, env={})
    s = lf.new_stream(lf.gpu, lanes=1)
    with lf.stream(s):
        x = lf.ones((4,), dtype=lf.float32)
    lf.eval(dist.all_reduce(x, stream=s))  # a collective that passes first
    f = lf.compile(lambda v: dist.all_reduce(v) + 1)
    for _ in range(3):
        with lf.stream(s):
            lf.eval(f(x))  # captured into a CUDA graph before anything fails
    nccl_t = g.transports["gpu"]
    t_end = time.monotonic() + 10
    while nccl_t._pending and time.monotonic() < t_end:  # the watchdog saw the passing ones pass (its
        time.sleep(0.01)                                  # thread may not have run yet: a busy host)
    assert not nccl_t._pending, nccl_t._pending
    real_query = fake_cuda.FAKES["cuEventQuery"]
    if MODE in ("stuck", "other"):  # the watchdog's events never pass: a collective waiting for a dead peer
        fake_cuda.FAKES["cuEventQuery"] = lambda ev: (fake_cuda.real.CUresult.CUDA_ERROR_NOT_READY,)
    else:
        fake_nccl.ASYNC_ERROR = 5
        fake_cuda.FAKES["cuEventQuery"] = lambda ev: (fake_cuda.real.CUresult.CUDA_ERROR_NOT_READY,)
    y = dist.all_reduce(x, stream=s) * 2
    if MODE == "other":  # another transport broke the group first: the stuck NCCL kernel is aborted anyway
        g.broken = "an MPI collective timed out"
    time.sleep(0.6)
    fake_cuda.FAKES["cuEventQuery"] = real_query
    try:
        lf.eval(y)
        print("EVAL PASSED")
    except dist.DistributedError as e:
        print("RAISED", e)
    print("ABORTED", sum(n == "comm_abort" for n, a in fake_nccl.CALLS), "BROKEN", g.broken)
    try:
        with lf.stream(s):
            lf.eval(f(x))
        print("COMPILED PASSED")
    except dist.DistributedError as e:
        print("COMPILED RAISED", e)
'''


def test_nccl_calls_on_the_fake_driver(tmp_path):
    """Each collective is the NCCL call it should be (count, dtype, reduction), on the group's
    communication lane's stream; complex moves as float pairs; an empty array calls nothing; a compiled
    function's collectives become one CUDA graph, its NCCL calls made once, at capture."""
    import json
    from conftest import run_under_fake_driver
    p = run_under_fake_driver(_FAKE_NCCL % "calls", tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["init"] == [[1, [1, 1, 1, 1], 0]]
    f32, bf16, c64 = 7, 9, 7
    assert out["eager"] == [
        ["all_reduce", [24, f32, 0], True], ["all_reduce", [24, bf16, 2], True], ["all_gather", [24, f32, 0xC0], True],
        ["reduce_scatter", [24, f32, 4], True], ["broadcast", [24, f32, 0], True], ["all_reduce", [6, c64, 0], True],
        ["all_reduce", [1, 1, 2], True]], out["eager"]   # the last: the barrier (one byte, max); x[:0] called nothing
    assert out["graph"] == "cuda graph"
    # the first call runs commands (two NCCL calls), each capture (one per output set) calls them once
    # more; launches call NCCL no more
    assert out["pinned"] and all(p == [True, True] for p in out["pinned"]), out["pinned"]
    st = out["stats"]
    assert st["launches"] >= 2 and out["compiled_calls"] == ["all_reduce"] * (2 + 2 * st["captures"]), out


@pytest.mark.parametrize("mode, words", [("stuck", "not every rank took part within 0.1 s"),
                                         ("async", "NCCL reported an asynchronous error"),
                                         ("other", "not every rank took part within 0.1 s")])
def test_the_nccl_watchdog_fails_a_stuck_collective_on_the_fake_driver(tmp_path, mode, words):
    """A stuck collective (or an asynchronous NCCL error) fails its value, aborts the communicator
    exactly once (also when another transport broke the group first), and a compiled function captured
    before then refuses to launch its graph on the aborted communicator."""
    from conftest import run_under_fake_driver
    p = run_under_fake_driver(_FAKE_NCCL % mode, tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    # (numbered after the compiled function's captures; the group is broken by the oldest collective
    # the watchdog still followed)
    assert re.search(r"RAISED all_reduce \(collective #\d+\) on gpu:0: " + words, p.stdout), p.stdout + p.stderr[-2000:]
    broken = "an MPI collective timed out" if mode == "other" else r"(all_reduce|compiled graph) \(collective #\d+\) failed"
    assert re.search(r"ABORTED 1 BROKEN " + broken, p.stdout), p.stdout
    assert "COMPILED RAISED compiled all_reduce: this group is broken" in p.stdout, p.stdout


def test_every_rank_exchanges_the_nccl_id_under_the_same_key(monkeypatch):
    """Each rank's communicator is on its own GPU, so the exchange's key is the group's communicator
    count, not the device (ranks on gpu:0 and gpu:1 must meet)."""
    from laneflow.distributed import nccl, rendezvous as rdzv
    monkeypatch.syspath_prepend(str(Path(__file__).with_name("doubles")))
    import fake_nccl
    monkeypatch.setattr(nccl, "_lib", fake_nccl.FakeNCCL())
    keys = []
    monkeypatch.setattr(rdzv, "exchange", lambda *a, key, timeout: keys.append(key) or b"\1" * 128)
    for rank in (0, 1):
        g = dist.Group(detect({"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                               "MASTER_PORT": "29500"}), 1.0, "local")
        nccl.unique_id_bytes(g, lf.Device("gpu", rank), None, 0)
    assert keys == ["nccl:0", "nccl:0"]
