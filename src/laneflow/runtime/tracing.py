"""The trace hook: how the encoder and the lanes report commands to an active ``lf.trace()``.

``active`` is ``None`` unless a trace is recording, so the cost when not tracing is one global read
in the encoder and one in the lane that runs the command. Backend-neutral: a backend reports times
through the :class:`TraceSink` methods and never imports :mod:`laneflow.trace`.

The protocol, per command:

1. the encoder calls ``active.enqueued(lane, cmd)`` right before the lane enqueues it (host time);
2. the lane reports when the command ran, before it signals the command's fence, so a trace that
   waits on fences sees complete records:

   - host-executed lanes (CPU worker threads) call ``sink.ran(lane, seq, start, end)`` with
     ``time.perf_counter()`` seconds taken around the work;
   - device lanes (CUDA streams) record timing events around the command *only while a sink is
     active* and call ``sink.ran_on_device(lane, seq, resolve)``: after the command has finished, the
     trace calls ``resolve()``, which returns ``(start, end)`` on the ``perf_counter`` clock (for
     example: an anchor event recorded at a known host time plus ``cuEventElapsedTime``).

Commands enqueued while no trace was active are ignored by a later trace (it only knows what it saw
enqueued), so a trace never holds events from outside its ``with`` block.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

#: The recording trace, or None. Read it into a local once per command (it may change concurrently).
active: "TraceSink | None" = None


class TraceSink(Protocol):
    """What a recorder implements (see :class:`laneflow.trace.recorder.Trace`)."""

    #: ``time.perf_counter()`` when recording started (device lanes may anchor their clocks to it).
    start: float

    def enqueued(self, lane: Any, cmd: Any) -> None: ...

    def ran(self, lane: Any, seq: int, start: float, end: float) -> None: ...

    def ran_on_device(self, lane: Any, seq: int, resolve: Callable[[], tuple[float, float]]) -> None: ...
