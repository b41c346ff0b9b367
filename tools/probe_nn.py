"""GPT-2 small's pieces, each compiled alone and replayed: where the lf.nn model's time goes.

    python tools/probe_nn.py            # a table: piece, tokens, microseconds per replay

Each piece runs R = 20 times inside one ``lf.compile`` (a CUDA graph on a one-lane stream, so the
copies run one after another), replayed 100 times after a warm-up; the figure is wall time per replay
over R, so a graph launch (10-20 microseconds of host time) is spread over 20 pieces.
Pieces: the projections with and without their epilogues (``graph/epilogue.py``), layer norm as
lf.nn and as plain ops, attention as lf.nn and as plain ops (scores, mask, softmax, values).
"""

from __future__ import annotations

import math
import time

import numpy as np

import laneflow as lf
from laneflow.graph import fusion
from laneflow.models import gpt2


R = 20


def _time(f, args, n=100) -> float:
    for _ in range(5):
        lf.eval(f(*args))
    lf.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        y = f(*args)
    lf.eval(y)
    lf.synchronize()
    return (time.perf_counter() - t0) / n / R * 1e6


def main() -> None:
    with lf.stream(lf.new_stream(lf.gpu, lanes=1)):
        _main()


def _main() -> None:
    bf = lf.bfloat16
    d, H = 768, 12
    rng = np.random.default_rng(0)

    def arr(*shape):
        return lf.array((rng.standard_normal(shape) * 0.02).astype(bf))

    rows = []
    plain = gpt2.plain_ops(lf)
    for B in (1, 8):
        n = B * 16
        x, h = arr(B, 16, d), arr(B, 16, d)
        w_qkv, b_qkv, w_fc, b_fc, w_pr, b_pr = arr(d, 3 * d), arr(3 * d), arr(d, 4 * d), arr(4 * d), arr(4 * d, d), arr(d)
        m = arr(B, 16, 4 * d)
        ln_w, ln_b = arr(d), arr(d)
        qkv = arr(B, 16, 3 * d)
        wte = arr(50257, d)
        wte_t = lf.array(np.ascontiguousarray(np.asarray(wte).T))
        wte_pad = arr(50304, d)

        def heads(a):
            return a.reshape(B, 16, H, 64).transpose(0, 2, 1, 3)

        def split(qkv):
            return heads(qkv[..., :d]), heads(qkv[..., d:2 * d]), heads(qkv[..., 2 * d:])

        pieces = {
            "qkv: x @ w + b": (lambda x, w, b: x @ w + b, (x, w_qkv, b_qkv)),
            "fc: gelu_tanh(x @ w + b)": (lambda x, w, b: lf.nn.gelu(x @ w + b, approximate="tanh"), (x, w_fc, b_fc)),
            "proj: h + (m @ w + b)": (lambda h, m, w, b: h + (m @ w + b), (h, m, w_pr, b_pr)),
            "head: x @ wte.T": (lambda x, w: x @ w.T, (x, wte)),
            "head: x @ w, w = wte.T stored": (lambda x, w: x @ w, (x, wte_t)),
            "head: x @ wte.T, vocab padded to 50304": (lambda x, w: x @ w.T, (x, wte_pad)),
            "layer_norm lf.nn": (lambda x, w, b: lf.nn.layer_norm(x, w, b), (x, ln_w, ln_b)),
            "layer_norm plain": (lambda x, w, b: plain.layer_norm(x, w, b, 1e-5), (x, ln_w, ln_b)),
            "attention lf.nn": (lambda a: lf.nn.scaled_dot_product_attention(*split(a), is_causal=True), (qkv,)),
            "attention plain": (lambda a: plain.attention(*split(a), 1 / math.sqrt(64), plain.causal_mask(16)),
                                (qkv,)),
        }
        for name, (fn, args) in pieces.items():
            for fuse in (True, False):
                if not fuse and not name.startswith(("qkv", "fc", "proj")):
                    continue
                fusion.set_enabled(fuse)
                us = _time(lf.compile(lambda *a, fn=fn: [fn(*a) for _ in range(R)]), args)
                rows.append((name + ("" if fuse else ", epilogue off"), n, us))
        fusion.set_enabled(True)
    cfg = gpt2.GPT2Config()
    params = gpt2.init_params(cfg, dtype=bf)
    for lanes in (1, 4):
        st = lf.new_stream(lf.gpu, lanes=lanes)
        with lf.stream(st):
            P = {k: v + 0 for k, v in params.items()}  # (on this stream)
            lf.eval(*P.values())
            for B in (1, 8):
                ids = lf.array(np.random.default_rng(B).integers(0, cfg.vocab_size, (B, 16)).astype(np.int32))
                for tag, ops in (("lf.nn", gpt2.NN_OPS), ("plain", gpt2.LANEFLOW_OPS)):
                    f = lf.compile(lambda ids, ops=ops: gpt2.forward(P, ids, cfg, ops))
                    us = _time(f, (ids,)) * R
                    rows.append((f"model {tag}, {lanes} lane(s), {f.stats()[0].get('steps')} steps", B * 16, us))
    print(f"{'piece':40s} {'tokens':>6s} {'us/piece':>10s}")
    for name, n, us in rows:
        print(f"{name:40s} {n:6d} {us:10.1f}")


if __name__ == "__main__":
    main()
