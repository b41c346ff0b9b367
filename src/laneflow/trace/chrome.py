"""Chrome trace-event format (the JSON that Perfetto and chrome://tracing open).

One process (``pid``) per device and one thread (``tid``) per lane, named by metadata events so the
UI labels the rows; each command is a complete event (``ph="X"``) with ``ts`` and ``dur`` in
microseconds since the trace started.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable

from .events import TraceEvent


def to_chrome(events: Iterable[TraceEvent]) -> dict[str, Any]:
    events = list(events)
    pids: dict[str, int] = {}
    tids: dict[str, tuple[int, int]] = {}  # lane -> (pid, tid)
    out: list[dict[str, Any]] = []
    # Lanes numbered per device, by stream then lane index, so the rows sort naturally.
    for dev, stream, index, lane in sorted({(e.device, e.stream, e.lane_index, e.lane) for e in events}):
        pid = pids.get(dev)
        if pid is None:
            pid = pids[dev] = len(pids) + 1
            out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"laneflow {dev}"}})
            out.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        tid = sum(1 for p, _ in tids.values() if p == pid) + 1
        tids[lane] = (pid, tid)
        out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                    "args": {"name": f"stream {stream} lane {index} ({lane})"}})
        out.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    for e in events:
        pid, tid = tids[e.lane]
        out.append({
            "name": e.op, "cat": "command", "ph": "X", "pid": pid, "tid": tid,
            "ts": round(e.start * 1e6, 3), "dur": round(max(e.duration, 0.0) * 1e6, 3),
            "args": {"lane": e.lane, "seq": e.seq, "enqueue_us": round(e.enqueue * 1e6, 3),
                     "queued_us": round((e.start - e.enqueue) * 1e6, 3)},
        })
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": {"producer": "laneflow"}}


def save(events: Iterable[TraceEvent], path: Any) -> None:
    data = to_chrome(events)
    with open(os.fspath(path), "w", encoding="utf-8") as f:
        json.dump(data, f, separators=(",", ":"))
