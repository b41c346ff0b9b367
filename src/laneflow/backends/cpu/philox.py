"""Philox-4x32-10 in numpy: the counter-based generator behind ``lf.random`` on the CPU.

Element i of a draw uses counter (i, 0, 0, tag) under the draw's key, so numbers depend only on the
key and the element's index: any lane, any order, same numbers. The CUDA backend implements the
same function, so integer bits agree bit for bit across devices.
"""

from __future__ import annotations

import numpy as np

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


def philox(n: int, k0: int, k1: int, tag: int = 0, start: int = 0) -> tuple[np.ndarray, ...]:
    """Four uint32 words for each counter start..start+n-1 under key (k0, k1)."""
    idx = np.arange(start, start + n, dtype=np.uint64)
    c0 = idx & _MASK
    c1 = idx >> _S32
    c2 = np.zeros(n, np.uint64)
    c3 = np.full(n, np.uint64(tag), np.uint64)
    for _ in range(10):
        p0 = c0 * _M0
        p1 = c2 * _M1
        hi0, lo0 = p0 >> _S32, p0 & _MASK
        hi1, lo1 = p1 >> _S32, p1 & _MASK
        c0, c1, c2, c3 = (hi1 ^ c1 ^ np.uint64(k0)), lo1, (hi0 ^ c3 ^ np.uint64(k1)), lo0
        k0 = (k0 + _W0) & 0xFFFFFFFF
        k1 = (k1 + _W1) & 0xFFFFFFFF
    return tuple(c.astype(np.uint32) for c in (c0, c1, c2, c3))


def uniform01(n: int, k0: int, k1: int, bits: int) -> np.ndarray:
    """Uniform floats ``k * 2**-bits`` (0 <= k < 2**bits) in [0, 1), as float64.

    ``bits`` is the significand width of the result dtype (53 float64, 24 float32, 11 float16,
    8 bfloat16): every value is then exact in that dtype, so none rounds up to 1. k takes the top
    bits of word 0 (and, past 32 bits, of word 1).
    """
    w = philox(n, k0, k1)
    if bits > 32:
        k = (w[0].astype(np.uint64) << np.uint64(bits - 32)) ^ (w[1].astype(np.uint64) >> np.uint64(64 - bits))
    else:
        k = w[0] >> np.uint32(32 - bits)
    return k.astype(np.float64) * 2.0 ** -bits


def normal(n: int, k0: int, k1: int, dtype: np.dtype) -> np.ndarray:
    """Standard normal by Box-Muller on two uniforms per element."""
    w = philox(n, k0, k1)
    if dtype == np.float64:
        u1 = ((w[0].astype(np.uint64) << np.uint64(21)) ^ (w[1].astype(np.uint64) >> np.uint64(11))).astype(np.float64)
        u2 = ((w[2].astype(np.uint64) << np.uint64(21)) ^ (w[3].astype(np.uint64) >> np.uint64(11))).astype(np.float64)
        u1 = 1.0 - u1 * (1.0 / 9007199254740992.0)
        u2 = u2 * (1.0 / 9007199254740992.0)
        return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    u1 = np.float32(1.0) - (w[0] >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / 16777216.0)
    u2 = (w[1] >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / 16777216.0)
    return np.sqrt(np.float32(-2.0) * np.log(u1)) * np.cos(np.float32(2.0 * np.pi) * u2)


def split(k0: int, k1: int, num: int) -> np.ndarray:
    """``num`` new keys (shape (num, 2), uint32) derived from one key."""
    w = philox(num, k0, k1, tag=1)
    return np.stack([w[0], w[1]], axis=1)
