"""Timelines: record what each lane ran (``lf.trace()``), export to Perfetto, plot one row per lane."""

from .events import TraceEvent
from .recorder import Trace, trace

__all__ = ["Trace", "TraceEvent", "trace"]
