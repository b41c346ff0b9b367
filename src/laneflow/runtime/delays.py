"""Test hook: random per-command delays injected into lanes, to shake out missing synchronisation.

Backends call :func:`before_command` on the lane right before running a command's work. With no
hook installed the cost is one global read.
"""

from __future__ import annotations

import random
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

_hook: Callable[[], float] | None = None


def current() -> Callable[[], float] | None:
    return _hook


@contextmanager
def inject_delays(max_seconds: float = 0.002, *, seed: int | None = None,
                  fixed: float | None = None) -> Iterator[None]:
    """Delay every command by a random time in [0, max_seconds] (or exactly ``fixed`` seconds).

    >>> with lf.testing.inject_delays(0.001, seed=3):
    ...     lf.eval(y)
    """
    global _hook
    if fixed is not None:
        if fixed < 0:
            raise ValueError(f"inject_delays: fixed must be >= 0, got {fixed}")
        hook = lambda: fixed  # noqa: E731
    else:
        if max_seconds < 0:
            raise ValueError(f"inject_delays: max_seconds must be >= 0, got {max_seconds}")
        rng = random.Random(seed)
        lock = threading.Lock()

        def hook() -> float:
            with lock:
                return rng.uniform(0.0, max_seconds)

    old, _hook = _hook, hook
    try:
        yield
    finally:
        _hook = old
