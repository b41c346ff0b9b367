"""Linear algebra on GPU arrays, for now through the CPU backend's numpy kernel (a stopgap).

The lane's stream is synchronised (its earlier work and the waits it was given have finished), the
inputs are copied to the host, ``backends/cpu/linalg.py`` computes, and the results are copied back.
This blocks the encoding thread for the duration: correct, but not concurrent. cuSOLVER through the
HandlePool is the intended replacement (docs/cuda-notes.md).
"""

from __future__ import annotations

import numpy as np
from cuda.bindings import driver as cu

from ..cpu.linalg import linalg as cpu_linalg
from .driver import check


def linalg(lane, prim, ins, outs) -> None:
    check(cu.cuStreamSynchronize(lane.stream), "cuStreamSynchronize (linalg)")
    host_ins = []
    for h in ins:
        a = np.empty(h.shape, h.dtype)
        h.copy_to_host(a)
        host_ins.append(a)
    host_outs = [np.empty(h.shape, h.dtype) for h in outs]
    cpu_linalg(None, prim, host_ins, host_outs)
    for h, a in zip(outs, host_outs):
        if h.nbytes:
            a = np.ascontiguousarray(a)
            check(cu.cuMemcpyHtoD(h.ptr, a.ctypes.data, h.nbytes), "linalg result (cuMemcpyHtoD)")
