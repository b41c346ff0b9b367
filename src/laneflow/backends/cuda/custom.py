"""User CUDA kernels (``lf.cuda.kernel``): compile through NVRTC (disk cache, readable errors), load,
and launch with one pre-packed parameter block: input pointers, output pointers, then the scalars.
"""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver as cu

from ...errors import LaneflowError
from .driver import CudaError, check
from .kernels.launch import Kernel

_MAX_STATIC_SMEM = 48 * 1024


def load(ctx, source: str, name: str, params: str) -> Kernel:
    """The compiled kernel ``name`` of ``source`` on this device (cached by source, name and layout,
    ``Modules.source``).

    The user's source is compiled as written (no laneflow preamble), so compiler line numbers are the
    user's. Raises KernelCompileError (with the offending source lines) or a LaneflowError naming the
    kernel."""
    try:
        return ctx.modules.source(source, name, params)
    except CudaError as e:
        if e.name == "CUDA_ERROR_NOT_FOUND":
            raise LaneflowError(
                f"cuda.kernel {name}: the source compiled but has no kernel named {name!r}; declare it "
                f'extern "C" __global__ void {name}(...) (C++ names are mangled)') from None
        raise


def launcher(ctx, kernel: Kernel, grid: tuple, block: tuple, shared_mem: int, scalars: tuple):
    """The command body: launch on the lane's stream with the buffers' pointers and the scalars."""
    if shared_mem > _MAX_STATIC_SMEM and kernel.attrs.get("max_dynamic_smem", 0) < shared_mem:
        ctx.ensure_current()
        check(cu.cuFuncSetAttribute(kernel.fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    shared_mem), f"cuda.kernel {kernel.name}: shared_mem={shared_mem}")
        kernel.attrs["max_dynamic_smem"] = shared_mem

    def run(lane: Any, inputs: list, outputs: list) -> None:
        args = [h.ptr for h in inputs]
        args.extend(h.ptr for h in outputs)
        args.extend(scalars)
        kernel.launch(lane.handle, grid, block, args, shared_mem)

    return run


def custom(lane: Any, prim: Any, inputs: list, outputs: list) -> None:
    prim.run(lane, inputs, outputs)

