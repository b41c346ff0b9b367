"""User-written kernels as graph nodes (backend-neutral).

A :class:`CustomCall` is one command whose work a backend prepared (``run(lane, inputs, outputs)``
with the backend's buffer handles). It reads its inputs and writes fresh outputs like any built-in
op, so the encoder orders it by the same hazards, picks its lane, and ``lf.compile`` records it.
It never donates: a user kernel's inputs are read-only to laneflow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..array import Array
from ..graph.node import ArrayData, Primitive
from .core import outputs


class CustomCall(Primitive):
    kind = "custom"
    cacheable = False  # its launch closure (grid, scalars) is made per call
    def __init__(self, name: str, run: Callable):
        super().__init__(name)
        self.run = run


def custom_call(prim: CustomCall, inputs: Sequence[ArrayData], specs: Sequence[tuple[tuple, np.dtype]],
                stream) -> tuple[Array, ...]:
    """The outputs (one Array per ``(shape, dtype)`` spec) of ``prim`` applied to ``inputs``."""
    return outputs(prim, inputs, specs, stream)
