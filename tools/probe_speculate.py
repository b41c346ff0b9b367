"""What speculative launch (graph/speculate.py) gains on GPT-2 small's cached eager forward, A/B in one
process: rounds take turns between speculation on and off, each round 20 forwards timed as ``bench gpt2``
times one (device events around build + lf.async_eval), so both settings see the same host. ``--between``
runs other work before each timed forward, as the bench's interleaved rows do: ``uncached`` (the same
forward with the plan cache bypassed), ``torch`` (a transformers forward on the GPU), or ``none``.

    python tools/probe_speculate.py [--rounds 6] [--between none,uncached,torch] [--batch 1]
    python tools/probe_speculate.py --alternate [--rounds 40] [--rows uncached,on,off]

``--alternate`` times the two settings as ``bench gpt2`` times its rows: each on a stream and weights of
its own, one sample of each in turn (with an uncached forward on a third stream between).

Prints, per setting, the median of all its samples, and the host split of build and eval.
"""
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
import laneflow as lf  # noqa: E402
from laneflow.bench.harness import laneflow_timer  # noqa: E402
from laneflow.graph import eval_cache, speculate  # noqa: E402
from laneflow.models import gpt2  # noqa: E402


def arg(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def alternate(rounds: int, batch: int) -> None:
    cfg = gpt2.GPT2Config()
    dev = lf.Device("gpu")
    ids_np = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, 16))
    rows = []
    for name in arg("--rows", "uncached,on,off").split(","):
        st = lf.new_stream(dev, lanes=1)
        params = gpt2.init_params(cfg, seed=0, dtype=lf.bfloat16, device=dev)
        ids = lf.array(ids_np, stream=st)
        lf.eval(ids, *params.values())
        rows.append((name, st, params, ids, laneflow_timer(st)))

    def run(name, st, params, ids):
        speculate.ENABLED = name != "off"
        with lf.stream(st):
            if name == "uncached":
                with eval_cache.bypass():
                    y = gpt2.forward(params, ids, cfg, gpt2.NN_OPS)
                    lf.async_eval(y)
                    return y
            t0 = time.perf_counter()
            y = gpt2.forward(params, ids, cfg, gpt2.NN_OPS)
        t1 = time.perf_counter()
        lf.async_eval(y)
        host.setdefault(name, []).append(((t1 - t0) * 1e6, (time.perf_counter() - t1) * 1e6))
        return y

    host: dict = {}
    outs = {}
    launch_us: list = []
    real_launch = speculate._launch

    def timed_launch(entry, d):  # the host time of the speculative launch alone
        t = time.perf_counter()
        real_launch(entry, d)
        launch_us.append((time.perf_counter() - t) * 1e6)
    speculate._launch = timed_launch
    for _ in range(8):
        for name, st, params, ids, timer in rows:
            outs[name] = run(name, st, params, ids)
            st.synchronize()
    times: dict = {name: [] for name, *_ in rows}
    for _ in range(rounds):
        for name, st, params, ids, timer in rows:
            timer.start()
            outs[name] = run(name, st, params, ids)
            times[name].append(timer.stop() * 1e6)
    speculate.ENABLED = True
    print(f"GPT-2 small lf.nn, B={batch}, 16 tokens, bf16, 1 lane, three rows taking turns ({rounds} samples each):")
    for name, ts in times.items():
        split = np.median(np.array(host[name][-rounds:]), axis=0) if name in host else (0, 0)
        print(f"{name:>9} {np.median(ts):>7.0f}us  p25 {np.percentile(ts, 25):>5.0f}us  p75 {np.percentile(ts, 75):>5.0f}us"
              f"  build {split[0]:>5.0f}us  eval {split[1]:>4.0f}us")
    print(f"speculative launch, host: median {np.median(launch_us[-rounds:]):.0f}us; {speculate.STATS}")


def main() -> None:
    if "--alternate" in sys.argv:
        return alternate(int(arg("--rounds", "40")), int(arg("--batch", "1")))
    rounds = int(arg("--rounds", "6"))
    batch = int(arg("--batch", "1"))
    betweens = arg("--between", "none,uncached").split(",")
    cfg = gpt2.GPT2Config()
    dev = lf.Device("gpu")
    st = lf.new_stream(dev, lanes=1)
    params = gpt2.init_params(cfg, seed=0, dtype=lf.bfloat16, device=dev)
    lf.eval(list(params.values()))
    ids_np = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, 16))
    ids = lf.array(ids_np, stream=st)
    ops = gpt2.NN_OPS

    def build():
        with lf.stream(st):
            return gpt2.forward(params, ids, cfg, ops)

    other = {"none": lambda: None}
    if "uncached" in betweens:
        def uncached():
            with eval_cache.bypass():
                lf.async_eval(build())
            st.synchronize()
        other["uncached"] = uncached
    if "torch" in betweens:
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel
        model = GPT2LMHeadModel(GPT2Config()).to("cuda", torch.bfloat16).eval()
        tids = torch.tensor(ids_np, device="cuda")

        def torch_forward():
            with torch.no_grad():
                model(tids)
            torch.cuda.synchronize()
        other["torch"] = torch_forward

    timer = laneflow_timer(st)
    for _ in range(8):  # sighted, built, hits, executor, trigger learnt
        lf.async_eval(build())
    st.synchronize()
    times: dict = {}
    split: dict = {}
    for _ in range(rounds):
        for between in betweens:
            for spec in (True, False):
                speculate.ENABLED = spec
                for _ in range(3):  # (the setting's first forwards: learn, arm)
                    lf.async_eval(build())
                st.synchronize()
                for _ in range(20):
                    other[between]()
                    used = speculate.STATS["speculation_used"]
                    timer.start()
                    t0 = time.perf_counter()
                    y = build()
                    t1 = time.perf_counter()
                    lf.async_eval(y)
                    t2 = time.perf_counter()
                    dt = timer.stop()
                    key = (between, spec)
                    times.setdefault(key, []).append(dt * 1e6)
                    split.setdefault(key, []).append(((t1 - t0) * 1e6, (t2 - t1) * 1e6,
                                                      speculate.STATS["speculation_used"] - used))
    speculate.ENABLED = True
    print(f"GPT-2 small lf.nn, B={batch}, 16 tokens, bf16, 1 lane, cache hits; {rounds} rounds x 20 forwards a setting")
    print(f"{'between':>9} {'speculate':>9} {'one run':>9} {'p25':>7} {'p75':>7} {'build':>7} {'eval':>6} {'taken':>6}")
    for (between, spec), ts in times.items():
        sp = np.array(split[(between, spec)])
        print(f"{between:>9} {'on' if spec else 'off':>9} {np.median(ts):>7.0f}us {np.percentile(ts, 25):>5.0f}us "
              f"{np.percentile(ts, 75):>5.0f}us {np.median(sp[:, 0]):>5.0f}us {np.median(sp[:, 1]):>4.0f}us "
              f"{sp[:, 2].mean():>6.2f}")


if __name__ == "__main__":
    main()
