"""A pending node's command submitted in one C call (``csubmit.c``): ``schedule.execute`` hands each
single-output node of a one-lane stream to :func:`submit_one` first.

What it replaces: the Python frames between the scheduler and the lane (``schedule_one``, ``_donor``,
``submit``, ``encode_call``, the ``Command`` and ``Point`` constructors, the encoder's one-lane fast path
and ``_hazards_on``, ``_finish``), about a dozen calls a command. The objects made and changed are those
the Python path makes, in the same order (the C file lists them); what it leaves to Python (a node of
another kind, a stream of several lanes, tracing on, a primitive reading a view) it declines before
changing anything, and the Python path runs it.

Why: an uncached command's host time is spread over those frames, none of them large (issue 15's
per-command target: a chain of tiny adds, fusion off, at 0.8x PyTorch eager's per-op time).

Built with the system C compiler once per machine and Python and kept in the signed disk cache
(``native.py``); without a compiler or Python's headers, or with ``LANEFLOW_CSUBMIT=0``, every command
takes the Python path, and :func:`why_not` says why (``python -m laneflow info`` too).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Callable

from .. import native
from ..runtime import tracing
from ..runtime.backend import Backend
from ..runtime.buffer import Buffer
from ..runtime.lane import Command, Point
from ..runtime.stats import STATS
from .node import ArrayData

NAME = "_laneflow_csubmit"
SOURCE = Path(__file__).with_name("csubmit.c")


def load() -> ModuleType | None:
    """The module, or None when it cannot be used (:func:`why_not` says why). Built or loaded once per
    process."""
    return _once.get()


def submitter() -> Callable[[ArrayData], bool] | None:
    """``submit_one(node) -> bool`` (True: submitted; False: declined, nothing changed), or None."""
    mod = load()
    return None if mod is None else mod.submit_one


def runner() -> Callable[[list, int], int] | None:
    """``run(items, start) -> index``: schedule.execute's loop in C over plain nodes (each through
    ``submit_one``), stopping at the first item Python must schedule; or None."""
    mod = load()
    return None if mod is None else mod.run


def why_not() -> str | None:
    """Why the C path is not used (None: it is, or it was not asked for yet)."""
    return _once.why_not()


def _open(_key=None) -> ModuleType:
    mod = native.build("csubmit", NAME, SOURCE, "the C submit path", "submit_one", "LANEFLOW_CSUBMIT")
    mod.init(ArrayData, Buffer, Command, Point, STATS, tracing, Backend.kernel_of)
    return mod


_once = native.Once("the C submit path", _open)
