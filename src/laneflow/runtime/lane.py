"""Lanes, points on a lane's timeline, and commands.

A lane is one backend execution queue (a CUDA stream, or a CPU worker thread). Commands submitted to
a lane run in submission order; the n-th command on a lane has sequence number n (from 1). A
:class:`Point` names "command n of lane L" together with the lane's vector clock at that moment,
which is what makes implied waits visible to the encoder.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

from ..errors import ExecutionError, LaneflowError
from .fence import Fence

_lane_ids = itertools.count(1)


class Point:
    """Command ``seq`` of ``lane``; ``clock`` maps other lanes to the sequence numbers it had waited for."""

    __slots__ = ("lane", "seq", "clock")

    def __init__(self, lane: "Lane", seq: int, clock: dict):
        self.lane, self.seq, self.clock = lane, seq, clock

    def __repr__(self) -> str:
        return f"Point({self.lane.name}#{self.seq})"


class Command:
    """One unit of backend work with the buffers it reads and writes.

    ``fn(lane)`` does the work (on the CPU it computes; on CUDA it enqueues). If an input carries an
    error from a failed command, the work is skipped and the error passes to the outputs, so it is
    raised at the eval that needs it and the lane itself keeps working.
    """

    __slots__ = ("op", "fn", "reads", "writes", "seq")

    def __init__(self, op: str, fn: Callable[["Lane"], Any], reads: Sequence, writes: Sequence, seq: int = 0):
        self.op, self.fn, self.reads, self.writes, self.seq = op, fn, reads, writes, seq

    def run(self, lane: "Lane") -> None:
        err = None
        for b in self.reads:
            if b.error is not None:
                err = b.error
                break
        else:
            try:
                self.fn(lane)
                return
            except LaneflowError as e:
                err = e
            except Exception as e:  # noqa: BLE001 - any kernel failure becomes the op's error
                err = ExecutionError(self.op, e)
                err.__cause__ = e
        for b in self.writes:
            b.error = err

    def __repr__(self) -> str:
        return f"Command({self.op}#{self.seq})"


class Lane:
    """Base class of a backend lane. Backends implement ``_enqueue``, ``_enqueue_wait`` and ``fence``.

    The encoder owns ``submitted`` (last sequence number given out) and ``clock`` (the vector clock:
    for each other lane, the highest sequence number this lane has already waited for). ``clock`` is
    replaced, never mutated, so points can share it.
    """

    fence: Fence

    def __init__(self, device: Any, stream_id: int, index: int):
        self.id = next(_lane_ids)
        self.device = device
        self.stream_id = stream_id
        self.index = index
        self.name = f"{device}/s{stream_id}.{index}"
        self.submitted = 0
        self.clock: dict[Lane, int] = {}

    # -- what the encoder calls ---------------------------------------------------------------
    def submit(self, cmd: Command) -> None:
        self._enqueue(cmd)

    def wait(self, point: Point) -> None:
        """Make later commands on this lane wait for ``point`` (never a host wait on the GPU)."""
        self._enqueue_wait(point)

    def pending(self) -> int:
        """Commands submitted but not yet known to be finished (the lane's load)."""
        return self.submitted - self.fence.value

    def host_wait(self, seq: int, timeout: float | None = None) -> bool:
        return self.fence.wait(seq, timeout)

    def close(self) -> None:
        """Release the lane's resources once everything submitted has run."""

    # -- backend part ---------------------------------------------------------------------------
    def _enqueue(self, cmd: Command) -> None:
        raise NotImplementedError

    def _enqueue_wait(self, point: Point) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<Lane {self.name} submitted={self.submitted}>"

    # Lanes hash and compare by identity (object's defaults, which are fast: they key hot dicts).
