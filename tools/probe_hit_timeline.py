"""Where a repeated eager GPT-2 forward (a plan cache hit, taped and speculated) spends its time, on one
timeline: when the host calls cuGraphLaunch (the speculated launch), when building ends, when lf.eval
has submitted everything, when it returns; and the graph's own GPU time (events around a compiled call).
Whether the hit is bound by the host (eval's submit ends after the GPU would) or by the launch coming
late (launch time + GPU time) says which part to shorten.

    python tools/probe_hit_timeline.py [--fake] [--batch 1] [--lanes 1] [--n 400]

Medians over ``--n`` forwards, in microseconds from the forward's start.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def arg(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main() -> None:
    if "--fake" in sys.argv:
        import fake_driver

        fake_driver.install()
    import numpy as np

    import laneflow as lf
    from laneflow.backends.cuda.cudagraph import executor
    from laneflow.graph import eval_cache
    from laneflow.models import gpt2

    marks: dict = {}
    real = executor.cu

    class Recording:  # the executor's driver module, noting when a graph launch is called
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def cuGraphLaunch(exec_, stream):  # noqa: N802 - the driver's name
            marks.setdefault("launch", time.perf_counter())
            return real.cuGraphLaunch(exec_, stream)

    executor.cu = Recording()
    schedule = eval_cache.schedule

    def scheduled(datas):
        try:
            return schedule(datas)
        finally:
            marks["submitted"] = time.perf_counter()

    eval_cache.schedule = scheduled  # (lf.eval calls it through the module)
    batch, lanes, n = int(arg("--batch", "1")), int(arg("--lanes", "1")), int(arg("--n", "400"))
    dev = lf.Device("gpu")
    cfg = gpt2.GPT2Config()
    params = gpt2.init_params(cfg, seed=0, dtype=lf.bfloat16, device=dev)
    lf.eval(list(params.values()))
    st = lf.new_stream(dev, lanes=lanes)
    ids = lf.array(np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, 16)), stream=st)
    lf.eval(ids)
    rows: dict = {k: [] for k in ("launch", "built", "submitted", "returned", "synchronized")}
    for i in range(n + 30):
        marks.clear()
        t0 = time.perf_counter()
        with lf.stream(st):
            y = gpt2.forward(params, ids, cfg, gpt2.NN_OPS)
        built = time.perf_counter()
        lf.eval(y)
        returned = time.perf_counter()
        st.synchronize()
        done = time.perf_counter()
        if i >= 30:
            got = {"launch": marks.get("launch"), "built": built, "submitted": marks.get("submitted"),
                   "returned": returned, "synchronized": done}
            for k, v in got.items():
                if v is not None:
                    rows[k].append((v - t0) * 1e6)
    step = lf.compile(lambda p, x: gpt2.forward(p, x, cfg, gpt2.NN_OPS))
    with lf.stream(st):
        for _ in range(5):
            lf.eval(step(params, ids))
        gpu = []
        if "--fake" not in sys.argv:
            from laneflow.backends.cuda.timing import StreamEventTimer

            timer = StreamEventTimer(st)
            for _ in range(20):
                timer.start()
                lf.eval(step(params, ids))
                gpu.append(timer.stop() * 1e6)
    print(f"GPT-2 small lf.nn eager hit on {dev}, B={batch}, {lanes} lane(s): medians of {n} forwards, us from "
          f"the forward's start; speculated launches {len(rows['launch'])} of {n}")
    for k, v in rows.items():
        if v:
            print(f"  {k:<13} {statistics.median(v):8.1f}")
    if gpu:
        print(f"  compiled call, device events: {statistics.median(gpu):8.1f}")


if __name__ == "__main__":
    main()
