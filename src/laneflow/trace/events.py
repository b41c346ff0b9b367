"""One recorded command of a trace (what the recorder makes and the exporters read)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One command. Times are seconds since the trace started (host ``perf_counter`` clock)."""

    op: str
    lane: str  # "cpu:0/s3.1" = lane 1 of stream 3 on cpu:0
    device: str
    stream: int
    lane_index: int
    seq: int  # the command's sequence number on its lane
    enqueue: float  # host: when the encoder submitted it
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start
