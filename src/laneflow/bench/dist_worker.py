"""One rank of ``bench distributed`` (the suite launches it with mpiexec; rank 0 writes the JSON).

    mpiexec -n 2 python -m laneflow.bench.dist_worker OUT.json [--repeat 10] [--sizes-mib 1,4,16,64] [--device gpu]

Measures all-reduce time per size: on CPU arrays through MPI, laneflow's ``all_reduce`` against
mpi4py's ``Allreduce`` on the same buffers (the transport alone); on GPUs (``--device gpu``, rank r on
GPU LOCAL_RANK) through NCCL, against torch.distributed's NCCL all-reduce. And a data-parallel step whose
per-layer gradients are all-reduced as soon as each is made, against the same step's compute alone
and its all-reduces alone, which says how much of the communication the encoder hid behind compute.
Every rank checks its results against numpy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

import laneflow as lf
from laneflow import distributed as dist


def _turns(fns, repeat: int, comm) -> list[list[float]]:
    """Seconds per run of each of ``fns``: each warmed up, then one sample of each per repeat (taking
    turns, so they see the same machine load), every sample started together on every rank."""
    times: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        fn()
    for _ in range(repeat):
        for k, fn in enumerate(fns):
            comm.Barrier()
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return times


#: all-reduces in flight per sample on GPUs (nccl-tests' way: the bus bandwidth of back-to-back
#: collectives, one wait at the end), and on the CPU (MPI's calls block their lane: one per sample)
INFLIGHT = {"gpu": 20, "cpu": 1}


def allreduce_rows(g, comm, sizes_mib, repeat: int, device, peer) -> list[dict]:
    """laneflow's all_reduce against the peer's (mpi4py on the CPU, torch.distributed's NCCL on GPUs)
    per size, each checked once and then timed ``INFLIGHT`` at a time (seconds per all-reduce);
    ``peer(host)`` returns (check, run k, result-to-numpy) for the same values."""
    rows = []
    k = INFLIGHT[device.type]
    s = lf.new_stream(device, lanes=1)
    for mib in sizes_mib:
        n = mib * (1 << 20) // 4
        host = np.full(n, g.rank + 1, np.float32)
        want = np.float32(g.size * (g.size + 1) / 2)
        x = lf.array(host, stream=s)
        lf.eval(x)
        y = dist.all_reduce(x, stream=s)
        ok = bool(np.all(np.asarray(y)[:: max(1, n // 1000)] == want))
        del y

        def laneflow_run():
            y = None
            for _ in range(k):
                y = dist.all_reduce(x, stream=s)  # (the one before is dropped: its memory reused)
            lf.eval(y)  # the communication lane runs them in order: the last done, all are

        peer_check, peer_run, peer_result = peer(host)
        peer_check()
        ok = ok and bool(np.all(peer_result()[:: max(1, n // 1000)] == want))
        t_lf = [t / k for t in _turns([laneflow_run], repeat, comm)[0]]
        t_peer = [t / k for t in _turns([lambda: peer_run(k)], repeat, comm)[0]]
        rows.append({"mib": mib, "bytes": host.nbytes, "laneflow": t_lf, "peer": t_peer, "ok": ok, "inflight": k})
    s.close()
    return rows


def mpi_peer(comm):
    from mpi4py import MPI

    def make(host):
        recv = np.empty_like(host)

        def run(k):
            for _ in range(k):
                comm.Allreduce(host, recv, MPI.SUM)
        return (lambda: run(1)), run, (lambda: recv)
    return make


def torch_peer(g, comm, local: int):
    """torch.distributed with NCCL on this rank's GPU (rendezvous at a port rank 0 picks): checked out
    of place (a copy, then the in-place all-reduce), timed in place as it is used (no copy), k at a
    time, then torch.cuda.synchronize."""
    import socket

    import torch
    import torch.distributed as tdist
    port = None
    if g.rank == 0:
        with socket.socket() as sk:
            sk.bind(("127.0.0.1", 0))
            port = sk.getsockname()[1]
    port = comm.bcast(port, root=0)
    torch.cuda.set_device(local)
    tdist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=g.rank, world_size=g.size,
                             device_id=torch.device("cuda", local))

    def make(host):
        x = torch.from_numpy(host).cuda()
        y = torch.empty_like(x)

        def check():
            y.copy_(x)
            tdist.all_reduce(y)
            torch.cuda.synchronize()

        def run(k):
            for _ in range(k):
                tdist.all_reduce(y)  # (values grow: only the time is kept)
            torch.cuda.synchronize()
        return check, run, (lambda: y.cpu().numpy())
    return make


def data_parallel(g, comm, layers: int, width: int, batch: int, repeat: int, device) -> dict:
    """Per layer (last first): grad = x.T @ (x @ W) / batch, all-reduced (avg) at once, then applied."""
    rng = np.random.default_rng(7)
    ws_host = [rng.standard_normal((width, width)).astype(np.float32) / np.sqrt(width) for _ in range(layers)]
    x_host = np.random.default_rng(100 + g.rank).standard_normal((batch, width)).astype(np.float32)
    s = lf.new_stream(device, lanes=2)
    with lf.stream(s):
        ws = [lf.array(w) for w in ws_host]
        x = lf.array(x_host)
        noise = [lf.array(rng.standard_normal((width, width)).astype(np.float32)) for _ in range(layers)]
    lf.eval(ws, x, noise)
    out = {}

    def step(reduce: bool, compute: bool):
        new = []
        with lf.stream(s):
            for w, nz in zip(reversed(ws), noise):
                grad = (x.T @ (x @ w)) / batch if compute else nz
                if reduce:
                    grad = dist.all_reduce(grad, "avg")  # issued at once: its input is computed now
                else:
                    lf.async_eval(grad)  # the same issue pattern without the all-reduce
                new.append(w - 0.01 * grad)
        lf.eval(new)
        out["new"] = new[::-1]

    # the three variants take turns, one sample each per repeat, so they see the same machine load
    t_step, t_compute, t_comm = _turns([lambda: step(True, True), lambda: step(False, True),
                                        lambda: step(True, False)], repeat, comm)
    step(True, True)  # the step once more, to check
    got = [np.asarray(w) for w in out["new"]]
    xs = comm.allgather(x_host)
    ok = True
    for w0, w1 in zip(ws_host, got):
        grad = sum(a.T @ (a @ w0) for a in xs) / batch / g.size
        ok = ok and bool(np.allclose(w1, w0 - 0.01 * grad, rtol=1e-3, atol=1e-4))
    s.close()
    return {"layers": layers, "width": width, "batch": batch, "grad_bytes": layers * width * width * 4,
            "step": t_step, "compute": t_compute, "comm": t_comm, "ok": ok}


def gpt2_tp(g, comm, repeat: int, device, quick: bool) -> dict:
    """GPT-2 split over the ranks (``models/gpt2_tp.py``, compiled) against the whole model on one rank
    (rank 0 alone, the others waiting), the same ids; every rank's logits checked against the whole's."""
    from laneflow.models import gpt2, gpt2_tp as tp
    cfg = gpt2.GPT2Config.tiny() if quick else gpt2.GPT2Config()
    dtype = lf.bfloat16 if device.type == "gpu" else lf.float32
    full = gpt2.numpy_params(cfg, seed=0)
    ids_host = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 16))
    s = lf.new_stream(device, lanes=4)
    with lf.stream(s):
        local = gpt2.to_laneflow(tp.shard_params(full, cfg, g.rank, g.size), dtype=dtype, device=device)
        whole = gpt2.to_laneflow(full, dtype=dtype, device=device) if g.rank == 0 else None
        ids = lf.array(ids_host)
    split = lf.compile(lambda p, i: tp.forward(p, i, cfg, gpt2.NN_OPS, group=g))
    one = lf.compile(lambda p, i: gpt2.forward(p, i, cfg, gpt2.NN_OPS))
    out = {}

    def run_split():
        with lf.stream(s):
            out["split"] = split(local, ids)
        lf.eval(out["split"])

    def run_one():
        if g.rank == 0:
            with lf.stream(s):
                out["one"] = one(whole, ids)
            lf.eval(out["one"])

    t_split, t_one = _turns([run_split, run_one], repeat, comm)
    want = comm.bcast(np.asarray(out["one"]).astype(np.float32) if g.rank == 0 else None, root=0)
    got = np.asarray(out["split"]).astype(np.float32)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    s.close()
    return {"model": "tiny" if quick else "small", "dtype": str(np.dtype(dtype)), "split": t_split,
            "one": t_one, "rel_err": err, "ok": err < (3e-2 if dtype == lf.bfloat16 else 1e-4)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--sizes-mib", default="1,4,16,64")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--device", default="cpu", choices=("cpu", "gpu"),
                    help="gpu: each rank on GPU LOCAL_RANK, collectives through NCCL (peer: torch.distributed)")
    a = ap.parse_args()
    # gpu="nccl": NCCL even when the launch has one rank (one GPU), so the path measured is NCCL's
    g = dist.init(gpu="nccl")
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    if a.device == "cpu":
        device, peer = lf.cpu, mpi_peer(comm)
        # the ranks share the machine: BLAS threads per rank, so compute does not oversubscribe the cores
        from threadpoolctl import threadpool_limits
        threadpool_limits(max(1, (os.cpu_count() or 2) // (2 * g.size)))
    else:
        device, peer = lf.Device("gpu", g.local_rank), torch_peer(g, comm, g.local_rank)
    lf.set_default_device(device)  # (a GPU machine's default is the GPU: CPU rows pin the CPU)
    sizes = [int(v) for v in a.sizes_mib.split(",")]
    t0 = time.perf_counter()

    def progress(what: str) -> None:  # rank 0, on stderr, which the suite passes through as it comes
        if g.rank == 0:
            print(f"  distributed ({a.device}, {g.size} ranks): {what} at {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)

    progress("started (the group and the peer are up)")
    res = {"ranks": g.size, "device": a.device, "allreduce": allreduce_rows(g, comm, sizes, a.repeat, device, peer)}
    progress("all-reduce rows done")
    res["data_parallel"] = data_parallel(g, comm, a.layers, a.width, a.batch, a.repeat, device)
    progress("data-parallel step done")
    res["gpt2_tp"] = gpt2_tp(g, comm, a.repeat, device, quick=a.width < 512)
    progress("GPT-2 split over the ranks done")
    oks = comm.allgather(all(r["ok"] for r in res["allreduce"]) and res["data_parallel"]["ok"] and res["gpt2_tp"]["ok"])
    res["ok_every_rank"] = all(oks)
    if g.rank == 0:
        with open(a.out, "w") as f:
            json.dump(res, f)
        dp = res["data_parallel"]
        med = statistics.median
        print(f"data-parallel step {med(dp['step']) * 1e3:.2f} ms, compute {med(dp['compute']) * 1e3:.2f} ms, "
              f"all-reduces {med(dp['comm']) * 1e3:.2f} ms", flush=True)
    dist.destroy()
    if a.device == "gpu":
        import torch.distributed as tdist
        tdist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
