"""decode: one GPT-2 decode step with a static KV cache, and many requests decoded at once.

Sizes (as ``anchors/probe_decode.py`` measured the peers): on the GPU GPT-2 small in bfloat16, a cache
of 256 positions filled to 128, B=1 and B=8; on the CPU the gpt2 suite's small model in float32, a
cache of 64 filled to 32; ``--quick`` the tiny test model, a cache of 16 filled to 8.

**step** (per-token latency): every implementation fills its caches with the first ``POS`` tokens of
seeded ids, then each timed run is one decode step at position ``POS`` (the token at ``POS``, the
same each run: it rewrites the same cache row) returning the logits (B, vocab), checked against the
float32 numpy forward over the ``POS + 1`` tokens. A sample is a loop of steps lasting at least 20 ms
(``STEP_SAMPLE_FACTOR``), timed with device events like every GPU row: the per-token time of a
generation loop; the row "each step waited for" synchronises after every step, so it shows one
step's host and device time (a latency no loop hides). laneflow rows: eager (each step one ``lf.eval``,
plan cache hits), compiled with the caches donated (``lf.compile(step, donate_argnums=...)``: one
CUDA graph launch per token, caches updated in place; also with the weights closed over, "weights
captured": constants of the graph, so a call binds only the caches, the token and the position), each with plain-op attention (its masked
softmax one row program) and with ``lf.nn.scaled_dot_product_attention`` ("lf.nn"). Peers: PyTorch
eager and under a CUDA graph (static caches, the position a device tensor, ``index_copy_``), JAX jit
with donated caches (``lax.dynamic_update_slice``).

**requests** (throughput): ``N`` = 4 independent requests, B=1 each, prompts of different lengths
(their own positions); a timed run is one round, one token for every request (``items`` = N tokens).
Rows: the compiled step called for each request one after another on one stream; the same with a
stream per request (their graphs may overlap on the GPU); one padded batch of N rows at their own
positions (``pos`` a (N,) array: a scatter of the rows' keys and values).
"""

from __future__ import annotations

import numpy as np

import laneflow as lf

from ...models import gpt2 as model
from ...models import gpt2_decode as dec
from .. import laneflow_impls as lfi
from ..harness import Case, Impl, suite
from .common import SEED, dtype
from .gpt2 import CPU_CONFIG

#: Requests decoded together in the "requests" case (the issue's target: 4 concurrent B=1 requests).
N_REQUESTS = 4
#: A step sample lasts this many times the run's ``min_sample_s`` (20 ms at full size, ~25 GPT-2 steps):
#: steps run back to back, as in a generation loop, so a row is per-token time in such a loop for
#: every implementation alike, not one step's host time plus its device time.
STEP_SAMPLE_FACTOR = 10
#: Tokens of the greedy check against transformers' ``generate``.
CHECK_TOKENS = 8


@suite("decode", "GPT-2 decode step with a KV cache (B=1, B=8) and 4 requests at once; bf16 GPT-2 small on a GPU", interleave=True)
def run(ctx):
    p = ctx.size(quick=dict(config=model.GPT2Config.tiny(), S=16, POS=8, B=(1, 2), dtype="float32"),
                 cpu=dict(config=CPU_CONFIG, S=64, POS=32, B=(1, 8), dtype="float32"),
                 gpu=dict(config=model.GPT2Config(), S=256, POS=128, B=(1, 8), dtype="bfloat16"))
    cfg, dt = p["config"], dtype(p["dtype"])
    weights = {k: v.astype(dt) for k, v in model.numpy_params(cfg, seed=SEED).items()}
    results = []
    for B in p["B"]:
        results.extend(_step_case(ctx, cfg, weights, B, p["S"], p["POS"], dt))
    results.extend(_requests_case(ctx, cfg, weights, p["S"], p["POS"], dt))
    if "torch" in ctx.peers and lfi.unavailable(ctx.device) is None:
        results.append(_generate_check(ctx, cfg, weights))
    return results


def _generate_check(ctx, cfg, weights: dict):
    """laneflow's greedy tokens (float32, ``gpt2_decode.generate``: prefill and compiled steps) against
    transformers' ``generate`` (greedy, float32, on the CPU), same weights, prompts of two lengths."""
    from ..harness import Result, skipped
    from ..peers import PeerUnavailable
    from ..peers.torch_peer import hf_generate

    label = "check: laneflow greedy tokens = transformers generate (float32)"
    case = Case("decode", f"{_what(cfg)}: greedy generation, {CHECK_TOKENS} tokens", {}, None)
    w32 = {k: v.astype(np.float32) for k, v in weights.items()}
    rng = np.random.default_rng(SEED + 7)
    prompts = [[int(t) for t in rng.integers(0, cfg.vocab_size, n)] for n in (5, 11)]
    try:
        theirs = [hf_generate(cfg, w32, q, CHECK_TOKENS) for q in prompts]
    except PeerUnavailable as e:
        return skipped(case, label, str(e))
    res = Result("decode", case.name, label, lanes=1, checked=True, note="prompts of 5 and 11 tokens, one batch")
    try:
        s = lf.new_stream(ctx.device, lanes=1)
        with lf.stream(s):
            ours = dec.generate(model.to_laneflow(w32, lf.float32), cfg, prompts, CHECK_TOKENS)
        s.close()
        res.matches = ours == theirs
        res.max_abs_diff = float(sum(a != b for o, t in zip(ours, theirs) for a, b in zip(o, t)))
        res.extra["tokens_differing"] = res.max_abs_diff
    except Exception as e:  # noqa: BLE001
        res.error = f"{type(e).__name__}: {e}"[:300]
    return res


def _what(cfg) -> str:
    return "GPT-2 small" if cfg == model.GPT2Config() else f"GPT-2-like {cfg.n_layer} layers x {cfg.n_embd}"


def _step_case(ctx, cfg, weights: dict, B: int, S: int, POS: int, dt) -> list:
    ids = np.random.default_rng(SEED + B).integers(0, cfg.vocab_size, (B, POS + 1)).astype(np.int32)
    ref = model.reference_forward(weights, ids, cfg, dtype=np.float32)[:, -1]
    wbytes = sum(w.nbytes for w in weights.values())
    cache_bytes = 2 * cfg.n_layer * B * cfg.n_head * (POS + 1) * cfg.head_dim * dt.itemsize
    case = Case("decode", f"{_what(cfg)} decode step, B={B}, cache {S} filled to {POS}, {dt.name}",
                {"ids": ids}, ref, bytes=wbytes + cache_bytes + ref.size * dt.itemsize,
                flops=cfg.matmul_flops(B, 1), dtype=dt,
                params={"config": cfg, "weights": weights, "B": B, "S": S, "POS": POS},
                min_sample_s=STEP_SAMPLE_FACTOR * ctx.min_sample_s)
    rows = []
    why = lfi.unavailable(ctx.device)
    if why is None:
        for fused in (False, True):
            tag = "laneflow lf.nn" if fused else "laneflow"
            if not fused:
                rows.append(lfi.guard(case, f"{tag} eager", 1, lambda: _laneflow_step(case, ctx, False, fused, 1)))
                # one lane: a decode step is a chain; its graph then has no cross-branch edges
                rows.append(lfi.guard(case, f"{tag} compiled, caches donated", 1,
                                      lambda: _laneflow_step(case, ctx, True, fused, 1)))
                # the weights closed over (graph constants): a call binds the caches, token and position only
                rows.append(lfi.guard(case, f"{tag} compiled, weights captured", 1,
                                      lambda: _laneflow_step(case, ctx, True, fused, 1, captured=True)))
                # the honest counterpart of the back-to-back loop: each step's host time included
                rows.append(lfi.guard(case, f"{tag} compiled, each step waited for", 1,
                                      lambda: _laneflow_step(case, ctx, True, fused, 1, wait=True)))
            rows.append(lfi.guard(case, f"{tag} compiled, caches donated", ctx.lanes,
                                  lambda fused=fused: _laneflow_step(case, ctx, True, fused, ctx.lanes)))
    return ctx.run_case(case, "decode", rows)


def _prepare(ctx, cfg, weights: dict, ids: np.ndarray, S: int, stream):
    """Weights on ``stream``'s device and caches filled with ``ids`` by a prefill."""
    with lf.stream(stream):
        params = model.to_laneflow(weights)
        cache = dec.init_cache(cfg, ids.shape[0], S, dtype=params[model.PREFIX + "wte.weight"].dtype)
        _, cache = dec.prefill(params, lf.array(ids), cfg, cache)
        lf.eval(*[a for kv in cache for a in kv])
    return params, cache


def _laneflow_step(case: Case, ctx, compiled: bool, fused: bool, lanes: int, wait: bool = False,
                   captured: bool = False) -> Impl:
    cfg, B, S, POS = (case.params[k] for k in ("config", "B", "S", "POS"))
    ids = case.inputs["ids"]
    stream = lf.new_stream(ctx.device, lanes=lanes)
    params, cache = _prepare(ctx, cfg, case.params["weights"], ids[:, :POS], S, stream)
    with lf.stream(stream):
        tok, pos = lf.array(ids[:, POS]), lf.array(np.int32(POS))
        lf.eval(tok, pos)

    if captured:  # the weights are constants of the graph, not arguments bound at every call
        g = dec.compile_step(cfg, params, fused)
        f = lambda params, tok, pos, cache: g(tok, pos, cache)  # noqa: E731 - the call shape of the others
    elif compiled:
        f = g = dec.compile_step(cfg, fused=fused)
    else:
        def f(params, tok, pos, cache):
            return dec.decode_step(params, tok, pos, cfg, cache, fused=fused)
    state = {"cache": cache}

    def run():
        with lf.stream(stream):
            logits, state["cache"] = f(params, tok, pos, state["cache"])
        if not compiled:
            lf.eval(logits, *[a for kv in state["cache"] for a in kv])
        if wait:
            stream.synchronize()
        return logits

    label = ("laneflow lf.nn" if fused else "laneflow") + (" compiled, caches donated" if compiled else " eager")
    if wait:
        label = label.replace("caches donated", "each step waited for")
    elif captured:
        label = label.replace("caches donated", "weights captured")
    impl = lfi.eager(case, ctx.device, run, [], lanes, label=label, stream=stream, report_cache=False,
                     note=("one lf.compile'd step, then a host wait: one step's host and device time" if wait else
                           "the weights closed over; the caches donated" if captured else
                           "one lf.compile'd step per token; the caches donated") if compiled else
                     "one lf.eval per token (plan cache hits)")
    if compiled:
        convert = impl.to_host

        def to_host(out):
            st = g.stats()
            if st:
                impl.extra["compiled"] = {k: v for k, v in st[0].items() if k in ("mode", "steps", "captures")}
            return convert(out)
        impl.to_host = to_host
    return impl


def _requests_case(ctx, cfg, weights: dict, S: int, POS: int, dt) -> list:
    rng = np.random.default_rng(SEED + 99)
    lens = [int(n) for n in rng.integers(POS // 2, POS + 1, N_REQUESTS)]
    seqs = [rng.integers(0, cfg.vocab_size, (1, n + 1)).astype(np.int32) for n in lens]
    refs = [model.reference_forward(weights, s, cfg, dtype=np.float32)[:, -1] for s in seqs]
    wbytes = sum(w.nbytes for w in weights.values())
    case = Case("decode", f"{_what(cfg)}: {N_REQUESTS} requests of {min(lens)}-{max(lens)} tokens, one token each "
                f"per round, {dt.name}", {}, refs, bytes=wbytes, flops=cfg.matmul_flops(N_REQUESTS, 1), dtype=dt,
                items=N_REQUESTS, item_name="token",
                params={"config": cfg, "weights": weights, "S": S, "lens": lens, "seqs": seqs})
    rows = []
    if lfi.unavailable(ctx.device) is None:
        rows.append(lfi.guard(case, "laneflow compiled, one request after another", 1,
                              lambda: _laneflow_requests(case, ctx, streams=1)))
        rows.append(lfi.guard(case, "laneflow compiled, a stream per request", N_REQUESTS,
                              lambda: _laneflow_requests(case, ctx, streams=N_REQUESTS)))
        rows.append(lfi.guard(case, "laneflow compiled, one padded batch", 1, lambda: _laneflow_batch(case, ctx)))
    return ctx.run_case(case, "decode", rows, peers=False)


def _laneflow_requests(case: Case, ctx, streams: int) -> Impl:
    """Each request its own compiled B=1 step call (one compiled function: one trace), on one stream or
    a stream each."""
    cfg, S, lens, seqs = (case.params[k] for k in ("config", "S", "lens", "seqs"))
    sts = [lf.new_stream(ctx.device, lanes=1) for _ in range(streams)]
    reqs = []
    for r, (n, s) in enumerate(zip(lens, seqs)):
        st = sts[r % streams]
        params, cache = _prepare(ctx, cfg, case.params["weights"], s[:, :n], S, st)
        with lf.stream(st):
            tok, pos = lf.array(s[:, n]), lf.array(np.int32(n))
        reqs.append({"stream": st, "params": params, "cache": cache, "tok": tok, "pos": pos})
    f = dec.compile_step(cfg, fused=True)

    def run():
        outs = []
        for q in reqs:
            with lf.stream(q["stream"]):
                logits, q["cache"] = f(q["params"], q["tok"], q["pos"], q["cache"])
            outs.append(logits)
        return outs

    def sync():
        for st in sts:
            st.synchronize()

    label = "laneflow compiled, " + ("a stream per request" if streams > 1 else "one request after another")
    return Impl(label, run, lfi.host, lanes=streams, sync=sync,
                note="lf.nn attention; each request's caches donated", close=lambda: [s.close() for s in sts])


def _laneflow_batch(case: Case, ctx) -> Impl:
    """The requests as one batch: prompts right-padded to the longest, each row at its own position."""
    cfg, S, lens, seqs = (case.params[k] for k in ("config", "S", "lens", "seqs"))
    T = max(lens)
    ids = np.zeros((len(lens), T), np.int32)
    for r, (n, s) in enumerate(zip(lens, seqs)):
        ids[r, :n] = s[0, :n]
    stream = lf.new_stream(ctx.device, lanes=1)
    params, cache = _prepare(ctx, cfg, case.params["weights"], ids, S, stream)
    with lf.stream(stream):
        tok = lf.array(np.array([s[0, n] for n, s in zip(lens, seqs)], np.int32))
        pos = lf.array(np.array(lens, np.int32))
    f = dec.compile_step(cfg, fused=True)
    state = {"cache": cache}

    def run():
        with lf.stream(stream):
            logits, state["cache"] = f(params, tok, pos, state["cache"])
        return logits

    def to_host(out):
        a = np.asarray(out)
        return [a[r:r + 1] for r in range(a.shape[0])]
    return Impl("laneflow compiled, one padded batch", run, to_host, lanes=1, sync=stream.synchronize,
                note="(N,) positions: the rows' keys and values scattered", close=stream.close)
