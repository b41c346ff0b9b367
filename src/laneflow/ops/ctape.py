"""The tape's steps in C (``ctape.c``): a replayed op call checked and answered in one C call.

- **The node maker** (``node``, ``array``): a replayed call makes its nodes and its result in one call
  instead of about fifteen attribute stores. The objects made are those the Python steps make (the
  types' own allocation, the same fields), so nothing downstream can tell.
- **The steps** (``step``): each call's :class:`~laneflow.ops.tape_steps.Plan` interpreted, the same
  checks in the same order as the Python step written out from it (``tape_steps._python``), which
  stays for a call with more values than a C step holds and with ``LANEFLOW_CSTEPS=0``.

Why: a replayed call of GPT-2 small's 308 cost about 0.7 us beyond the model's own Python; making the
node and its array was about half of it, the Python step's checks most of the rest (2026-12-05, the
CPU VM: the tape's build of the forward 309 -> 191 us with the steps in C).

Built with the system C compiler at the first tape (about 0.2 s, once per machine and Python) and kept in
the signed disk cache (``native.py``; a later process loads it in about a millisecond);
without a compiler or Python's headers, or with ``LANEFLOW_CTAPE=0``, the steps make their nodes in
Python as before, and :func:`why_not` says why (``python -m laneflow info`` too).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

from .. import native
from ..array import Array
from ..graph.node import ArrayData

NAME = "_laneflow_ctape"
SOURCE = Path(__file__).with_name("ctape.c")


def load() -> ModuleType | None:
    """The node maker, or None when it cannot be used (:func:`why_not` says why). Built or loaded once
    per process."""
    return _once.get()


def steps_on() -> bool:
    """Whether the steps and the op wrapper are C where the module loads (``LANEFLOW_CSTEPS=0``: Python
    steps that make their nodes in C, and the Python wrapper)."""
    return os.environ.get("LANEFLOW_CSTEPS", "1") != "0"


def why_not() -> str | None:
    """Why the node maker is not used (None: it is, or it was not asked for yet)."""
    return _once.why_not()


def shortcut(wrapper: object, op: object, reflected: bool, toggle: list) -> bool:
    """Let the taped operator ``wrapper`` (``Array.__add__``: ``_array_methods.py``) answer its common call
    with ``op``'s C call (a binary elementwise op's: ``ops/elementwise.py``), on ``(other, self)`` when
    ``reflected``. Saves the method's and the op's Python frames (about 0.15 us an operator on the CPU VM).
    False, nothing changed, when ``op`` has no C call or ``wrapper`` is not the C wrapper. The shortcut
    follows ``toggle`` (``ops/core.py``'s ``_binary``): with anything but the C call there, the method runs."""
    state = getattr(op, "_cstate", None)
    mod = load()
    if state is None or mod is None or not steps_on() or type(wrapper).__name__ != "taped":
        return False
    mod.taped_shortcut(wrapper, state, reflected, toggle)
    return True


def _open(_key=None) -> ModuleType:
    mod = native.build("ctape", NAME, SOURCE, "the tape's node maker", "array", "LANEFLOW_CTAPE")
    mod.init(ArrayData, Array)
    Array.__del__ = mod.array_del()  # (the same finalizer without a Python frame: array.py's, in C)
    return mod


_once = native.Once("the tape's node maker", _open)
