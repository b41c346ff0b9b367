"""Where the host time of a GPT-2 small eager forward goes: cProfile over repeated forwards.

    python tools/profile_gpt2.py [--device gpu|cpu] [--batch 1] [--tokens 16] [--steps 5] [--fake] [--nn] [--uncached] [--async]

Prints the wall time per forward, the commands per forward, and the top functions by own time and by
cumulative time. ``--fake`` runs the CUDA backend on the fake driver (tests/doubles/fake_cuda.py), so
the GPU backend's host path can be profiled on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lanes", type=int, default=1)
    ap.add_argument("--fake", action="store_true")
    ap.add_argument("--nn", action="store_true", help="the model written with lf.nn (models.gpt2.NN_OPS)")
    ap.add_argument("--top", type=int, default=35)
    ap.add_argument("--uncached", action="store_true", help="bypass the plan cache (every forward a first sighting)")
    ap.add_argument("--async", dest="async_", action="store_true",
                    help="lf.async_eval each forward (back to back, as bench gpt2 times them) instead of lf.eval")
    a = ap.parse_args()
    if a.fake:
        import fake_driver

        fake_driver.install()
    import laneflow as lf
    from laneflow.graph import eval_cache
    from laneflow.models import gpt2

    if a.uncached:
        eval_cache.bypass().__enter__()

    cfg = gpt2.GPT2Config()
    dev = lf.Device(a.device)
    st = lf.new_stream(dev, lanes=a.lanes)
    params = gpt2.init_params(cfg, seed=0, dtype=lf.bfloat16 if dev.type == "gpu" else lf.float32, device=dev)
    lf.eval(list(params.values()))
    ids = lf.array(np.random.default_rng(0).integers(0, cfg.vocab_size, (a.batch, a.tokens)), stream=st)

    ops = gpt2.NN_OPS if a.nn else gpt2.LANEFLOW_OPS

    finish = lf.async_eval if a.async_ else lf.eval

    def step():
        with lf.stream(st):
            y = gpt2.forward(params, ids, cfg, ops)
        finish(y)
        return y

    for _ in range(3):
        step()
    lf.reset_stats()
    t = time.perf_counter()
    for _ in range(a.steps):
        step()
    st.synchronize()
    wall = (time.perf_counter() - t) / a.steps
    build = run = 0.0
    for _ in range(a.steps):  # the same forwards, split into graph building and lf.eval
        t0 = time.perf_counter()
        with lf.stream(st):
            y = gpt2.forward(params, ids, cfg, ops)
        t1 = time.perf_counter()
        finish(y)
        build, run = build + t1 - t0, run + time.perf_counter() - t1
    st.synchronize()
    print(f"split: building the graph {build / a.steps * 1e3:.2f} ms, lf.eval {run / a.steps * 1e3:.2f} ms per forward;"
          f" plan cache {lf.plan_cache_info()}")
    cmds = lf.stats()["commands"] / (2 * a.steps)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.steps):
        step()
    prof.disable()
    print(f"GPT-2 small eager forward on {dev} (B={a.batch}, T={a.tokens}, lanes={a.lanes}{', fake driver' if a.fake else ''}):"
          f" {wall * 1e3:.2f} ms per forward, {cmds:.0f} commands, {wall / cmds * 1e6:.1f} us per command")
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(a.top)
        print(f"== by {key}")
        print("\n".join(s.getvalue().splitlines()[6:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
