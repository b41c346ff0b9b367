"""The benchmark harness: cases, implementations, timing, result records and the suite registry.

A *suite* builds :class:`Case` objects (numpy inputs, a numpy reference, the byte and FLOP counts)
and, for each, a list of :class:`Impl` (laneflow's modes and every importable peer). The harness
times each impl (median and spread over repeats), checks its output against the reference and
returns :class:`Result` records. Nothing is estimated: every figure comes from the run.

Timing: by default the host clock around ``run()`` and ``sync()``. An impl may carry a device-event
:class:`Timer` instead (PyTorch and CuPy do on the GPU). laneflow's GPU backend can supply one by
defining ``event_timer(stream) -> Timer`` on its backend class; :func:`laneflow_timer` picks it up.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import numpy as np


class Timer(Protocol):
    """Device-event timing: ``start()`` before the timed runs, ``stop()`` after; returns seconds."""

    def start(self) -> None: ...

    def stop(self) -> float: ...


@dataclass
class Case:
    """One workload at one size: inputs, the numpy reference and its cost floor."""

    suite: str
    name: str
    inputs: dict[str, np.ndarray]
    reference: Any  # np.ndarray or a list of them (compared pairwise)
    bytes: int = 0  # bytes a perfect implementation must move
    flops: int = 0
    dtype: Any = np.float32
    items: int = 1  # units of work per run (ops in a chain, hops between streams)
    item_name: str = ""
    rtol: float | None = None  # tolerance relative to max |reference|; default from dtype
    params: dict[str, Any] = field(default_factory=dict)
    #: a case's own floor for a sample's length (seconds; the run's ``min_sample_s`` when larger):
    #: a decode step is timed over a loop of steps, as generation runs them
    min_sample_s: float = 0.0

    def tolerance_scale(self) -> float:
        if self.rtol is not None:
            return self.rtol
        kind = np.dtype(self.dtype)
        # bf16/fp16 keep 8-11 mantissa bits; fp32 matmuls may use TF32 on GPUs (JAX's default).
        return 5e-2 if kind.itemsize <= 2 else 5e-3


@dataclass
class Impl:
    """One way to run a case. ``run()`` does one full run and returns its output (handles of the
    framework); ``to_host`` turns that output into numpy (an array or a list of arrays)."""

    name: str
    run: Callable[[], Any]
    to_host: Callable[[Any], Any] = np.asarray
    lanes: int | None = None
    sync: Callable[[], None] = lambda: None
    timer: Timer | None = None
    note: str = ""
    close: Callable[[], None] = lambda: None
    extra: dict[str, Any] = field(default_factory=dict)  # copied into the result (set during runs too)
    check: bool = True  # False: the output is not the case's result (e.g. a cost probe)


@dataclass
class Spread:
    """Summary of per-run times in seconds."""

    median: float
    p25: float
    p75: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, times: Sequence[float]) -> "Spread":
        if not times:
            raise ValueError("Spread.of: no times")
        xs = sorted(times)
        if len(xs) >= 2:
            q = statistics.quantiles(xs, n=4, method="inclusive")
            p25, p75 = q[0], q[2]
        else:
            p25 = p75 = xs[0]
        return cls(statistics.median(xs), p25, p75, xs[0], xs[-1], len(xs))

    @property
    def rel_iqr(self) -> float:
        """Interquartile range relative to the median (0.05 = +-2.5 %)."""
        return (self.p75 - self.p25) / self.median if self.median > 0 else 0.0


@dataclass
class Result:
    suite: str
    workload: str
    impl: str
    lanes: int | None = None
    times: list[float] = field(default_factory=list)  # seconds per run
    items: int = 1
    item_name: str = ""
    bytes: int = 0
    flops: int = 0
    floor_bytes_s: float | None = None
    floor_flops_s: float | None = None
    max_abs_diff: float | None = None
    rtol: float | None = None  # allowed |diff| relative to max |reference| (per output)
    matches: bool | None = None  # None: not checked
    checked: bool = True  # False: a cost probe whose output is not the workload's result
    timer: str = "host"
    skipped: str | None = None
    error: str | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    runs: int | None = None  # runs back to back in each sample (None: not sampled; see same_runs)

    @property
    def spread(self) -> Spread | None:
        return Spread.of(self.times) if self.times else None

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times else None

    @property
    def floor_s(self) -> float | None:
        fs = [f for f in (self.floor_bytes_s, self.floor_flops_s) if f is not None]
        return max(fs) if fs else None

    @property
    def ok(self) -> bool:
        """Ran and matched the reference (a skipped result is not a failure)."""
        return self.error is None and self.matches is not False

    @property
    def status(self) -> str:
        if self.skipped is not None:
            return "skipped"
        if self.error is not None:
            return "error"
        return "ok" if self.ok else "mismatch"

    def to_json(self) -> dict[str, Any]:
        sp = self.spread
        us = lambda s: None if s is None else round(s * 1e6, 3)  # noqa: E731
        return {
            "suite": self.suite, "workload": self.workload, "impl": self.impl, "lanes": self.lanes,
            "status": self.status, "timer": self.timer,
            "median_us": us(sp.median) if sp else None,
            "spread_us": None if sp is None else {"p25": us(sp.p25), "p75": us(sp.p75), "min": us(sp.min),
                                                  "max": us(sp.max)},
            "repeats": sp.n if sp else 0, "runs_per_sample": self.runs,
            "times_us": [us(t) for t in self.times],
            "items": self.items, "item_name": self.item_name,
            "per_item_us": us(sp.median / self.items) if sp and self.items > 1 else None,
            "bytes": self.bytes, "flops": self.flops,
            "floor_us": us(self.floor_s), "floor_bytes_us": us(self.floor_bytes_s),
            "floor_flops_us": us(self.floor_flops_s),
            "fraction_of_floor": (round(self.floor_s / sp.median, 6)
                                  if sp and self.floor_s and sp.median > 0 and self.checked else None),
            "checked": self.checked,
            "max_abs_diff": self.max_abs_diff, "rtol": self.rtol, "matches": self.matches,
            "skipped": self.skipped, "error": self.error, "note": self.note, "extra": self.extra,
        }


# -- workloads every framework runs the same way ----------------------------------------------------

def chain_program(n: int) -> Callable[[Any], Any]:
    """``dispatch``'s program: n dependent ``x + 1.0`` on whatever array type ``x`` is (laneflow and
    every peer run this same function)."""
    def chain(x):
        for _ in range(n):
            x = x + 1.0
        return x
    return chain


# -- timing -------------------------------------------------------------------------------------

class Sampler:
    """One impl's timing: warmed up and its ``inner`` count chosen once (:meth:`prepare`), then one
    sample at a time (:meth:`sample`), so several impls' samples can take turns (:func:`run_interleaved`).

    Each sample runs the workload ``inner`` times (chosen so a sample lasts ``min_sample_s``, at
    least once) and records the mean, so microsecond workloads are not lost in timer resolution.
    """

    #: runs timed to choose ``inner``; the fastest counts: an eager laneflow row's first runs are its
    #: step sighted, built, hit, taped, and only then replayed (with 3, the plain CPU forward's fastest
    #: was now and then a 3.4 ms run of the plan as commands: it kept one run a sample, 2026-12-05)
    TIMED = 5

    def __init__(self, impl: Impl, warmup: int = 1, min_sample_s: float = 0.0):
        self.impl, self.warmup, self.min_sample_s = impl, warmup, min_sample_s
        self.inner = 1
        self.one = 0.0  # seconds of one run, measured by prepare (0: not measured)
        self.times: list[float] = []
        self.out: Any = None

    def prepare(self) -> None:
        impl = self.impl
        for _ in range(max(self.warmup, 1)):
            self.out = impl.run()
            impl.sync()
        if self.min_sample_s > 0:
            one = math.inf
            for _ in range(self.TIMED):
                t = time.perf_counter()
                self.out = impl.run()
                impl.sync()
                one = min(one, time.perf_counter() - t)
            self.one = one
            self.inner = max(1, min(1000, math.ceil(self.min_sample_s / max(one, 1e-9))))

    def sample(self) -> float:
        impl, inner = self.impl, self.inner
        if impl.timer is not None:
            impl.timer.start()
            for _ in range(inner):
                self.out = impl.run()
            dt = impl.timer.stop()
        else:
            impl.sync()
            t = time.perf_counter()
            for _ in range(inner):
                self.out = impl.run()
            impl.sync()
            dt = time.perf_counter() - t
        self.times.append(dt / inner)
        return dt / inner


def measure(impl: Impl, repeat: int, warmup: int = 1, min_sample_s: float = 0.0) -> tuple[list[float], Any]:
    """Per-run seconds over ``repeat`` samples, and the last run's output (see :class:`Sampler`)."""
    s = Sampler(impl, warmup, min_sample_s)
    s.prepare()
    for _ in range(repeat):
        s.sample()
    return s.times, s.out


def compare(got: Any, ref: Any) -> list[tuple[float, float]]:
    """(max |got - ref|, max |ref|) per output; ``ref`` may be a list of outputs."""
    if isinstance(ref, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(ref):
            raise ValueError(f"expected {len(ref)} outputs, got {type(got).__name__}")
        return [p for g, r in zip(got, ref) for p in compare(g, r)]
    g = np.asarray(got, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if g.shape != r.shape:
        raise ValueError(f"output shape {g.shape} != reference shape {r.shape}")
    if r.size == 0:
        return [(0.0, 0.0)]
    return [(float(np.max(np.abs(g - r))), float(np.max(np.abs(r))))]


def _new_result(case: Case, impl: Impl, floors: Any) -> Result:
    res = Result(case.suite, case.name, impl.name, lanes=impl.lanes, items=case.items, item_name=case.item_name,
                 bytes=case.bytes, flops=case.flops, note=impl.note,
                 timer="device events" if impl.timer is not None else "host")
    if floors is not None:
        res.floor_bytes_s, res.floor_flops_s = floors.floor(case)
    return res


def _check(res: Result, case: Case, impl: Impl, times: list[float], out: Any) -> None:
    res.times = times
    res.checked = impl.check
    if impl.check:
        pairs = compare(impl.to_host(out), case.reference)
        res.rtol = case.tolerance_scale()
        res.max_abs_diff = max(d for d, _ in pairs)
        res.matches = all(d <= res.rtol * s for d, s in pairs)
    res.extra.update(impl.extra)


def _failed(res: Result, e: Exception) -> None:
    res.error = f"{type(e).__name__}: {e}"[:300]


def _close(impl: Impl) -> None:
    try:
        impl.close()
    except Exception:  # noqa: BLE001
        pass


FIRST_CALL_NOTE = "one sample: the first forward of these shapes in this process"


def first_call(case: Case, impl: Impl, floors: Any = None) -> Result:
    """One sample of ``impl``'s first run, timed on the host from before the call to after its sync
    (compiles, plans and set-up included: what a new shape costs), and checked. Rows named "..., first
    call" of laneflow and of its peers, so each is compared with its like."""
    res = _new_result(case, impl, floors)
    res.timer = "host"
    try:
        impl.sync()
        t = time.perf_counter()
        out = impl.run()
        impl.sync()
        _check(res, case, impl, [time.perf_counter() - t], out)
    except Exception as e:  # noqa: BLE001 - a failing row is reported, not fatal
        _failed(res, e)
    finally:
        _close(impl)
    return res


def run_impl(case: Case, impl: Impl, repeat: int, warmup: int = 1, min_sample_s: float = 0.0,
             floors: Any = None) -> Result:
    """Time one impl on one case and check its output. Exceptions become the result's ``error``."""
    return run_interleaved(case, [impl], repeat, warmup, min_sample_s, floors)[0]


#: the longest sample :func:`same_runs` gives a row, in multiples of ``min_sample_s``: a row that slow
#: keeps its own count (a 10 ms eager forward beside 0.6 ms compiled calls runs once, not four times)
MAX_SAMPLE_FACTOR = 10


def same_runs(samplers: Sequence[Sampler], min_sample_s: float) -> None:
    """Give every row of a case taking turns the same count of runs per sample: the largest any row
    needs for a sample of ``min_sample_s``. Rows with their own counts compared unlike with unlike: a
    sample's first run follows another row's (cold caches), the next ones follow the row's own runs,
    so a row sampled six times in a row (numpy's 0.4 ms forward) came out warmer than one sampled once
    (laneflow's 1 ms eager forward on the CPU: 1.05 ms taking turns, 0.65 ms run after itself,
    2026-12-05). A row whose sample would then last longer than :data:`MAX_SAMPLE_FACTOR` times
    ``min_sample_s`` keeps its own count (its runs are long enough to be cold or warm alike)."""
    if not samplers or min_sample_s <= 0:
        return
    n = max(s.inner for s in samplers)
    cap = MAX_SAMPLE_FACTOR * min_sample_s
    for s in samplers:
        if n * s.one <= cap:
            s.inner = n


def run_interleaved(case: Case, impls: Sequence[Impl], repeat: int, warmup: int = 1, min_sample_s: float = 0.0,
                    floors: Any = None, progress: Callable[[str], None] | None = None) -> list[Result]:
    """Time several impls of one case taking turns: every impl is warmed up, then each repeat takes one
    sample of every impl, starting one row later each repeat. Host-bound rows (eager laneflow, eager
    PyTorch) drift with the machine's load; sampled in turns, each row sees the same drift, so the same
    run's figures compare. The turning start spreads what a row leaves behind for the next one (an
    uncached laneflow row left the row after it about 40 us more on the CPU, 2026-12-04) over all rows,
    where a fixed order charged it to one row at every sample. Every row runs as many times back to back
    in a sample (:func:`same_runs`). Results come back in ``impls``' order; one impl failing leaves the
    others running."""
    results, live = [], []
    for impl in impls:
        res = _new_result(case, impl, floors)
        results.append(res)
        s = Sampler(impl, warmup, min_sample_s)
        try:
            s.prepare()
            live.append((res, impl, s))
        except Exception as e:  # noqa: BLE001 - one broken impl must not stop the suite
            _failed(res, e)
            _close(impl)
            if progress is not None:
                progress(impl.name)
    same_runs([s for _, _, s in live], min_sample_s)
    for res, _, s in live:
        res.runs = s.inner
    for k in range(repeat):
        turn = k % len(live) if live else 0
        for res, impl, s in live[turn:] + live[:turn]:
            if res.error is not None:
                continue
            try:
                s.sample()
            except Exception as e:  # noqa: BLE001
                _failed(res, e)
    for res, impl, s in live:
        try:
            if res.error is None:
                _check(res, case, impl, s.times, s.out)
        except Exception as e:  # noqa: BLE001
            _failed(res, e)
        finally:
            _close(impl)
        if progress is not None:
            progress(impl.name)
    return results


def skipped(case: Case, impl: str, reason: str, lanes: int | None = None) -> Result:
    return Result(case.suite, case.name, impl, lanes=lanes, items=case.items, item_name=case.item_name,
                  bytes=case.bytes, flops=case.flops, skipped=reason)


def laneflow_timer(stream: Any) -> Timer | None:
    """The backend's device-event timer for ``stream``, when the backend offers one (CUDA, later)."""
    make = getattr(stream.backend, "event_timer", None)
    return make(stream) if make is not None else None


# -- suites -------------------------------------------------------------------------------------

@dataclass
class Suite:
    name: str
    help: str
    run: Callable[["Context"], list[Result]]  # noqa: F821 - Context lives in runner.py
    needs_gpu: bool = False  # at full size; every suite has a --quick size that runs on the CPU
    #: its rows take turns sample by sample (``run_interleaved``) unless ``--order sequential``
    interleave: bool = False


SUITES: dict[str, Suite] = {}


def suite(name: str, help: str, needs_gpu: bool = False, interleave: bool = False) -> Callable:  # noqa: A002
    """Register a suite function ``fn(ctx) -> list[Result]`` under ``name``. ``interleave``: its rows
    are timed taking turns (host-bound rows compared with peers: see :func:`run_interleaved`)."""
    def deco(fn: Callable) -> Callable:
        SUITES[name] = Suite(name, help, fn, needs_gpu, interleave)
        return fn
    return deco
