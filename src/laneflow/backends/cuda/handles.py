"""CUDA library adapters for :class:`laneflow.runtime.handle_pool.HandlePool`.

cuBLASLt takes the stream and the workspace with every call, so its handle never needs a set-stream:
under the default ``device`` policy one handle serves every lane of a device, and each lane gets its
own workspace from the memory pool (freed when the lane goes away). A cuBLASLt handle holds no device
memory that we could see (DESIGN.md: 0.3 us to create, no memory), so it counts 0 bytes.
"""

from __future__ import annotations

from typing import Any

from ...runtime.handle_pool import HandlePool

#: Workspace per (handle, lane) for cuBLASLt matmuls.
LT_WORKSPACE_BYTES = 32 << 20


class CublasLtLibrary:
    name = "cublasLt"
    binds_stream = False

    def __init__(self, ctx: Any, lt: Any):
        self.ctx, self.lt = ctx, lt

    def create(self, device: Any) -> Any:
        self.ctx.ensure_current()
        return self.lt.create()

    def destroy(self, handle: Any) -> None:
        self.ctx.ensure_current()
        self.lt.destroy(handle)

    def set_stream(self, handle: Any, lane: Any) -> None:  # the stream goes with each call
        pass

    def workspace_bytes(self, device: Any) -> int:
        return LT_WORKSPACE_BYTES

    def allocate_workspace(self, lane: Any, nbytes: int) -> tuple[int, int]:
        return self.ctx.memory.raw_alloc(nbytes, lane.stream, "cuBLASLt workspace"), nbytes

    def set_workspace(self, handle: Any, workspace: Any, nbytes: int) -> None:  # passed with each call
        pass

    def handle_bytes(self, device: Any) -> int:
        return 0


def cublaslt_pool(ctx: Any, lt: Any) -> HandlePool:
    return HandlePool(CublasLtLibrary(ctx, lt))
