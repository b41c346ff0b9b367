"""Device time per op of one GPT-2 small eager forward, from ``lf.trace()`` (no profiler needed).

    python tools/op_times.py [--batch 1] [--tokens 16] [--models nn,plain,decode-plain,decode-nn]

For each model (written with ``lf.nn`` or with plain ops) the forward runs eagerly with the plan cache
bypassed, so every step is its own command with its own timing events; after two warm-up forwards one
more runs under ``lf.trace()``, behind a 100 ms sleep kernel on the lane, so that every command is
enqueued before the GPU reaches it and its timing events bracket its kernels alone (not the host's
time between launches). Prints, per op name, the commands and their summed device time, and the
sum against the span: where the compiled forward's time goes, op by op (a CUDA graph runs the same
kernels, without the gaps). ``decode-plain`` and ``decode-nn`` time one KV-cache decode step instead
(``bench decode``'s: a cache of 256 positions filled to 128, attention through plain ops or lf.nn).
"""

from __future__ import annotations

import argparse
import collections

import numpy as np


def times(model: str, batch: int, tokens: int) -> tuple[dict, float, int]:
    import laneflow as lf
    from laneflow.graph import eval_cache
    from laneflow.models import gpt2

    cfg = gpt2.GPT2Config()
    dev = lf.Device("gpu")
    st = lf.new_stream(dev, lanes=1)
    params = gpt2.init_params(cfg, seed=0, dtype=lf.bfloat16, device=dev)
    lf.eval(list(params.values()))
    ids = lf.array(np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, tokens)), stream=st)
    ops = gpt2.NN_OPS if model.endswith("nn") else gpt2.LANEFLOW_OPS
    if model.startswith("decode"):
        from laneflow.models import gpt2_decode

        with lf.stream(st):
            cache = gpt2_decode.init_cache(cfg, batch, 256, dtype=lf.bfloat16)
            tok, pos = ids[:, 0], lf.array(np.int32(128))

        def run():
            logits, new = gpt2_decode.decode_step(params, tok, pos, cfg, cache, fused=model == "decode-nn", ops=ops)
            lf.eval([logits] + [a for kv in new for a in kv])
    else:
        def run():
            lf.eval(gpt2.forward(params, ids, cfg, ops))
    with eval_cache.bypass():
        for _ in range(2):
            with lf.stream(st):
                run()
        from laneflow.backends.cuda.kernels.misc import gpu_sleep

        with lf.trace() as tr:
            # The trace's clock is anchored (one host synchronisation) at its first command: anchor it
            # before the sleep, or that synchronisation waits the sleep out and the forward runs
            # host-bound again (the first version of this tool measured launch gaps so, 2026-12-04).
            with lf.stream(st):
                lf.eval(lf.zeros((1,)) + 1.0)
            anchor = len(tr._raw) + len(tr._deferred)  # commands recorded so far (times come at exit)
            gpu_sleep(st.lanes[0], 0.1)  # the GPU waits until every command is enqueued
            with lf.stream(st):
                run()
    events = tr.events[anchor:]
    per: dict = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        per[e.op][0] += 1
        per[e.op][1] += e.duration
    return dict(per), max(e.end for e in events) - min(e.start for e in events), len(events)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--models", default="nn,plain")
    a = ap.parse_args()
    for model in a.models.split(","):
        per, span, n = times(model, a.batch, a.tokens)
        busy = sum(t for _, t in per.values())
        print(f"\n{model}: B={a.batch} T={a.tokens}: {n} commands, device busy {busy * 1e6:.1f} µs, "
              f"span {span * 1e6:.1f} µs")
        print(f"{'op':40s} {'commands':>8s} {'total µs':>10s} {'µs each':>8s}")
        for op, (c, t) in sorted(per.items(), key=lambda kv: -kv[1][1]):
            print(f"{op[:40]:40s} {c:8d} {t * 1e6:10.1f} {t * 1e6 / c:8.2f}")


if __name__ == "__main__":
    main()
