"""laneflow's own rows in every suite: eager on 1 lane, eager on several lanes, compiled.

A suite gives a *program*: a function of laneflow arrays (made from the given numpy inputs) returning
an array or a list of arrays, written as ordinary sequential code. The same program runs in every
mode, so differences come from lanes and compilation alone.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

import laneflow as lf
from laneflow.runtime.backend import backend_for

from ..graph import eval_cache, fusion, speculate, tape, views

from .harness import Case, Impl, Result, laneflow_timer, skipped


def unavailable(device: Any) -> str | None:
    """Why laneflow cannot run on ``device`` here, or None."""
    if device.type == "gpu" and not lf.gpu_available():
        try:
            lf.new_stream(device)
        except Exception as e:  # noqa: BLE001 - the message is the reason
            return f"laneflow GPU backend not usable here ({str(e)[:200]})"
        return "laneflow GPU backend not usable here"
    return None


def host(out: Any) -> Any:
    if isinstance(out, (list, tuple)):
        return [np.asarray(o) for o in out]
    return np.asarray(out)


def stacked(out: Any) -> np.ndarray:
    return np.stack([np.asarray(o) for o in out])


def eager(case: Case, device: Any, program: Callable, inputs: Sequence[np.ndarray], lanes: int, *,
          to_host: Callable = host, label: str = "laneflow eager", note: str = "", stream: Any = None,
          cached: bool = True, report_cache: bool = True) -> Impl:
    """``program`` evaluated eagerly (one lf.eval per run) on a new stream with ``lanes`` lanes (or on
    ``stream``). ``cached=False``: with the plan cache bypassed, every run takes the path of a graph
    seen for the first time (the row "laneflow eager, uncached"); by default repeated runs hit it, and
    the row's note says what the cache did (``report_cache``; off for compiled calls, whose outputs
    never meet it)."""
    stream = stream if stream is not None else lf.new_stream(device, lanes=lanes)
    args = [lf.array(a, stream=stream) for a in inputs]
    lf.eval(*args)
    timer = laneflow_timer(stream)

    def run():
        with lf.stream(stream):
            y = program(*args)
        if timer is None:
            lf.eval(y)
        else:
            lf.async_eval(y)
        return y

    extra: dict = {}
    plain_run = run
    if not cached:
        def run():  # noqa: F811 - the same run, with the plan cache bypassed
            with eval_cache.bypass():
                return plain_run()
    elif report_cache:
        counts = extra["plan_cache"] = {"runs": 0, "hits": 0, "executor_runs": 0, "speculation_used": 0,
                                        "tape_replays": 0}

        def run():  # noqa: F811 - the same run, counting what the plan cache did (shown in the note)
            st, sp, tp = eval_cache.STATS, speculate.STATS, tape.STATS
            hits, execs, used, replays = st["hits"], st["executor_runs"], sp["speculation_used"], tp["tape_replays"]
            failures, diverged = tape.FAILURES[0], tp["tape_divergences"]
            y = plain_run()
            counts["runs"] += 1
            counts["hits"] += st["hits"] - hits
            counts["executor_runs"] += st["executor_runs"] - execs
            counts["speculation_used"] += sp["speculation_used"] - used
            counts["tape_replays"] += tp["tape_replays"] - replays
            if tape.FAILURES[0] != failures:  # (why this row's step was not taped)
                counts["tape_last_failure"] = tape.LAST_FAILURE[0]
            if tp["tape_divergences"] != diverged:  # (where its replay left the tape)
                counts["tape_last_divergence"] = tape.LAST_DIVERGENCE[0]
            return y

    return Impl(label, run, to_host, lanes=lanes, sync=lambda: stream.synchronize(), timer=timer,
                note=note, close=stream.close, extra=extra)


def fused(case: Case, device: Any, program: Callable, inputs: Sequence[np.ndarray], lanes: int, *,
          to_host: Callable = host) -> Impl:
    """``eager`` with elementwise fusion turned on for its runs (graph/fusion.py), for a run with
    ``LANEFLOW_FUSE=0``, so one run compares both."""
    impl = eager(case, device, program, inputs, lanes, to_host=to_host, label="laneflow eager, fused")
    impl.run = _with_fusion(impl.run, True)
    return impl


def _with_fusion(run: Callable, enabled: bool) -> Callable:
    """``run`` with elementwise fusion set to ``enabled`` while it runs (restored after)."""
    return _while_set(run, lambda: fusion._enabled, fusion.set_enabled, enabled)


def _while_set(run: Callable, read: Callable, write: Callable, value: Any) -> Callable:
    """``run`` with a setting (``read()``, ``write(v)``) at ``value`` while it runs, restored after."""

    def wrapped():
        was = read()
        write(value)
        try:
            return run()
        finally:
            write(was)

    return wrapped


def _renamed(impl: Impl | Result, run: Callable, suffix: str) -> Impl | Result:
    """``impl`` (a laneflow row; a Result is a failure to show as it is) running ``run(impl.run)``
    instead, its name ending in ``suffix``."""
    if isinstance(impl, Result):
        return impl
    impl.run = run(impl.run)
    impl.name += suffix
    return impl


def unviewed(impl: Impl | Result) -> Impl | Result:
    """``impl`` (a laneflow row) with layout folding off while it runs (every reshape, transpose and
    slice its own copy), named so: the row that counts every op as a command."""
    return _renamed(impl, lambda run: _while_set(run, views.enabled, views.set_enabled, False), ", views off")


def unspeculated(impl: Impl | Result) -> Impl | Result:
    """``impl`` (an eager laneflow row) with speculative launch off while it runs
    (``graph/speculate.py``), named so: the row that shows what starting the GPU at the first op gains."""
    return _renamed(impl, lambda run: _while_set(run, speculate.enabled, speculate.set_enabled, False),
                    ", not speculated")


def untaped(impl: Impl | Result) -> Impl | Result:
    """``impl`` (an eager laneflow row) with trace-guided replay paused while it runs (``graph/tape.py``),
    named so: the row that shows what answering the ops from the step's tape gains."""
    return _renamed(impl, lambda run: _while_set(run, tape.enabled, tape.set_enabled, False), ", not taped")


def unfused(impl: Impl | Result) -> Impl | Result:
    """``impl`` (a laneflow row) with elementwise fusion off while it runs, named so."""
    return _renamed(impl, lambda run: _with_fusion(run, False), ", fusion off")


def compiled(case: Case, device: Any, program: Callable, inputs: Sequence[np.ndarray], lanes: int, *,
             to_host: Callable = host) -> Impl | Result:
    if not hasattr(lf, "compile"):
        return skipped(case, "laneflow compiled", "lf.compile not available yet", lanes)
    f = lf.compile(program)
    impl = eager(case, device, f, inputs, lanes, to_host=to_host, label="laneflow compiled", report_cache=False)

    def to_host_with_stats(out, convert=impl.to_host):
        # after timing (the check converts the output): how the calls ran, for the JSON
        st = f.stats()
        if st:
            keep = ("mode", "steps", "nodes", "branches", "captures", "evacuated", "staged_args", "note")
            impl.extra["compiled"] = {k: v for k, v in st[0].items() if k in keep and v not in ("", None)}
        return convert(out)

    impl.to_host = to_host_with_stats
    return impl


def compiled_captured(case: Case, device: Any, make: Callable, inputs: Sequence[np.ndarray],
                      captured: Sequence[np.ndarray], lanes: int, *, to_host: Callable = host) -> Impl:
    """``lf.compile(make(arrays))`` where ``arrays`` are ``captured`` made into laneflow arrays once:
    values the function closes over (weights) are constants of the compiled plan, not arguments, so a
    call binds only ``inputs``. How a user would write a model step; PyTorch's graphs capture their
    weights the same way."""
    stream = lf.new_stream(device, lanes=lanes)
    caps = [lf.array(c, stream=stream) for c in captured]
    lf.eval(*caps)
    impl = eager(case, device, lf.compile(make(caps)), inputs, lanes, to_host=to_host,
                 label="laneflow compiled, weights captured", stream=stream, report_cache=False)
    return impl


def guard(case: Case, label: str, lanes: int | None, make: Callable[[], Impl | Result]) -> Impl | Result:
    """``make()``, or an error row when building the impl fails (e.g. a backend still being written)."""
    try:
        return make()
    except Exception as e:  # noqa: BLE001 - a setup failure is a result, not a crash
        r = skipped(case, label, "")
        r.skipped, r.error, r.lanes = None, f"setup: {type(e).__name__}: {e}"[:300], lanes
        return r


def modes(case: Case, device: Any, lanes: int, program: Callable, inputs: Sequence[np.ndarray], *,
          to_host: Callable = host, fused_row: bool = False) -> list[Impl | Result]:
    """The standard laneflow rows: eager 1 lane, eager ``lanes`` lanes, compiled on ``lanes`` lanes;
    with ``fused_row``, also eager on 1 lane with elementwise fusion on, where the backend does not
    fuse by default."""
    why = unavailable(device)
    if why is not None:
        return [skipped(case, "laneflow", why)]
    out: list[Impl | Result] = [
        guard(case, "laneflow eager, uncached", 1,
              lambda: eager(case, device, program, inputs, 1, to_host=to_host, label="laneflow eager, uncached",
                            cached=False, note="plan cache bypassed: every run a graph seen for the first time")),
        guard(case, "laneflow eager", 1, lambda: eager(case, device, program, inputs, 1, to_host=to_host,
                                                       note="repeated runs hit the plan cache"))]
    if lanes > 1:
        out.append(guard(case, "laneflow eager", lanes,
                         lambda: eager(case, device, program, inputs, lanes, to_host=to_host)))
    if fused_row and device.type == "gpu" and not backend_for(device).fuses_elementwise:
        out.append(guard(case, "laneflow eager, fused", 1,
                         lambda: fused(case, device, program, inputs, 1, to_host=to_host)))
    out.append(guard(case, "laneflow compiled", lanes,
                     lambda: compiled(case, device, program, inputs, lanes, to_host=to_host)))
    return out
