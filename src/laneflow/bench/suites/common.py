"""Inputs shared by the suites: seeded, scaled so outputs stay O(1) in every dtype."""

from __future__ import annotations

import ml_dtypes
import numpy as np

SEED = 20261130


def dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def normal(rng: np.random.Generator, shape: tuple, dt: np.dtype, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(dt)


def f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32)
