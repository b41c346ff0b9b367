"""distributed: collectives between processes on CPU arrays through MPI (``lf.distributed``).

The suite launches ``mpiexec -n 2 python -m laneflow.bench.dist_worker`` (the MPICH wheel of the
``distributed`` extra) and reports rank 0's figures:

- all-reduce of 1 to 64 MiB of float32 (``--quick``: 1 and 4): laneflow's ``all_reduce`` against
  mpi4py's ``Allreduce`` on the same buffers (the transport alone, the floor laneflow adds to), with
  the bus bandwidth 2 (n - 1) / n x bytes / time, as nccl-tests and torch report it (on GPUs timed as
  nccl-tests does: 20 back to back, one wait, time per all-reduce);
- a data-parallel step (8 layers of 1024 x 1024 float32, a batch of 512; quick: 4 layers of 256): each
  layer's gradient is all-reduced as soon as it is made, and the rows "compute alone" and "all-reduces
  alone" give the share of the communication hidden behind compute,
  (compute + all-reduces - step) / all-reduces;
- GPT-2 small (quick: tiny) split over the ranks (``models/gpt2_tp.py``, compiled, bfloat16 on GPUs)
  against the whole model on one rank.

On a GPU machine the same rows run again on GPU arrays, one process per visible GPU (``mpiexec -n
<GPUs>``, rank r on GPU r), collectives through NCCL, against torch.distributed's NCCL all-reduce in the
same processes, from 1 MiB to 1 GiB. With one GPU that is one rank: NCCL's all-reduce is then a copy
and its bus bandwidth 0 by definition; the rows still compare the two launch paths end to end.

Every rank checks its results against numpy; a row says ``ok`` only when all did. Rank 0 reports each
part's end on stderr as it comes (a launch prints nothing else until its table). Each launch is given
``LANEFLOW_BENCH_DIST_TIMEOUT`` seconds (600) and becomes an error row naming the timeout after that;
``LANEFLOW_BENCH_DIST_CPU=0`` leaves out the CPU launch on a GPU machine (its float32 GPT-2 and
data-parallel rows take minutes there).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ...distributed import mpi
from ..harness import Case, Result, skipped, suite

RANKS = 2


@suite("distributed", "collectives between processes: all-reduce bandwidth and a data-parallel step (CPU: MPI, "
                      "2 processes; GPU: NCCL, a process per GPU, against torch.distributed)")
def run(ctx):
    p = ctx.size(quick=dict(sizes="1,4", layers=4, width=256, batch=128),
                 cpu=dict(sizes="1,4,16,64", layers=8, width=1024, batch=512),
                 gpu=dict(sizes="1,4,16,64", layers=8, width=1024, batch=512))
    gpu = ctx.device.type == "gpu"
    rows = _launch(ctx, "cpu", RANKS, p) if not gpu or os.environ.get("LANEFLOW_BENCH_DIST_CPU", "1") != "0" else []
    if gpu:
        from ...runtime.backend import backend_for
        rows += _launch(ctx, "gpu", backend_for(ctx.device).count, dict(p, sizes="1,4" if ctx.quick else GPU_SIZES))
    return rows


#: all-reduce sizes on GPUs (MiB): 1 MiB to 1 GiB, as the issue asks
GPU_SIZES = "1,4,16,64,256,1024"


def _launch(ctx, device: str, ranks: int, p: dict) -> list[Result]:
    what = "CPU, MPI" if device == "cpu" else "GPU, NCCL"
    head = Case("distributed", f"all-reduce over {ranks} processes ({what})", {}, None)
    how = mpi.launch(ranks)
    if how is None:
        return [skipped(head, "laneflow", "mpi4py or mpiexec missing: pip install 'laneflow[distributed]'")]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "dist.json")
        env = dict(os.environ, **how[1])
        src = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [*how[0], sys.executable, "-m", "laneflow.bench.dist_worker", out,
               "--repeat", str(ctx.repeat), "--sizes-mib", p["sizes"], "--layers", str(p["layers"]),
               "--width", str(p["width"]), "--batch", str(p["batch"]), "--device", device]
        limit = float(os.environ.get("LANEFLOW_BENCH_DIST_TIMEOUT", "600"))
        # stderr passes through (rank 0's progress lines); a session of its own, so that a timeout
        # stops the ranks too (a rank stuck in a collective would outlive mpiexec killed alone)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
        try:
            printed, _ = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            res = Result("distributed", head.name, "laneflow", lanes=1)
            res.error = (f"mpiexec -n {ranks} ({what}) did not finish within {limit:g} s "
                         "(LANEFLOW_BENCH_DIST_TIMEOUT); its last progress line above says how far it got")
            return [res]
        if proc.returncode != 0 or not os.path.exists(out):
            res = Result("distributed", head.name, "laneflow", lanes=1)
            res.error = f"mpiexec rc={proc.returncode}: {(printed or '')[-300:]} (its errors are above, on stderr)"
            return [res]
        with open(out) as f:
            data = json.load(f)
    return _allreduce_rows(data, what) + _data_parallel_rows(data, what) + _gpt2_rows(data, what)


def _busbw(nbytes: int, seconds: float, n: int) -> float:
    return 2 * (n - 1) / n * nbytes / seconds


def _allreduce_rows(data: dict, what: str) -> list[Result]:
    n, rows = data["ranks"], []
    ok = data["ok_every_rank"]
    gpu = data.get("device") == "gpu"
    for r in data["allreduce"]:
        k = r.get("inflight", 1)
        flight = f"{k} in flight, then one wait; per all-reduce" if k > 1 else "one at a time"
        peer = (("torch.distributed all_reduce", "peer", f"NCCL, in place (checked once out of place); {flight}")
                if gpu else ("mpi4py Allreduce", "peer", f"the transport alone, same buffers; {flight}"))
        name = f"all-reduce of {r['mib']} MiB float32 over {n} processes ({what})"
        for impl, key, note in (("laneflow all_reduce", "laneflow", f"out of place, issued on the communication "
                                                                   f"lane; {flight}"), peer):
            res = Result("distributed", name, impl, lanes=1, times=r[key], bytes=r["bytes"], checked=True,
                         matches=bool(ok and r["ok"]), note=note)
            res.extra["bus_GB_s"] = round(_busbw(r["bytes"], statistics.median(r[key]), n) / 1e9, 3)
            rows.append(res)
    return rows


def _data_parallel_rows(data: dict, what: str) -> list[Result]:
    dp, n = data["data_parallel"], data["ranks"]
    name = (f"data-parallel step over {n} processes ({what}): {dp['layers']} layers {dp['width']}x{dp['width']} float32, "
            f"batch {dp['batch']}, each gradient all-reduced (avg) as it is made")
    med = {k: statistics.median(dp[k]) for k in ("step", "compute", "comm")}
    # (clamped to 0..1: a step measured faster than its compute alone is noise, not more than all hidden)
    hidden = min(max((med["compute"] + med["comm"] - med["step"]) / med["comm"], 0.0), 1.0) if med["comm"] > 0 else 0.0
    rows = []
    for impl, key, note in (("laneflow step", "step", f"{hidden:.0%} of the all-reduce time hidden "
                                                      "behind compute"),
                            ("laneflow compute alone", "compute", "the same step without all-reduces"),
                            ("laneflow all-reduces alone", "comm", f"{dp['grad_bytes'] >> 20} MiB of gradients")):
        res = Result("distributed", name, impl, lanes=2, times=dp[key], checked=key == "step",
                     matches=bool(data["ok_every_rank"] and dp["ok"]) if key == "step" else None, note=note)
        if key == "step":
            res.extra["hidden_fraction"] = round(hidden, 3)
        rows.append(res)
    return rows


def _gpt2_rows(data: dict, what: str) -> list[Result]:
    tp, n = data["gpt2_tp"], data["ranks"]
    name = f"GPT-2 {tp['model']} forward, 1 x 16 tokens, {tp['dtype']}: tensor-parallel over {n} processes ({what}) vs one"
    ok = bool(data["ok_every_rank"] and tp["ok"])
    return [Result("distributed", name, f"laneflow tensor-parallel, {n} ranks", lanes=4, times=tp["split"], checked=True,
                   matches=ok, note=f"compiled; two all-reduces per block; logits vs the whole model: "
                                    f"{tp['rel_err']:.1e} of max |logit|"),
            Result("distributed", name, "laneflow whole model, 1 rank", lanes=4, times=tp["one"],
                   note="compiled; rank 0 alone, the others waiting")]
