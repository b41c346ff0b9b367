"""Would launching a cached eager forward in pieces, while the model's Python still runs, pay? GPT-2 small
(lf.nn, B=1, 16 tokens, bf16) on a cache hit, with ``lf.async_eval(h)`` after every ``k`` blocks, timed
as ``bench gpt2`` times its rows (device events around one run), and its host time alone.

    python tools/probe_early_launch.py
"""
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
import laneflow as lf  # noqa: E402
from laneflow.bench.harness import laneflow_timer  # noqa: E402
from laneflow.models import gpt2  # noqa: E402


def main() -> None:
    dev = lf.Device(sys.argv[1] if len(sys.argv) > 1 else "gpu")
    cfg = gpt2.GPT2Config()
    st = lf.new_stream(dev, lanes=1)
    params = gpt2.init_params(cfg, seed=0, dtype=lf.bfloat16 if dev.type == "gpu" else lf.float32, device=dev)
    lf.eval(list(params.values()))
    ids = lf.array(np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 16)), stream=st)
    ops = gpt2.NN_OPS
    scale = 1.0 / np.sqrt(cfg.head_dim)

    def forward(k):
        with lf.stream(st):
            h = ops.embed(params["transformer.wte.weight"], ids) + params["transformer.wpe.weight"][:16]
            for i in range(cfg.n_layer):
                h = gpt2.block(params, i, h, cfg, ops, lambda q, kk, v, i: ops.attention(q, kk, v, scale, None))
                if k and (i + 1) % k == 0 and i + 1 < cfg.n_layer:
                    lf.async_eval(h)
            y = gpt2.head(params, h, cfg, ops)
        lf.async_eval(y)
        return y

    timer = laneflow_timer(st)
    if timer is None:  # (the CPU: host time only)
        class timer:  # noqa: N801
            start = staticmethod(lambda: setattr(timer, "t", time.perf_counter()))
            stop = staticmethod(lambda: time.perf_counter() - timer.t)
    rows = []
    ref = None
    for k in (0, 1, 2, 3, 4, 6):
        for _ in range(8):
            y = forward(k)
        st.synchronize()
        out = np.asarray(y.astype(lf.float32))
        ref = out if ref is None else ref
        ev = []
        for _ in range(30):
            timer.start()
            forward(k)
            ev.append(timer.stop())
        st.synchronize()
        t = time.perf_counter()
        for _ in range(30):
            forward(k)
        host = (time.perf_counter() - t) / 30
        st.synchronize()
        rows.append((k, np.median(ev) * 1e6, host * 1e6, float(np.max(np.abs(out - ref)))))
    print(f"{'async_eval every k blocks':>26} {'one run (events)':>18} {'host per run':>14} {'max|diff|':>10}")
    for k, e, h, d in rows:
        print(f"{k if k else 'never':>26} {e:>16.0f}us {h:>12.0f}us {d:>10.2e}")
    print(lf.plan_cache_info())


if __name__ == "__main__":
    main()
