"""Counter-based random numbers (Philox-4x32-10): reproducible by key, whatever lanes or order.

>>> k = lf.random.key(0)
>>> a, b = lf.random.split(k)
>>> x = lf.random.normal((4, 4), key=a)

Without ``key=``, a process-wide key (``lf.random.seed``) is split once per call. The default
dtype is float32, the common choice for ML work (numpy's default would be float64).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from . import dtypes as dt
from .array import Array
from .errors import CompileError
from .graph import tracer as _tracer
from .backends.cpu import philox as _philox
from .ops.core import check_shape, constant, node, operand, stream_of
from .ops.primitives import Random, RandomSplit

_lock = threading.Lock()
_state = {"k0": 0, "k1": 0, "counter": 0}


def seed(s: int) -> None:
    """Reset the process-wide key used by calls without ``key=``."""
    k0, k1 = _split_seed(s, "seed")
    with _lock:
        _state.update(k0=k0, k1=k1, counter=0)


def _split_seed(s: Any, op: str) -> tuple[int, int]:
    if not isinstance(s, (int, np.integer)) or isinstance(s, bool):
        raise TypeError(f"{op}: seed must be an int, got {type(s).__name__}")
    s = int(s) & 0xFFFFFFFFFFFFFFFF
    return s & 0xFFFFFFFF, s >> 32


def key(seed: int, *, stream: Any = None) -> Array:
    """A key (uint32 array of shape (2,)) from an integer seed."""
    k0, k1 = _split_seed(seed, "random.key")
    st = stream_of(stream, "random.key")
    return Array._wrap(constant(np.array([k0, k1], np.uint32), st, op="random.key"))


def _next_key(st) -> Any:
    with _lock:
        c = _state["counter"]
        _state["counter"] = c + 1
        w = _philox.philox(1, _state["k0"], _state["k1"], tag=2, start=c)
    return constant(np.array([w[0][0], w[1][0]], np.uint32), st, op="random.key")


def _key_data(k: Any, st, op: str):
    if k is None:
        if _tracer.tracing():  # the key would be drawn once, at tracing: every call the same numbers
            raise CompileError(
                f"compile: {op} without key= inside a compiled function would give the same numbers on "
                "every call; pass a key as an argument (key=k, with k from lf.random.key / lf.random.split)")
        return _next_key(st)
    d = operand(k, st, op)
    if d.shape != (2,) or d.dtype.kind not in "iu":
        raise ValueError(f"{op}: key must be an integer array of shape (2,) (from lf.random.key), "
                         f"got shape {d.shape} {d.dtype}")
    return d


def split(key: Any, num: int = 2, *, stream: Any = None) -> Array:
    """``num`` independent keys derived from ``key``, as an array of shape (num, 2)."""
    st = stream_of(stream, "random.split")
    if not isinstance(num, (int, np.integer)) or isinstance(num, bool) or num < 1:
        raise ValueError(f"random.split: num must be a positive int, got {num!r}")
    kd = _key_data(key, st, "random.split")
    return node(RandomSplit(int(num)), (kd,), (int(num), 2), kd.dtype, st)


def _draw(op: str, dist: str, shape: Any, dtype: Any, a: float, b: float, key: Any, stream: Any) -> Array:
    st = stream_of(stream, op)
    shape = check_shape(shape, op)
    try:
        to = dt.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"{op}: {e}") from None
    if not dt.is_floating(to):
        raise TypeError(f"{op}: dtype must be a floating dtype, got {to}")
    kd = _key_data(key, st, op)
    return node(Random(op, dist, float(a), float(b)), (kd,), shape, to, st)


def uniform(shape: Any = (), dtype: Any = dt.float32, low: float = 0.0, high: float = 1.0, *,
            key: Any = None, stream: Any = None) -> Array:
    """Uniform samples in [low, high).

    Each sample has the full precision of ``dtype`` (its significand's worth of random bits) and, after
    rounding to ``dtype``, still lies in [low, high): it never equals ``high``.
    """
    if not high >= low:
        raise ValueError(f"random.uniform: high ({high}) must be >= low ({low})")
    return _draw("random.uniform", "uniform", shape, dtype, low, high, key, stream)


def normal(shape: Any = (), dtype: Any = dt.float32, loc: float = 0.0, scale: float = 1.0, *,
           key: Any = None, stream: Any = None) -> Array:
    """Normal samples with mean ``loc`` and standard deviation ``scale``."""
    if not scale >= 0:
        raise ValueError(f"random.normal: scale must be >= 0, got {scale}")
    return _draw("random.normal", "normal", shape, dtype, loc, scale, key, stream)
