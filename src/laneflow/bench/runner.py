"""Running suites: the context a suite sees, peers per case, progress on long runs."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from . import peers as peer_registry
from .floors import Floors
from . import suites  # noqa: F401 - registers the suites
from .harness import SUITES, Case, Impl, Result, run_impl, run_interleaved, skipped
from .peers import PeerUnavailable


class Progress:
    """A rich progress line on stderr when it is a terminal; silent otherwise (logs, tests, JSON)."""

    def __init__(self, enabled: bool | None = None):
        if enabled is None:
            enabled = sys.stderr.isatty()
        self._p = None
        self._task = None
        if enabled:
            try:
                from rich.console import Console
                from rich.progress import BarColumn, Progress as RichProgress, SpinnerColumn, TextColumn, \
                    TimeElapsedColumn
            except ImportError:
                return
            self._p = RichProgress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                   TextColumn("{task.completed}/{task.total} runs"), TimeElapsedColumn(),
                                   console=Console(stderr=True), transient=True)

    def __enter__(self) -> "Progress":
        if self._p is not None:
            self._p.__enter__()
            self._task = self._p.add_task("starting", total=0)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._p is not None:
            self._p.remove_task(self._task)
            self._p.__exit__(*exc)

    def add(self, n: int) -> None:
        if self._p is not None:
            task = next(t for t in self._p.tasks if t.id == self._task)
            self._p.update(self._task, total=(task.total or 0) + n)

    def step(self, desc: str) -> None:
        if self._p is not None:
            self._p.update(self._task, description=desc)

    def done(self) -> None:
        if self._p is not None:
            self._p.advance(self._task)


@dataclass
class Context:
    """What a suite function gets: the device, sizes, peers, timing settings and the floors."""

    device: Any
    peers: Sequence[str]
    repeat: int = 10
    quick: bool = False
    lanes: int = 4
    warmup: int = 2
    min_sample_s: float = 0.0
    progress: Progress = field(default_factory=lambda: Progress(False))
    floors: Floors | None = None
    #: "auto" (each suite's own choice), "interleaved" or "sequential" (``--order``)
    order: str = "auto"
    #: this suite's rows take turns sample by sample (set by run_suites from ``order``)
    interleave: bool = False

    def __post_init__(self) -> None:
        if self.floors is None:
            self.floors = Floors(self.device, self.quick)

    @property
    def gpu(self) -> bool:
        return self.device.type == "gpu"

    def size(self, *, quick: dict, cpu: dict | None, gpu: dict) -> dict | None:
        """The case size for this run: ``quick`` with --quick, else by device (None: needs a GPU)."""
        if self.quick:
            return quick
        return gpu if self.gpu else cpu

    def run_case(self, case: Case, kind: str, laneflow: Sequence[Impl | Result], peers: bool = True) -> list[Result]:
        """laneflow's rows, then every requested peer's rows for ``kind`` (``peers=False``: none, for a
        case that compares laneflow's ways with each other), each timed and checked."""
        impls: list[Impl | Result] = list(laneflow)
        for name in self.peers if peers else ():
            try:
                mod = peer_registry.load(name)
                mod.check(self.device)
                make = getattr(mod, kind, None)
                if make is None:
                    impls.append(skipped(case, name, f"no {kind} workload in laneflow's {name} peer"))
                    continue
                impls.extend(make(case, self.device, self.lanes))
            except PeerUnavailable as e:
                impls.append(skipped(case, name, str(e)))
            except Exception as e:  # noqa: BLE001 - a peer's setup failing is reported, not fatal
                r = skipped(case, name, "")
                r.skipped, r.error = None, f"setup: {type(e).__name__}: {e}"[:300]
                impls.append(r)
        self.progress.add(sum(isinstance(i, Impl) for i in impls))
        minimum = max(self.min_sample_s, case.min_sample_s)
        if self.interleave:
            timed = [i for i in impls if isinstance(i, Impl)]
            self.progress.step(f"{case.name}: {len(timed)} rows taking turns")
            done = iter(run_interleaved(case, timed, self.repeat, self.warmup, minimum, self.floors,
                                        progress=lambda name: self.progress.done()))
            return [i if isinstance(i, Result) else next(done) for i in impls]
        results = []
        for impl in impls:
            if isinstance(impl, Result):
                results.append(impl)
                continue
            self.progress.step(f"{case.name}: {impl.name}")
            results.append(run_impl(case, impl, self.repeat, self.warmup, minimum, self.floors))
            self.progress.done()
        return results


def run_suites(names: Sequence[str], ctx: Context) -> Iterator[tuple[str, list[Result] | None, str | None]]:
    """Run suites by name, yielding (suite, results, None), or (suite, None, reason) for a suite that
    cannot run here (a GPU suite on the CPU without --quick)."""
    for name in names:
        s = SUITES[name]
        if s.needs_gpu and not ctx.gpu and not ctx.quick:
            yield name, None, "needs a GPU"
            continue
        ctx.interleave = s.interleave if ctx.order == "auto" else ctx.order == "interleaved"
        with ctx.progress:
            results = s.run(ctx)
        yield name, results, None
