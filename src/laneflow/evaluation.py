"""``lf.eval``, ``lf.async_eval`` and ``lf.stats``."""

from __future__ import annotations

from typing import Any, Iterator

from .array import Array
from .graph import early, eval_cache
from .graph import schedule as _sched
from .graph.node import LazyData
from .runtime.lane import CALLER, run_collected
from .runtime.stats import STATS


def _leaves(xs: Any) -> Iterator[Array]:
    """Arrays in nested lists, tuples and dicts (MLX accepts such trees too)."""
    stack = [xs]
    while stack:
        x = stack.pop()
        if isinstance(x, Array):
            yield x
        elif isinstance(x, (list, tuple)):
            stack.extend(reversed(x))
        elif isinstance(x, dict):
            stack.extend(reversed(list(x.values())))
        elif x is not None:
            raise TypeError(f"eval: expected arrays (or lists, tuples, dicts of them), got {type(x).__name__}")


def _arrays(xs: tuple) -> list[Array]:
    if len(xs) == 1:  # the common cases, without walking a tree: one array, or a flat list of them
        x = xs[0]
        t = type(x)
        if t is Array:
            return [x]
        if t is list or t is tuple:
            flat = [a for a in x if type(a) is Array]
            if len(flat) == len(x):
                return flat
    return list(_leaves(xs))


def async_eval(*xs: Any) -> None:
    """Start computing ``xs`` and return at once. Errors surface at the next eval or host read."""
    arrays = _arrays(xs)
    for a in arrays:  # nothing pending (a compiled call's values, values evaluated already): nothing to start
        d = a._data
        if d.__class__ is not LazyData and d.buffer is None:
            break
    else:
        return
    eval_cache.start([a._data for a in arrays])


def eval(*xs: Any, timeout: float | None = None) -> None:  # noqa: A001 - MLX's name
    """Compute ``xs`` and wait for them. Raises the error of an op that failed on the way.

    Independent work runs at the same time on the lanes of each stream; the runtime stays usable
    after an error.
    """
    arrays = _arrays(xs)
    with _sched.LOCK:
        datas = [a._data for a in arrays]
        for d in datas:  # held while waiting: another thread's x[i] = v must not reuse these buffers
            d.arrays += 1
    # Commands a lane leaves to this thread (a cached plan's one command on an idle CPU lane) run
    # here, after the lock is left and before the waits that would otherwise sleep until a worker ran
    # them. Not with a timeout: a command run here could not be given up on.
    outer = CALLER.collect
    collected = CALLER.collect = [] if timeout is None else None
    try:
        try:
            eval_cache.schedule(datas)
        finally:
            CALLER.collect = outer
            if collected:
                run_collected(collected)
        for d in datas:
            _sched.wait(d, timeout)
    finally:
        for d in datas:
            d.arrays -= 1


def set_plan_cache(enabled: bool | None = None, *, executor_after: int | None = None,
                   max_entries: int | None = None, max_bytes: int | None = None,
                   speculate: bool | None = None, tape: bool | None = None) -> None:
    """Settings of the plan cache of ``lf.eval`` (``graph/eval_cache.py``); None keeps a setting.

    A graph evaluated again with the same structure (other values, other Python scalar values) replays
    the plan built at its second sighting, and after ``executor_after`` hits (default 2) runs as one
    CUDA graph (GPU) or one command (CPU). At most ``max_entries`` plans (256) and ``max_bytes`` of
    device memory they pin (4 GiB) are kept, least recently used first out. ``enabled=False`` empties
    it; ``LANEFLOW_PLAN_CACHE=0`` starts with it off. ``speculate``: on a GPU stream, a step that
    repeats starts its CUDA graph when its first op is called, while Python builds the rest, and its
    ``lf.eval`` takes the outputs only if the whole graph and its inputs turned out the same
    (``graph/speculate.py``; on by default, ``LANEFLOW_SPECULATE=0`` starts with it off). ``tape``: a
    step that repeats is recorded once as its op calls, and later steps answer each matching op call
    with the recorded nodes, skipping the op's checks and inference (``graph/tape.py``; on by default,
    ``LANEFLOW_TAPE=0`` starts with it off).

    >>> lf.set_plan_cache(executor_after=0)   # run repeated steps as graphs from their first hit
    """
    with _sched.LOCK:
        eval_cache.configure(enabled, executor_after, max_entries, max_bytes, speculate, tape)


def set_early_launch(every: int) -> None:
    """Start an eager step's GPU work before its ``lf.eval``: after every ``every`` matrix products
    made on GPU streams, the next one first launches its pending operands (as ``lf.async_eval``), so
    the GPU computes while Python builds the rest (``graph/early.py``). Off by default (0;
    ``LANEFLOW_EARLY_LAUNCH=n`` at start-up): each launch costs the host about a plan-cache hit, more
    than GPT-2 small's pieces hide; it can only pay where a piece's GPU time is larger (not yet measured).
    Values equal the unlaunched run's up to rounding (pieces are planned apart, so GEMM grouping and
    epilogues may differ: float32 in the last bits).

    >>> lf.set_early_launch(8)   # launch after every 8 products
    """
    early.set_every(every)


def plan_cache_info() -> dict[str, Any]:
    """The plan cache's settings, entries and pinned bytes, and its counters (hits, misses, first
    sightings, bypassed graphs, evictions, executor runs, early launches; speculative launches made,
    taken and dropped: ``speculated``, ``speculation_used``, ``speculation_wasted``; tapes recorded,
    steps replayed from a tape, replays left mid-step, and replays that failed their tape's own plan:
    ``tapes_recorded``, ``tape_replays``, ``tape_divergences``, ``tape_misses``; ``tapes`` held; and
    ``tape_last_failure``: why the last step that could not be taped was not, naming the op;
    ``tape_last_divergence``: which call of its tape the last replay left it at, and why)."""
    with _sched.LOCK:
        return eval_cache.info()


def stats() -> dict[str, Any]:
    """Encoder counters since the last :func:`reset_stats` (see :mod:`laneflow.runtime.stats`).

    >>> lf.reset_stats(); lf.eval(a + b, c * d); lf.stats()["waits_emitted"]
    0
    """
    with _sched.LOCK:
        return STATS.snapshot()


def reset_stats() -> None:
    with _sched.LOCK:
        STATS.reset()
