"""The small interface a backend implements. Ops and the encoder are written once, above it."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .buffer import Buffer
from .lane import Lane


class Backend:
    """A device family (cpu, gpu): lanes, memory and kernels.

    Kernels are looked up by a primitive's ``kind`` (``"elementwise"``, ``"reduce"``, ``"matmul"``...)
    and called as ``kernel(lane, prim, inputs, outputs)`` with backend buffer handles.
    """

    name: str = "?"
    default_lanes: int = 1
    #: True when ``to_host`` returns a view of the buffer's memory (the CPU): a value read on the host
    #: is then never reused in place. False when it returns a copy (the GPU).
    host_view: bool = True

    def check_device(self, device: Any) -> None:
        """Raise ValueError when ``device`` (e.g. gpu index 3) does not exist on this machine."""

    def create_lanes(self, device: Any, stream_id: int, count: int) -> list[Lane]:
        raise NotImplementedError

    def allocate(self, device: Any, shape: tuple, dtype: np.dtype, op: str) -> Buffer:
        """A new buffer for an op's output (stream-ordered on backends that support it)."""
        raise NotImplementedError

    def upload(self, device: Any, host: np.ndarray) -> tuple[Buffer, Callable | None]:
        """Buffer for host data. Returns the buffer and, if a copy must run on a lane, its function."""
        raise NotImplementedError

    # Optional: allocate_many(device, [(shape, dtype), ...], op) -> [Buffer]: the outputs of one
    # command in one allocation (the CUDA backend: memory.Slab), used for commands with many outputs.
    # Optional, for compiled plans' static memory (graph/memory_plan.py); without them a replay
    # allocates every intermediate afresh:
    #   allocate_region(device, nbytes, op) -> Buffer        raw memory of one region
    #   view(region, shape, dtype) -> data handle             a typed view of a region's start
    # Optional, to run a compiled plan as one unit (the CUDA backend: a multi-lane CUDA graph):
    #   graph_plan(plan, stream) -> object with run(datas, stream) -> {slot: Buffer} and stats();
    #   it raises when the plan cannot become one, and the plan then replays its commands.

    #: Whether chains of elementwise ops fuse into one command (kernel kind ``"fused"``; see
    #: :mod:`laneflow.graph.fusion`).
    fuses_elementwise: bool = False
    #: Largest array (elements) whose ops fuse; None: no limit.
    fuse_max_elements: int | None = None

    def groups_matmul(self, dtype: np.dtype) -> bool:
        """Whether independent same-shape matmuls of ``dtype`` should run as one grouped command
        (kernel kind ``"matmul_group"``; see :mod:`laneflow.graph.grouping`)."""
        return False

    def to_host(self, buffer: Buffer, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """Host view or copy of a buffer whose writer has finished."""
        raise NotImplementedError

    def kernel(self, kind: str) -> Callable:
        raise NotImplementedError
