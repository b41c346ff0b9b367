"""A group of ranks that run collectives together, and its communication lanes.

Every collective of a group runs on the group's communication lane of the array's device: one lane
(a CPU worker thread, a CUDA stream) per device, shared by every stream, next to the streams' compute
lanes. The encoder orders a collective after its input's writer and everything that reads its output
after it, with the usual waits, so communication overlaps whatever compute does not depend on it.
One lane per group and device also keeps the order in which collectives reach the transport equal to
the order they were called in on every rank, which MPI and NCCL require.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from ..errors import LaneflowError
from ..runtime.encoder import LOCK
from .launch import LaunchInfo


class DistributedError(LaneflowError):
    """A collective failed across ranks: a peer missing past the timeout, ranks calling different
    collectives or shapes, a broken communicator. The message names the op and what to do."""


_lane_ids = itertools.count(1_000_001)  # stream ids of communication lanes: apart from the streams'


class Group:
    """The ranks of a launch (``lf.distributed.init()`` makes the world group).

    ``rank`` and ``size`` are this process's place; ``transports`` maps a device type ("cpu", "gpu")
    to what moves its arrays (MPI for the CPU, later NCCL for GPUs), and ``makers`` to a function of the
    device making one on first use (a group of one: copies). ``timeout`` (seconds) bounds how long a
    collective waits for the other ranks before it fails with :class:`DistributedError`.
    """

    def __init__(self, info: LaunchInfo, timeout: float, backend: str, transports: dict | None = None,
                 makers: dict | None = None):
        self.info = info
        self.rank, self.size = info.rank, info.world_size
        self.local_rank = info.local_rank
        self.transports = dict(transports or {})
        self.makers = dict(makers or {})
        self.timeout = float(timeout)
        self.backend = backend
        self._lanes: dict = {}
        self._lock = threading.Lock()
        self.broken: str | None = None
        #: ranks compare each collective's signature before running it (``init(check=)``)
        self.check = True

    def __repr__(self) -> str:
        return f"Group(rank={self.rank}, size={self.size}, backend={self.backend!r}, launcher={self.info.launcher!r})"

    def transport(self, device: Any, op: str) -> Any:
        """What runs ``op``'s collectives on ``device``; raises naming the op when nothing does."""
        if self.broken is not None:
            raise DistributedError(f"{op}: this group is broken by an earlier failure ({self.broken}); "
                                   "restart the processes")
        t = self.transports.get(device.type)
        if t is not None:
            return self._on(t, device, op)
        maker = self.makers.get(device.type)
        if maker is None:
            have = ", ".join([*self.transports, *self.makers]) or "none"
            why = {"cpu": "CPU collectives between processes need an MPI launch (mpirun / mpiexec) and "
                          "mpi4py: pip install 'laneflow[distributed]'",
                   "gpu": "GPU collectives need nccl4py (pip install nccl4py) and a launch with one GPU per rank"}
            raise DistributedError(f"{op}: this group has no transport for {device} arrays (it has: {have}); "
                                   f"{why.get(device.type, '')}")
        with self._lock:
            t = self.transports.get(device.type)
            if t is None:
                t = self.transports[device.type] = maker(device)
        return self._on(t, device, op)

    @staticmethod
    def _on(t: Any, device: Any, op: str) -> Any:
        """``t`` when it serves ``device`` (an NCCL communicator serves the one GPU it was made on)."""
        own = getattr(t, "device", None)
        if own is not None and own != device:
            raise DistributedError(f"{op}: the array is on {device}, but this rank's communicator is on {own} "
                                   f"(each rank drives one GPU); move it there first: x.to_device('{own}')")
        return t

    def lane(self, stream: Any) -> Any:
        """The communication lane of ``stream``'s device (made on first use, under the scheduling lock)."""
        dev = stream.device
        lane = self._lanes.get(dev)
        if lane is None:
            lane = self._lanes[dev] = stream.backend.create_lanes(dev, next(_lane_ids), 1)[0]
        return lane

    def synchronize(self) -> None:
        """Wait until every collective submitted so far on every device has finished."""
        with LOCK:
            lanes = list(self._lanes.values())
        for lane in lanes:
            if not lane.host_wait(lane.submitted, None):
                raise DistributedError(f"synchronize: {lane.name} did not finish")

    def destroy(self) -> None:
        """Finish pending collectives and release the communication lanes and transports."""
        if self.broken is None:
            try:
                self.synchronize()
            except LaneflowError:
                pass
        with LOCK:
            lanes, self._lanes = list(self._lanes.values()), {}
        for lane in lanes:
            lane.close()
        for t in self.transports.values():
            close = getattr(t, "close", None)
            if close is not None:
                close()
