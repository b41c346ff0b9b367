"""What other work between two eager steps costs the next step (the "taking turns" penalty of ``bench
gpt2``, whose rows run one sample each in turn): the small GPT-2-like model of ``bench gpt2 --device
cpu`` (lf.nn, B=1, 8 tokens, float32, one lane, cache hits), timed back to back and after each kind of
gap, in one process; medians of 200 steps, three rounds; numpy's forward of the same model alongside.

    python tools/probe_step_gap.py
"""
import gc
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
import laneflow as lf  # noqa: E402
from laneflow.bench.suites.gpt2 import CPU_CONFIG as cfg  # noqa: E402
from laneflow.graph import eval_cache  # noqa: E402
from laneflow.models import gpt2  # noqa: E402

st = lf.new_stream(lf.Device("cpu"), lanes=1)
w = {k: v.astype(np.float32) for k, v in gpt2.numpy_params(cfg, seed=0).items()}
params = {k: lf.array(v, stream=st) for k, v in w.items()}
ids_np = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 8)).astype(np.int32)
ids = lf.array(ids_np, stream=st)
lf.eval(list(params.values()) + [ids])
buf = np.zeros(4 << 20, np.uint8)


def step():
    with lf.stream(st):
        y = gpt2.forward(params, ids, cfg, gpt2.NN_OPS)
    lf.eval(y)


def npstep():
    return gpt2.forward(w, ids_np, cfg, gpt2.NUMPY_OPS)


def objects():  # 20,000 small Python objects made and freed (what another row's Python does)
    xs = [(i, str(i)) for i in range(20000)]
    del xs


def one_list():
    xs = [None] * 20000
    del xs


def touch():  # every cache line of 4 MiB
    buf[::64] += 1


def loop():
    for _ in range(20000):
        pass


def uncached():  # what bench gpt2's uncached row runs between the cached row's samples
    with eval_cache.bypass():
        step()


def sleep():
    time.sleep(0.0005)


GAPS = [("none", None), ("20,000 objects made and freed", objects), ("the same, gc off", objects),
        ("one list of 20,000", one_list), ("4 MiB touched", touch), ("a busy loop of 20,000", loop),
        ("sleep 0.5 ms", sleep), ("an uncached step (cache bypassed)", uncached), ("numpy's forward", npstep)]


def timed(gap, fn) -> float:
    ts = []
    for _ in range(200):
        if gap is not None:
            gap()
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e6


def main() -> None:
    for _ in range(30):
        step()
    print(f"lf.nn GPT-2-like step (bench gpt2's CPU model, B=1) on {lf.Device('cpu')}, one lane, and numpy's:"
          " median us (x: against no gap)")
    rows = {(name, k): [] for name, _ in GAPS for k in ("lf", "np")}
    for _ in range(3):
        for name, gap in GAPS:
            for k, fn in (("lf", step), ("np", npstep)):
                if name.endswith("gc off"):
                    gc.disable()
                rows[name, k].append(timed(gap, fn))
                gc.enable()
    for name, _ in GAPS:
        lf_, np_ = (float(np.median(rows[name, k])) for k in ("lf", "np"))
        b_lf, b_np = (float(np.median(rows["none", k])) for k in ("lf", "np"))
        print(f"  after {name:<32} laneflow {lf_:6.0f} us ({lf_ / b_lf:.2f}x)   numpy {np_:6.0f} us"
              f" ({np_ / b_np:.2f}x)   laneflow/numpy {lf_ / np_:.2f}   laneflow rounds: "
              + ", ".join(f"{v:.0f}" for v in rows[name, "lf"]))


if __name__ == "__main__":
    main()
