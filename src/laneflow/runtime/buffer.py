"""Buffers: device memory owned by a backend, plus the hazard state the encoder tracks for it."""

from __future__ import annotations

from typing import Any


class Buffer:
    """Memory that arrays are values of.

    ``data`` is the backend's handle (a numpy array on the CPU, a device allocation on CUDA).
    ``writer`` is the point of the last command that wrote it; ``readers`` maps each lane to the
    last point on it that read the buffer since that write. ``error`` is set when the command that
    should have produced the contents failed. ``exported`` marks memory shared outside laneflow
    (numpy views, DLPack), which is then never reused in place. ``checks`` holds the
    :class:`~laneflow.runtime.lane.DeferredCheck` objects of failures the device reports only after
    running (an index computed on the GPU out of range, cuSOLVER's devInfo), resolved at the host wait.
    """

    __slots__ = ("device", "nbytes", "data", "writer", "readers", "error", "exported", "release", "checks",
                 "__weakref__")

    def __init__(self, device: Any, nbytes: int, data: Any, release=None):
        self.device = device
        self.nbytes = nbytes
        self.data = data
        self.writer = None
        self.readers: dict = {}
        self.error = None
        self.exported = False
        self.release = release
        self.checks = None

    def __del__(self) -> None:
        rel = self.release
        if rel is not None:
            rel(self)

    def __repr__(self) -> str:
        return f"<Buffer {self.device} {self.nbytes}B writer={self.writer}>"
