"""The elementwise kernel's common launch in C (``celementwise.c``): an array and an array or a Python
scalar (``x + y``, ``x + 1.0``), from a plan ``elementwise.py`` made, launched in one C call with the
same key, kernel, grid and arguments as ``elementwise.run``; anything else goes to
``elementwise.elementwise`` (the C file lists what).

Why: an uncached add's launch was five Python frames (issue 15's per-command target).

:func:`install` puts it in the CUDA backend's kernel table for ``"elementwise"``. Built with the system C
compiler once per machine and Python and kept in the signed disk cache (``native.py``); without a
compiler or Python's headers, or with ``LANEFLOW_CELEMENTWISE=0``, the Python kernel stays, and
:func:`why_not` says why (``python -m laneflow info`` too).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Callable

from .... import native
from ....graph.node import Scalar
from ..driver import fail
from ..memory import DeviceArray
from .launch import Kernel
from . import elementwise as ew

NAME = "_laneflow_celementwise"
SOURCE = Path(__file__).with_name("celementwise.c")


def load() -> ModuleType | None:
    """The module, or None when it cannot be used (:func:`why_not` says why)."""
    return _once.get()


def why_not() -> str | None:
    """Why the C launch is not used (None: it is, or it was not asked for yet)."""
    return _once.why_not()


def kernel() -> Callable:
    """The elementwise kernel ``(lane, prim, ins, outs)``: the C launch where it loads, else Python's."""
    mod = load()
    return ew.elementwise if mod is None else mod.ew


def install(kernels: dict) -> None:
    """Map ``"elementwise"`` in ``kernels`` (the backend's table) to :func:`kernel`."""
    if kernels.get("elementwise") is ew.elementwise:
        kernels["elementwise"] = kernel()


def _failed(kern, err) -> None:
    fail(err, f"launching {kern.name}")  # (raises, as Kernel.launch does)


def _open(_key=None) -> ModuleType:
    mod = native.build("celementwise", NAME, SOURCE, "the C elementwise launch", "ew", "LANEFLOW_CELEMENTWISE")
    mod.init(ew._plans, ew.elementwise, _failed, frozenset(ew._COMPARE), Scalar, DeviceArray, ew.KernelPair,
             ew._Plan, Kernel, ew._to_f32)
    return mod


_once = native.Once("the C elementwise launch", _open)
