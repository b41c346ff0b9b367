"""Host cost per command of the uncached eager path: a chain of N tiny adds (16 float32) with
elementwise fusion off and the plan cache bypassed, so every add is one command of a graph seen for
the first time (issue 15). Prints the best of R chains, split into building and evaluating.
``--gpt2``: the same for GPT-2 small written with lf.nn (B=1, T=16; fusion as configured), the best
of R forwards (tools/profile_gpt2.py prints the mean and a profile).

    python tools/probe_host_path.py [--fake] [--n 2000] [--repeats 7] [--lanes 1] [--gpt2] [--profile]

``--fake`` runs the CUDA backend on the fake driver (tests/doubles/fake_cuda.py), which measures the
backend's Python cost; without it the default device runs.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sys
import time

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fake", action="store_true")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--lanes", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--gpt2", action="store_true")
    a = ap.parse_args()
    if a.fake:
        import fake_driver

        fake_driver.install()
    import laneflow as lf
    from laneflow.graph import eval_cache, fusion

    dev = lf.gpu if a.fake or lf.gpu_available() else lf.cpu
    s = lf.new_stream(dev, lanes=a.lanes)
    if a.gpt2:
        chain, what = _gpt2(lf, dev, s), "GPT-2 small lf.nn forward"
        a.n = 1
    else:
        fusion.set_enabled(False)
        x0 = lf.array(np.zeros(16, np.float32), stream=s)
        lf.eval(x0)
        what = f"chain of {a.n} adds"

        def chain():
            with lf.stream(s):
                x = x0
                for _ in range(a.n):
                    x = x + 1.0
            return x

    best_b = best_e = float("inf")
    with eval_cache.bypass():
        for _ in range(2):  # warm: kernels, pools
            lf.eval(chain())
        s.synchronize()
        before = lf.stats()["commands"]
        for _ in range(a.repeats):
            gc.collect()
            t0 = time.perf_counter()
            y = chain()
            t1 = time.perf_counter()
            lf.eval(y)
            t2 = time.perf_counter()
            s.synchronize()
            best_b, best_e = min(best_b, t1 - t0), min(best_e, t2 - t1)
        cmds = (lf.stats()["commands"] - before) / a.repeats
        assert a.fake or a.gpt2 or float(np.asarray(y)[0]) == a.n
        if a.profile:
            prof = cProfile.Profile()
            prof.enable()
            lf.eval(chain())
            prof.disable()
    per = f"{(best_b + best_e) * 1e3:.3f} ms per forward" if a.gpt2 else f"{(best_b + best_e) / a.n * 1e6:.2f} us/op"
    print(f"{dev} lanes={a.lanes}{' fake driver' if a.fake else ''}: {cmds:.0f} commands per {what};"
          f" build {best_b / a.n * 1e6:.2f} us, eval {best_e / cmds * 1e6:.2f} us/command, total {per}"
          f" (best of {a.repeats})")
    if a.profile:
        pstats.Stats(prof).sort_stats("tottime").print_stats(a.top)
    return 0


def _gpt2(lf, dev, s):
    """One uncached forward of GPT-2 small written with lf.nn, as a function returning its logits."""
    from laneflow.models import gpt2

    cfg = gpt2.GPT2Config()
    params = gpt2.init_params(cfg, seed=0, dtype=lf.bfloat16 if dev.type == "gpu" else lf.float32, device=dev)
    lf.eval(list(params.values()))
    ids = lf.array(np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 16)), stream=s)

    def forward():
        with lf.stream(s):
            return gpt2.forward(params, ids, cfg, gpt2.NN_OPS)
    return forward


if __name__ == "__main__":
    sys.exit(main())
