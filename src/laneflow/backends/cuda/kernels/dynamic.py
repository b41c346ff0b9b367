"""dynamic_slice and dynamic_update_slice (ops/dynamic.py): starts read on the device.

A start given as a 0-d array is read by the kernel itself and clamped there into ``[0, dim - size]``,
so the command needs no host read and a CUDA graph holding it replays with whatever the start array
holds at replay time (a decode step's position). Static starts arrive clamped. One thread per element
of the window (the slice, or the update), a grid-stride loop; ``dynamic_update_slice`` first copies
the array into the output unless it writes in place (the output is the input's buffer), and reads the
update through element strides (a strided view, ``Backend.strided_kinds``).
"""

from __future__ import annotations

from cuda.bindings import driver as cu

from ....errors import LaneflowError
from ....shapes import contiguous_strides
from ..driver import check
from . import cdefs as C
from .launch import grid_1d
from .plan import MAXD


def _build(dt, start_dts: tuple, dyn: tuple, nd: int, update: bool):
    """``dyn[d]``: the start-array number of dimension d, or -1 (static)."""
    T = C.storage(dt)
    sig = [f"{T}* __restrict__ out", f"const {T}* __restrict__ in"]
    codes = "pp"
    for k, sd in enumerate(start_dts):
        sig.append(f"const {C.storage(sd)}* __restrict__ p{k}")
        codes += "p"
    sig += ["Dims win", "Dims xshape", "Dims st", "Dims ustr", "long long n"]
    codes += "DDDDq"
    lines = []
    for d in range(nd):
        k = dyn[d]
        if k < 0:
            lines.append(f"  const long long s{d} = st.v[{d}];\n")
        else:
            lines.append(f"  long long s{d} = (long long)(p{k}[0]); {{ long long hi_ = xshape.v[{d}] - win.v[{d}];"
                         f" s{d} = s{d} < 0 ? 0 : (s{d} > hi_ ? hi_ : s{d}); }}\n")
    body = ["  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;"
            " i += (long long)blockDim.x * gridDim.x) {\n", "    long long rem_ = i, xo = 0, xs = 1, uo = 0;\n"]
    for d in range(nd - 1, -1, -1):
        body.append(f"    {{ long long c_ = rem_ % win.v[{d}]; rem_ /= win.v[{d}]; xo += (c_ + s{d}) * xs;"
                    f" xs *= xshape.v[{d}]; uo += c_ * ustr.v[{d}]; }}\n")
    body.append("    out[xo] = in[uo];\n" if update else "    out[i] = in[xo];\n")
    body.append("  }\n")
    name = "lf_dynamic_update" if update else "lf_dynamic_slice"
    src = (f'extern "C" __global__ void __launch_bounds__(256) {name}({", ".join(sig)}) {{\n'
           + "".join(lines) + "".join(body) + "}\n")
    return src, name, codes


def _launch(lane, update: bool, out, src, win: tuple, xshape: tuple, static: tuple, starts: list,
            src_strides: tuple = ()) -> None:
    n = 1
    for s in win:
        n *= s
    if n == 0:
        return
    nd = len(xshape)
    if nd > MAXD:
        raise LaneflowError(f"{'dynamic_update_slice' if update else 'dynamic_slice'}: arrays of more than "
                            f"{MAXD} dimensions are not supported on the GPU (got {nd})")
    dyn, k = [], 0
    for s in static:
        dyn.append(-1 if s is not None else k)
        k += s is None
    start_dts = tuple(a.dtype for a in starts)
    kern = lane.ctx.modules.get(("dynamic", update, out.dtype, start_dts, tuple(dyn), nd),
                                lambda: _build(out.dtype, start_dts, tuple(dyn), nd, update))
    st = tuple(0 if s is None else s for s in static)
    args = [out.ptr, src.ptr, *(a.ptr for a in starts), win or (1,), xshape or (1,), st or (0,), src_strides or (0,), n]
    kern.launch(lane.handle, grid_1d(lane.ctx, n), (256, 1, 1), args)


def dynamic_slice(lane, prim, ins, outs) -> None:
    x, out = ins[0], outs[0]
    _launch(lane, False, out, x, prim.sizes, x.shape, prim.static, ins[1:])


def dynamic_update_slice(lane, prim, ins, outs) -> None:
    base, update, out = ins[0], ins[1], outs[0]
    if out.ptr != base.ptr and out.nbytes:
        check(cu.cuMemcpyDtoDAsync(out.ptr, base.ptr, out.nbytes, lane.stream), "dynamic_update_slice (copy)")
    # the update may be a strided view (graph/views.py: a decode step's keys, a transposed slice of the
    # qkv product, are written into the cache without a copy of their own)
    strides = getattr(update, "strides", None) or contiguous_strides(update.shape)
    _launch(lane, True, out, update, update.shape, base.shape, prim.static, ins[2:], tuple(strides))

