"""``python -m laneflow info``: what laneflow sees on this machine, and the settings in force."""

from __future__ import annotations

import argparse
import os
import platform

import numpy as np

from . import __version__
from .defaults import default_device
from .device import cpu, gpu
from .runtime.backend import backend_for
from .runtime.handle_pool import handle_policy


def collect() -> dict:
    out = {
        "laneflow": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "default device": str(default_device()),
        "cpu default lanes": backend_for(cpu).default_lanes,
        "cpu BLAS threads under multi-lane streams": os.environ.get("LANEFLOW_CPU_BLAS_THREADS", "1"),
        "handle policy": handle_policy(),
        "tape node maker": _tape_maker(),
        "command submission": _submit_path(),
        "mpi launcher": _mpi_launcher(),
    }
    try:
        backend = backend_for(gpu)
        ctx = backend.context(0)
        out["gpu"] = f"{ctx.name} ({ctx.arch}, {ctx.sm_count} SMs)"
        out["gpu default lanes"] = backend.default_lanes
        out["kernel cache"] = os.environ.get("LANEFLOW_KERNEL_CACHE", "per-user default (see docs/cuda-notes.md)")
        why = _cshim_why_not()
        out["driver calls"] = ctx.calls.via + (f" ({why})" if why and ctx.calls.via != "C shim" else "")
        out["elementwise launch"] = _ew_launch()
        out["tf32 for float32 matmul"] = os.environ.get("LANEFLOW_ALLOW_TF32", "") == "1"
    except Exception as e:  # noqa: BLE001 - the reason is the information
        out["gpu"] = f"not usable: {str(e).splitlines()[0][:160]}"
    return out


def _tape_maker() -> str:
    """Which path replayed op calls make their nodes by, and whether the steps and the op wrapper are C
    too (``ops/ctape.py``; built now if not yet)."""
    from .ops import ctape

    if ctape.load() is None:
        return f"Python ({ctape.why_not()})"
    return "C, steps in C" if ctape.steps_on() else "C, steps in Python (LANEFLOW_CSTEPS=0)"


def _submit_path() -> str:
    """Whether an uncached command is submitted through the C path (``graph/csubmit.py``)."""
    from .graph import csubmit

    return "C" if csubmit.load() is not None else f"Python ({csubmit.why_not()})"


def _ew_launch() -> str:
    """Whether the GPU's elementwise kernel launches from C (``kernels/celementwise.py``)."""
    from .backends.cuda.kernels import celementwise

    return "C" if celementwise.load() is not None else f"Python ({celementwise.why_not()})"


def _mpi_launcher() -> str:
    from .distributed import mpi

    return mpi.describe()


def _cshim_why_not() -> str | None:
    from .backends.cuda import cshim  # (only with a usable GPU backend, so cuda-bindings is there)

    return cshim.why_not()


def run(args: argparse.Namespace) -> int:
    for k, v in collect().items():
        print(f"{k:<42} {v}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("info", help="show devices, versions and the settings in force")
    p.set_defaults(func=run)
