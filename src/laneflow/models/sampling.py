"""Choosing the next token from logits: greedy, top-k and top-p (nucleus) sampling.

Greedy runs on the device (``lf.argmax``: nothing comes back to the host). Top-k and top-p bring the
logits to the host and pick with numpy, drawing one uniform number per row from ``lf.random`` with the
caller's key, so a seed gives the same tokens on the CPU and the GPU (laneflow's Philox words are the
same on both).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _ops_namespace as lf_ops
from .. import random as lf_random


def sample(logits: Any, key: Any = None, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Any:
    """Next tokens (b,) from ``logits`` (b, vocab). ``temperature`` 0 (or ``top_k`` 1) is greedy and
    returns an lf.Array on the logits' device; otherwise a numpy int32 array drawn with ``key``
    (an ``lf.random.key``): the ``top_k`` most likely tokens (0: all), then the fewest most likely
    tokens whose probabilities reach ``top_p`` (1: all), renormalised."""
    if temperature < 0 or top_k < 0 or not 0 < top_p <= 1:
        raise ValueError(f"sample: temperature >= 0, top_k >= 0 and 0 < top_p <= 1, got {temperature}, {top_k}, {top_p}")
    if temperature == 0 or top_k == 1:
        return lf_ops.argmax(logits, axis=-1).astype("int32")
    if key is None:
        raise ValueError("sample: sampling needs a key (lf.random.key(seed), split once per step)")
    b = logits.shape[0]
    u = np.asarray(lf_random.uniform((b,), key=key), np.float64)
    return pick(np.asarray(logits, np.float64), u, temperature=temperature, top_k=top_k, top_p=top_p)


def pick(logits: np.ndarray, u: np.ndarray, *, temperature: float = 1.0, top_k: int = 0,
         top_p: float = 1.0) -> np.ndarray:
    """The sampling of :func:`sample` on host logits (b, vocab) with uniform numbers ``u`` (b,)."""
    z = logits / temperature
    if 0 < top_k < z.shape[-1]:
        kth = np.partition(z, -top_k, axis=-1)[:, -top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    if top_p < 1:
        order = np.argsort(-p, axis=-1, kind="stable")
        ps = np.take_along_axis(p, order, axis=-1)
        before = np.cumsum(ps, axis=-1) - ps  # mass of the more likely tokens
        drop = np.zeros_like(p, dtype=bool)
        np.put_along_axis(drop, order, before >= top_p, axis=-1)
        p = np.where(drop, 0.0, p)
        p /= p.sum(axis=-1, keepdims=True)
    cdf = np.cumsum(p, axis=-1)
    idx = (cdf < u[:, None] * cdf[:, -1:]).sum(axis=-1)
    return np.minimum(idx, p.shape[-1] - 1).astype(np.int32)
