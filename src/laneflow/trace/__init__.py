"""Timelines: record what each lane ran (``lf.trace()``), export to Perfetto, plot one row per lane."""

from .recorder import Trace, TraceEvent, trace

__all__ = ["Trace", "TraceEvent", "trace"]
