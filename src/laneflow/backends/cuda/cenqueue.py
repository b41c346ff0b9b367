"""A GPU lane's enqueue of a kernel's command in C (``cenqueue.c``): what ``CudaLane._enqueue`` does for
it (the frees that died since, output memory, the kernel as ``Command.run`` runs it with the device-side
checks it registers, the fence's event), in one C call that the C submit path (``graph/csubmit.c``) makes
through the lane's ``enqueue_fast``. It declines everything but that common case (the C file lists what),
and ``CudaLane._enqueue`` runs it.

Why: an uncached command's enqueue was four Python frames (issue 15's per-command target).

Built with the system C compiler once per machine and Python and kept in the signed disk cache
(``native.py``); without a compiler or Python's headers, or with ``LANEFLOW_CENQUEUE=0``, lanes have no
``enqueue_fast``, and :func:`why_not` says why.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Callable

from ... import native
from ...errors import LaneflowError
from ...runtime import delays, tracing
from ...runtime.buffer import Buffer
from ...runtime.lane import Command
from . import driver
from .memory import DeviceArray, SlabArray

NAME = "_laneflow_cenqueue"
SOURCE = Path(__file__).with_name("cenqueue.c")


def fast() -> Callable | None:
    """``enqueue(lane, cmd) -> bool`` (True: enqueued; False: declined, nothing done), or None."""
    mod = _once.get()
    return None if mod is None else mod.enqueue


def why_not() -> str | None:
    """Why the C enqueue is not used (None: it is, or it was not asked for yet)."""
    return _once.why_not()


def _open(_key=None) -> ModuleType:
    from . import lanes  # (lanes.py asks for this module when it makes a lane)

    mod = native.build("cenqueue", NAME, SOURCE, "the C enqueue", "enqueue", "LANEFLOW_CENQUEUE")
    mod.init(Command, Buffer, DeviceArray, SlabArray, lanes.EventFence, driver._tls, delays, tracing, lanes,
             LaneflowError)
    return mod


_once = native.Once("the C enqueue", _open)
