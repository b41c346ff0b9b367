"""The CPU target of issue 15 without other rows in between: the small GPT-2-like model of ``bench gpt2
--device cpu`` (lf.nn, or with ``--plain`` the very code numpy runs; B=1, 8 tokens, float32) on one
lane, cache hits, against the same forward in numpy, taking turns in one process; prints three rounds,
with the split into graph building and eval.

    python tools/cpu_gpt2_alone.py [batch] [--plain]
"""
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
import laneflow as lf  # noqa: E402
from laneflow.bench.suites.gpt2 import CPU_CONFIG as cfg  # noqa: E402
from laneflow.models import gpt2  # noqa: E402


OPS = gpt2.LANEFLOW_OPS if "--plain" in sys.argv else gpt2.NN_OPS


def main() -> None:
    B = int(next((a for a in sys.argv[1:] if a.isdigit()), 1))
    st = lf.new_stream(lf.Device("cpu"), lanes=1)
    w = {k: v.astype(np.float32) for k, v in gpt2.numpy_params(cfg, seed=0).items()}
    params = {k: lf.array(v, stream=st) for k, v in w.items()}
    ids_np = np.random.default_rng(0).integers(0, cfg.vocab_size, (B, 8)).astype(np.int32)
    ids = lf.array(ids_np, stream=st)
    lf.eval(list(params.values()) + [ids])

    def step():
        with lf.stream(st):
            y = gpt2.forward(params, ids, cfg, OPS)
        lf.eval(y)

    def npstep():
        return gpt2.forward(w, ids_np, cfg, gpt2.NUMPY_OPS)

    for _ in range(20):
        step()
        npstep()
    n = 300
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            step()
        a = (time.perf_counter() - t) / n
        t = time.perf_counter()
        for _ in range(n):
            npstep()
        b = (time.perf_counter() - t) / n
        tb = te = 0.0
        for _ in range(n):
            t0 = time.perf_counter()
            with lf.stream(st):
                y = gpt2.forward(params, ids, cfg, OPS)
            t1 = time.perf_counter()
            lf.eval(y)
            tb, te = tb + t1 - t0, te + time.perf_counter() - t1
        name = "plain" if OPS is gpt2.LANEFLOW_OPS else "lf.nn"
        print(f"{name} {a * 1e6:.0f} us (build {tb / n * 1e6:.0f}, eval {te / n * 1e6:.0f}), numpy {b * 1e6:.0f} us,"
              f" ratio {a / b:.2f}")


if __name__ == "__main__":
    main()
