"""``install()``: run laneflow's CUDA backend on the fake driver of the tests (``tests/doubles/fake_cuda.py``)
for the tools' ``--fake`` option: host cost with no GPU. Call it before importing laneflow.
``LANEFLOW_FAKE_GPUS=2`` makes it report two GPUs (contexts modelled and checked: see the double)."""

from __future__ import annotations

import os
import sys


def install() -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "doubles"))
    import fake_cuda

    fake_cuda.install()
