"""``lf.trace()``: record every command's lane, op, host enqueue time and start/end while active.

>>> with lf.trace() as t:
...     lf.eval(a @ b, lf.exp(c))
>>> t.save("t.json")      # Chrome trace format: open in https://ui.perfetto.dev
>>> t.plot("t.png")       # one row per lane

Leaving the ``with`` block waits for the commands it saw enqueued to finish (their end times are
needed), then stops recording. Commands enqueued outside the block are never recorded.
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any, Callable

from ..runtime import tracing
from . import chrome, plot as _plot
from .events import TraceEvent


class Trace:
    """A recording; use through :func:`laneflow.trace`. Traces do not nest (one records at a time)."""

    def __init__(self, timeout: float | None = 60.0):
        self.timeout = timeout
        self.start = 0.0
        self._pending: dict[tuple[int, int], tuple] = {}  # (lane id, seq) -> (lane, op, enqueue, seq)
        self._raw: list[tuple[tuple, float, float]] = []  # (enqueue record, start, end)
        self._events: list[TraceEvent] | None = None
        self._deferred: list[tuple[tuple, Callable[[], tuple[float, float]]]] = []
        self._accepting = False
        self._used = False

    # -- context manager -----------------------------------------------------------------------
    def __enter__(self) -> "Trace":
        if self._used:
            raise RuntimeError("trace: a Trace records once; call lf.trace() again for a new one")
        with _LOCK:
            if tracing.active is not None:
                raise RuntimeError("trace: another lf.trace() is already recording (traces do not nest)")
            self._used = True
            self.start = time.perf_counter()
            self._accepting = True
            tracing.active = self
        return self

    def __exit__(self, *exc: Any) -> None:
        # Stop taking new commands, wait for those we saw, then unhook: lanes report a command
        # before signalling its fence, so after the waits every record is complete.
        self._accepting = False
        try:
            self._wait_for_pending()
        finally:
            with _LOCK:
                if tracing.active is self:
                    tracing.active = None
        self._resolve_device_times()

    def _wait_for_pending(self) -> None:
        last: dict[int, tuple[Any, int]] = {}
        for (lane_id, seq), rec in list(self._pending.items()):
            if seq > last.get(lane_id, (None, 0))[1]:
                last[lane_id] = (rec[0], seq)
        for lane, seq in last.values():
            if not lane.host_wait(seq, self.timeout):
                warnings.warn(f"trace: {lane.name} did not finish command {seq} within {self.timeout} s; "
                              "its unfinished commands are left out", RuntimeWarning, stacklevel=3)

    def _resolve_device_times(self) -> None:
        for rec, resolve in self._deferred:
            try:
                start, end = resolve()
            except Exception as e:  # noqa: BLE001 - a broken timing event must not lose the trace
                warnings.warn(f"trace: no device times for {rec[1]} on {rec[0].name}: {e}", RuntimeWarning,
                              stacklevel=3)
                continue
            self._raw.append((rec, start, end))
        self._deferred.clear()
        self._pending.clear()

    # -- the sink the runtime calls (see laneflow.runtime.tracing) -----------------------------
    # Kept cheap: raw tuples here, TraceEvent objects only when .events is read.
    def enqueued(self, lane: Any, cmd: Any) -> None:
        if self._accepting:
            self._pending[(lane.id, cmd.seq)] = (lane, cmd.op, time.perf_counter(), cmd.seq)

    def ran(self, lane: Any, seq: int, start: float, end: float) -> None:
        rec = self._pending.pop((lane.id, seq), None)  # dict ops are atomic: no lock on the hot path
        if rec is not None:
            self._raw.append((rec, start, end))

    def ran_on_device(self, lane: Any, seq: int, resolve: Callable[[], tuple[float, float]]) -> None:
        rec = self._pending.pop((lane.id, seq), None)
        if rec is not None:
            self._deferred.append((rec, resolve))

    def _event(self, rec: tuple, start: float, end: float) -> TraceEvent:
        lane, op, enq, seq = rec
        t0 = self.start
        return TraceEvent(op=op, lane=lane.name, device=str(lane.device), stream=lane.stream_id,
                          lane_index=lane.index, seq=seq, enqueue=enq - t0, start=start - t0, end=end - t0)

    # -- results -------------------------------------------------------------------------------
    @property
    def events(self) -> list[TraceEvent]:
        """Recorded commands, ordered by start time."""
        if self._events is None or len(self._events) != len(self._raw):
            self._events = sorted((self._event(*r) for r in list(self._raw)), key=lambda e: (e.start, e.lane, e.seq))
        return list(self._events)

    @property
    def lanes(self) -> list[str]:
        """Lane names that ran at least one recorded command, by device, stream and lane index."""
        seen = {(e.device, e.stream, e.lane_index): e.lane for e in self.events}
        return [seen[k] for k in sorted(seen)]

    def summary(self) -> dict[str, Any]:
        """Span of the trace and, per lane, commands and busy time (seconds)."""
        ev = self.events
        if not ev:
            return {"commands": 0, "span": 0.0, "lanes": {}}
        lanes: dict[str, dict[str, float]] = {}
        for e in ev:
            d = lanes.setdefault(e.lane, {"commands": 0, "busy": 0.0})
            d["commands"] += 1
            d["busy"] += e.duration
        span = max(e.end for e in ev) - min(e.start for e in ev)
        return {"commands": len(ev), "span": span, "lanes": lanes}

    def to_chrome(self) -> dict[str, Any]:
        """The trace as a Chrome trace-event dict (see :mod:`laneflow.trace.chrome`)."""
        return chrome.to_chrome(self.events)

    def save(self, path: Any) -> None:
        """Write the Chrome trace format (JSON): open it in https://ui.perfetto.dev or chrome://tracing."""
        chrome.save(self.events, path)

    def plot(self, path: Any, title: str | None = None) -> None:
        """Draw one row per lane, each command a bar, into an image file (PNG, SVG, PDF...)."""
        _plot.plot(self.events, path, title=title)

    def __repr__(self) -> str:
        state = "recording" if tracing.active is self else f"{len(self._raw)} events"
        return f"<Trace {state}>"


_LOCK = threading.Lock()


def trace(timeout: float | None = 60.0) -> Trace:
    """Record a timeline of every command enqueued inside the ``with`` block.

    ``timeout``: how long leaving the block waits for recorded commands to finish.

    >>> with lf.trace() as t:
    ...     lf.eval(x @ y, lf.exp(z))
    >>> t.save("trace.json"); t.plot("timeline.png")
    """
    return Trace(timeout)
