"""Encoder counters, exposed to users as ``lf.stats()``.

The counters are process-wide and cheap (plain integer adds under the scheduling lock):

- ``commands``: commands submitted to any lane.
- ``waits_emitted``: cross-lane waits actually enqueued (event waits on CUDA, fence waits on the CPU).
- ``waits_elided``: cross-lane dependencies that needed no wait because the lane had already waited
  for that point or a later one (directly or through another lane: the vector clock).
- ``same_lane_deps``: dependencies between commands on one lane (program order covers them).
- ``hazards``: {"raw", "war", "waw"} dependencies found, before elision.
- ``per_lane``: commands submitted per lane name (``"cpu:0/s3.1"`` = lane 1 of stream 3 on cpu:0).
"""

from __future__ import annotations

import weakref
from collections import Counter
from typing import Any


class EncoderStats:
    """The counters. ``commands`` and ``per_lane`` cost nothing per command: they are read from each
    lane's ``submitted`` (the encoder counts it anyway) against its value at the last reset; a lane
    that dies leaves its count in ``_gone`` (``Lane.__del__``)."""

    __slots__ = ("waits_emitted", "waits_elided", "same_lane_deps", "raw", "war", "waw", "_lanes", "_gone")

    def __init__(self) -> None:
        self._lanes: weakref.WeakSet = weakref.WeakSet()
        self.reset()

    def track(self, lane: Any) -> None:
        """A new lane (``Lane.__init__``): its commands count from 0."""
        self._lanes.add(lane)

    def gone(self, lane: Any) -> None:
        """A lane is dying: keep the commands it had since the last reset."""
        n = lane.submitted - lane.stats_base
        if n:
            self._gone[lane.name] += n

    def reset(self) -> None:
        self.waits_emitted = 0
        self.waits_elided = 0
        self.same_lane_deps = 0
        self.raw = self.war = self.waw = 0
        self._gone: Counter = Counter()
        for lane in list(self._lanes):
            lane.stats_base = lane.submitted

    def per_lane(self) -> dict[str, int]:
        out = Counter(self._gone)
        for lane in list(self._lanes):
            n = lane.submitted - lane.stats_base
            if n:
                out[lane.name] += n
        return dict(out)

    def snapshot(self) -> dict[str, Any]:
        per_lane = self.per_lane()
        return {
            "commands": sum(per_lane.values()),
            "waits_emitted": self.waits_emitted,
            "waits_elided": self.waits_elided,
            "same_lane_deps": self.same_lane_deps,
            "hazards": {"raw": self.raw, "war": self.war, "waw": self.waw},
            "per_lane": per_lane,
        }


STATS = EncoderStats()
