"""GPU time of GPT-2 small's cached eager forward (a plan-cache hit replayed as a CUDA graph) against
its compiled call, with the host kept out: the lane first sleeps 20 ms on the GPU, so the timed span
(an event before and after the work, both behind the sleep) holds the GPU's work only. Then the wall
time of 50 forwards back to back, the host time of building the graph and of evaluating it, and one
forward timed as ``bench gpt2`` times it (device events around one run), for each early-launch
setting (``--every 0,8``: ``lf.set_early_launch``; 0 is off).

    python tools/probe_hit_gpu.py [--lanes 1] [--every 0,4,8]
"""
import sys
import time
from pathlib import Path

import numpy as np
from cuda.bindings import driver as cu

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
import laneflow as lf  # noqa: E402
from laneflow.backends.cuda.kernels.misc import gpu_sleep  # noqa: E402
from laneflow.bench.harness import laneflow_timer  # noqa: E402
from laneflow.models import gpt2  # noqa: E402


def gpu_time(st, launch) -> float:
    lane = st.lanes[0]
    st.synchronize()
    lane.ctx.ensure_current()
    b = cu.cuEventCreate(0)[1]
    e = cu.cuEventCreate(0)[1]
    gpu_sleep(lane, 0.02)
    cu.cuEventRecord(b, lane.stream)
    launch()
    for other in st.lanes[1:]:  # (work on other lanes: the end event waits for them)
        ev = cu.cuEventCreate(0)[1]
        cu.cuEventRecord(ev, other.stream)
        cu.cuStreamWaitEvent(lane.stream, ev, 0)
    cu.cuEventRecord(e, lane.stream)
    cu.cuEventSynchronize(e)
    return cu.cuEventElapsedTime(b, e)[1] * 1e3


def main() -> None:
    lanes = int(sys.argv[sys.argv.index("--lanes") + 1]) if "--lanes" in sys.argv else 1
    cfg = gpt2.GPT2Config()
    dev = lf.Device("gpu")
    st = lf.new_stream(dev, lanes=lanes)
    params = gpt2.init_params(cfg, seed=0, dtype=lf.bfloat16, device=dev)
    lf.eval(list(params.values()))
    ids = lf.array(np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 16)), stream=st)
    ops = gpt2.NN_OPS

    def build():
        with lf.stream(st):
            return gpt2.forward(params, ids, cfg, ops)

    f = lf.compile(lambda p, i: gpt2.forward(p, i, cfg, ops))

    def call():
        with lf.stream(st):
            return f(params, ids)

    every = [int(v) for v in sys.argv[sys.argv.index("--every") + 1].split(",")] if "--every" in sys.argv else [8]
    timer = laneflow_timer(st)
    rows = []
    for n in every:
        lf.set_early_launch(n)
        for _ in range(6):
            lf.async_eval(build())
            lf.async_eval(call())
        st.synchronize()
        comp = [gpu_time(st, lambda: lf.async_eval(call())) for _ in range(10)]
        one = []
        for _ in range(30):
            timer.start()
            lf.async_eval(build())
            one.append(timer.stop() * 1e6)
        t = time.perf_counter()
        for _ in range(50):
            lf.async_eval(build())
        st.synchronize()
        wall = (time.perf_counter() - t) / 50
        tb = te = 0.0
        for _ in range(50):
            t0 = time.perf_counter()
            y = build()
            t1 = time.perf_counter()
            lf.async_eval(y)
            tb, te = tb + t1 - t0, te + time.perf_counter() - t1
        st.synchronize()
        rows.append((n, np.median(one), wall * 1e6, tb / 50 * 1e6, te / 50 * 1e6, np.median(comp)))
        out = np.asarray(build().astype(lf.float32))
        ref = np.asarray(call().astype(lf.float32))
        assert np.abs(out - ref).max() <= 5e-2 * np.abs(ref).max(), "early launch changed the logits"
    print(f"GPT-2 small lf.nn, B=1, 16 tokens, bf16, {lanes} lane(s), cache hits:")
    print(f"{'early launch':>12} {'one run (events)':>17} {'back to back':>13} {'build':>8} {'async_eval':>11}"
          f" {'compiled GPU':>13}")
    for n, o, w, b, e, c in rows:
        print(f"{n if n else 'off':>12} {o:>15.0f}us {w:>11.0f}us {b:>6.0f}us {e:>9.0f}us {c:>11.0f}us")
    print(lf.plan_cache_info())


if __name__ == "__main__":
    main()
