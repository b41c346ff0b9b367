"""GPT-2 with a static KV cache: a prefill, then one decode step per token.

Each layer's cache is a pair of arrays ``(batch, heads, max_len, head_dim)`` (keys, values). The prefill
runs the causal forward over the prompts and writes their keys and values at positions ``0 .. t-1``;
a decode step embeds one token per row at its position, writes that token's keys and values into the
cache at the position and attends to every cached position up to it. Positions are arrays on the
device, so a compiled step (``lf.compile(step, donate_argnums=...)``, the caches donated) replays as
one CUDA graph per token with no re-trace, and the caches are updated in place.

- ``pos`` a 0-d integer array: every row at the same position (``lf.dynamic_update_slice``);
- ``pos`` a ``(batch,)`` integer array: each row at its own (prompts of different lengths; a scatter
  of the rows' keys and values through index ``setitem``).

Prompts of different lengths are right-padded to one length for the prefill; row ``r`` then continues
at its own length, and the padding's keys, past its position, are masked until overwritten.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from .. import _ops_namespace as lf_ops
from ..array import Array
from .gpt2 import LANEFLOW_OPS, PREFIX, GPT2Config, Ops, block, head

Cache = list  # [(keys, values)] per layer


def init_cache(cfg: GPT2Config, batch: int, max_len: int, dtype: Any = "float32", device: Any = None) -> Cache:
    """Zeroed caches for ``batch`` rows of up to ``max_len`` positions (at most the model's), in the
    model's dtype (``dtype``: float32 unless given)."""
    if not 0 < max_len <= cfg.n_positions:
        raise ValueError(f"gpt2_decode.init_cache: max_len {max_len} must be between 1 and the model's "
                         f"{cfg.n_positions} positions")
    shape = (batch, cfg.n_head, max_len, cfg.head_dim)
    return [(lf_ops.zeros(shape, dtype=dtype, stream=device), lf_ops.zeros(shape, dtype=dtype, stream=device))
            for _ in range(cfg.n_layer)]


def _masked_attention(q, k, v, scale: float, keep, fused: bool):
    """Attention of q (b, h, 1 or t, d) to the cache k, v (b, h, S, d) where ``keep`` (broadcast to
    (b, h, tq, S)) is True."""
    if fused:
        from .. import nn
        return nn.scaled_dot_product_attention(q, k, v, mask=keep, scale=scale)
    att = lf_ops.where(keep, (q @ k.swapaxes(-1, -2)) * scale, -1e9)
    return lf_ops.softmax(att, axis=-1) @ v


def prefill(params: Mapping[str, Any], ids: Any, cfg: GPT2Config, cache: Cache, ops: Ops | None = None):
    """(logits (b, t, vocab), the caches with the prompts' keys and values at ``0 .. t-1``)."""
    ops = LANEFLOW_OPS if ops is None else ops
    b, t = ids.shape
    S = cache[0][0].shape[2]
    if t > S:
        raise ValueError(f"gpt2_decode.prefill: {t} prompt tokens do not fit a cache of {S} positions")
    scale = 1.0 / math.sqrt(cfg.head_dim)
    h = ops.embed(params[PREFIX + "wte.weight"], ids) + params[PREFIX + "wpe.weight"][:t]
    mask = ops.causal_mask(t)
    new: list = []

    def attend(q, k, v, i):
        kc, vc = cache[i]
        new.append((lf_ops.dynamic_update_slice(kc, k.astype(kc.dtype), (0, 0, 0, 0)),
                    lf_ops.dynamic_update_slice(vc, v.astype(vc.dtype), (0, 0, 0, 0))))
        return ops.attention(q, k, v, scale, mask)
    for i in range(cfg.n_layer):
        h = block(params, i, h, cfg, ops, attend)
    return head(params, h, cfg, ops), new


def decode_step(params: Mapping[str, Any], tok: Any, pos: Any, cfg: GPT2Config, cache: Cache,
                fused: bool = False, ops: Ops | None = None):
    """(logits (b, vocab) of the next token, the updated caches) for tokens ``tok`` (b,) at ``pos``
    (a 0-d integer array, or one position per row, (b,)). ``fused``: attention through
    ``lf.nn.scaled_dot_product_attention`` (else plain ops, whose softmax is one row program)."""
    ops = LANEFLOW_OPS if ops is None else ops
    if not isinstance(pos, Array) or pos.ndim > 1:
        raise TypeError("gpt2_decode.decode_step: pos must be a 0-d or (batch,) integer lf.Array (a device "
                        "position: a compiled step then takes a new one every call)")
    b = tok.shape[0]
    S = cache[0][0].shape[2]
    scale = 1.0 / math.sqrt(cfg.head_dim)
    rows = pos.ndim == 1
    wpe = params[PREFIX + "wpe.weight"]
    pe = lf_ops.take(wpe, pos, axis=0)  # (d,) or (b, d)
    h = ops.embed(params[PREFIX + "wte.weight"], tok.reshape(b, 1)) + pe.reshape(b if rows else 1, 1, wpe.shape[1])
    keep = (lf_ops.arange(S) <= (pos.reshape(b, 1) if rows else pos)).reshape(b if rows else 1, 1, 1, S)
    ridx = lf_ops.arange(b) if rows else None
    new: list = []

    def attend(q, k, v, i):
        kc, vc = cache[i]
        k, v = k.astype(kc.dtype), v.astype(vc.dtype)
        if rows:  # each row at its own position: (b, h, d) rows scattered
            kc = lf_ops.setitem(kc, (ridx, slice(None), pos), k.reshape(b, k.shape[1], k.shape[3]))
            vc = lf_ops.setitem(vc, (ridx, slice(None), pos), v.reshape(b, v.shape[1], v.shape[3]))
        else:
            kc = lf_ops.dynamic_update_slice(kc, k, (0, 0, pos, 0))
            vc = lf_ops.dynamic_update_slice(vc, v, (0, 0, pos, 0))
        new.append((kc, vc))
        return _masked_attention(q, kc, vc, scale, keep, fused)
    for i in range(cfg.n_layer):
        h = block(params, i, h, cfg, ops, attend)
    return head(params, h, cfg, ops).reshape(b, -1), new


def reference_generate(np_params: Mapping[str, np.ndarray], ids: np.ndarray, cfg: GPT2Config, steps: int,
                       reference_forward) -> np.ndarray:
    """Greedy continuation of ``ids`` (b, t) by ``steps`` tokens with the full float64 forward re-run
    each step (no cache): what the cached decode must reproduce."""
    out = np.asarray(ids)
    for _ in range(steps):
        logits = reference_forward(np_params, out, cfg)
        out = np.concatenate([out, logits[:, -1].argmax(-1)[:, None]], axis=1)
    return out


def compile_step(cfg: GPT2Config, params: Mapping[str, Any] | None = None, fused: bool = False):
    """:func:`decode_step` compiled with its caches donated (updated in place: one graph launch a token):
    ``step(params, tok, pos, cache)``, or, with ``params`` given, closed over them (constants of the
    graph: a call binds only the tokens, the positions and the caches) as ``step(tok, pos, cache)``."""
    from .. import compile as lf_compile

    if params is None:
        return lf_compile(lambda p, t, pos, c: decode_step(p, t, pos, cfg, c, fused=fused), donate_argnums=(3,))
    return lf_compile(lambda t, pos, c: decode_step(params, t, pos, cfg, c, fused=fused), donate_argnums=(2,))


def generate(params: Mapping[str, Any], cfg: GPT2Config, prompts: list, max_new: int, *, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, seed: int = 0, dtype: Any = "float32",
             on_token: Any = None, fused: bool = False) -> list[list[int]]:
    """Continue each prompt (a list of token ids; lengths may differ) by ``max_new`` tokens: one prefill
    of the right-padded batch, then one compiled decode step per token (caches donated, each row at its
    own position). ``temperature`` 0 is greedy; else :func:`~laneflow.models.sampling.sample` with
    ``top_k`` / ``top_p`` and keys from ``lf.random.key(seed)``. ``on_token(k)`` is called after the
    k-th new token of every row (progress). ``fused``: attention through ``lf.nn`` instead of the plain
    ops' masked softmax (one row program); ``bench decode`` times both. The compiled step closes over
    ``params`` (constants of its graph: a call binds only the caches, the tokens and the positions).
    Runs on the current stream's device."""
    from .. import random as lf_random
    from .sampling import sample

    lens = [len(p) for p in prompts]
    if not prompts or min(lens) == 0 or max_new < 1:
        raise ValueError("gpt2_decode.generate: needs non-empty prompts and max_new >= 1")
    S = max(lens) + max_new
    if S > cfg.n_positions:
        raise ValueError(f"gpt2_decode.generate: the longest prompt plus max_new is {S} tokens; the model has "
                         f"{cfg.n_positions} positions")
    ids = np.zeros((len(prompts), max(lens)), np.int32)
    for r, p in enumerate(prompts):
        ids[r, :len(p)] = p
    cache = init_cache(cfg, len(prompts), S, dtype=dtype)
    logits, cache = prefill(params, lf_ops.array(ids), cfg, cache)
    step = compile_step(cfg, params, fused)
    keys = lf_random.split(lf_random.key(seed), max_new) if temperature > 0 else None
    out = [list(p) for p in prompts]
    cur = lf_ops.stack([logits[r, n - 1] for r, n in enumerate(lens)])
    pos = np.array(lens, np.int32)
    for k in range(max_new):
        nxt = np.asarray(sample(cur, None if keys is None else keys[k], temperature=temperature, top_k=top_k,
                                top_p=top_p)).astype(np.int32).reshape(-1)
        for r, t in enumerate(nxt):
            out[r].append(int(t))
        if on_token is not None:
            on_token(k + 1)
        if k + 1 < max_new:
            cur, cache = step(lf_ops.array(nxt), lf_ops.array(pos), cache)
            pos += 1
    return out
