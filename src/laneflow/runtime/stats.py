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

from collections import Counter
from typing import Any


class EncoderStats:
    __slots__ = ("commands", "waits_emitted", "waits_elided", "same_lane_deps", "raw", "war", "waw", "per_lane")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.commands = 0
        self.waits_emitted = 0
        self.waits_elided = 0
        self.same_lane_deps = 0
        self.raw = self.war = self.waw = 0
        self.per_lane: Counter = Counter()

    def snapshot(self) -> dict[str, Any]:
        return {
            "commands": self.commands,
            "waits_emitted": self.waits_emitted,
            "waits_elided": self.waits_elided,
            "same_lane_deps": self.same_lane_deps,
            "hazards": {"raw": self.raw, "war": self.war, "waw": self.waw},
            "per_lane": dict(self.per_lane),
        }


STATS = EncoderStats()
