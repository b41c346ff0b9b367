"""Device time per kernel of one GPT-2 small forward (bf16, B x 16 tokens), under Nsight Compute.

    ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \\
        python3 tools/kernel_times.py --model nn > ncu-nn.csv
    python3 tools/kernel_times.py --summary ncu-nn.csv      # a table: kernel, launches, total µs

The script warms up with two forwards (kernels compiled, cuBLASLt plans made), then runs one more
between ``cuProfilerStart``/``cuProfilerStop`` (run ncu with ``--profile-from-start off`` to profile
that forward alone). The kernels' summed device time against the compiled forward's time
(``bench gpt2``) says how much of it is kernels and how much is gaps between them.
"""

from __future__ import annotations

import argparse
import collections
import csv
import sys

import numpy as np


def run(model_kind: str, batch: int) -> None:
    import laneflow as lf
    from cuda.bindings import driver as cu
    from laneflow.graph import eval_cache
    from laneflow.models import gpt2

    cfg = gpt2.GPT2Config()
    ops = gpt2.NN_OPS if model_kind == "nn" else gpt2.LANEFLOW_OPS
    with lf.stream(lf.new_stream(lf.gpu, lanes=1)):
        params = gpt2.init_params(cfg, seed=0, dtype=lf.bfloat16)
        ids = lf.array(np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, 16)).astype(np.int32)) + 0
        lf.eval(ids, *params.values())
        with eval_cache.bypass():
            for _ in range(2):
                lf.eval(gpt2.forward(params, ids, cfg, ops))
            lf.synchronize()
            cu.cuProfilerStart()
            lf.eval(gpt2.forward(params, ids, cfg, ops))
            lf.synchronize()
            cu.cuProfilerStop()


def summary(path: str) -> None:
    total: dict = collections.defaultdict(float)
    count: collections.Counter = collections.Counter()
    with open(path) as f:
        rows = [r for r in csv.reader(line for line in f if line.startswith('"'))]
    head = rows[0]
    k_name, k_metric, k_value = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
    for r in rows[1:]:
        if r[k_metric] == "gpu__time_duration.sum":
            name = r[k_name].split("(")[0][:60]
            total[name] += float(r[k_value].replace(",", "")) / 1e3  # ns -> us
            count[name] += 1
    print(f"{'kernel':60s} {'launches':>8s} {'total us':>10s}")
    for name, us in sorted(total.items(), key=lambda kv: -kv[1]):
        print(f"{name:60s} {count[name]:8d} {us:10.1f}")
    print(f"{'all kernels':60s} {sum(count.values()):8d} {sum(total.values()):10.1f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("nn", "plain"), default="nn")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--summary", metavar="CSV", help="summarise an ncu CSV instead of running")
    a = ap.parse_args()
    summary(a.summary) if a.summary else run(a.model, a.batch)
    sys.exit(0)
