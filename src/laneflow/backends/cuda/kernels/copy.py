"""Copies and layout changes: copy between devices, reshape, transpose, broadcast_to, concatenate,
and the strided copy they share (which also converts dtypes), plus the fill kernels (full, arange,
linspace, eye).
"""

from __future__ import annotations

import numpy as np
from cuda.bindings import driver as cu

from ....errors import LaneflowError
from ..driver import check
from . import cdefs as C
from .launch import grid_1d
from .plan import MAXD, broadcast_strides, collapse, contiguous_strides


def _build_strided(in_dt, out_dt, nd: int, wide: bool):
    idx_t = "long long" if wide else "unsigned"
    name = "lf_strided_copy"
    lines = [f'extern "C" __global__ void __launch_bounds__(256) {name}({C.storage(out_dt)}* __restrict__ out, '
             f"const {C.storage(in_dt)}* __restrict__ in, Dims shape, Dims ist, Dims ost, long long n) {{\n",
             f"  for ({idx_t} i = ({idx_t})blockIdx.x * blockDim.x + threadIdx.x; i < ({idx_t})n;"
             f" i += ({idx_t})blockDim.x * gridDim.x) {{\n",
             f"    long long io = 0, oo = 0; {idx_t} rem_ = i;\n"]
    for d in range(nd - 1, -1, -1):
        if d:
            lines.append(f"    {{ long long c_ = (long long)(rem_ % ({idx_t})shape.v[{d}]); rem_ /= ({idx_t})shape.v[{d}];"
                         f" io += c_ * ist.v[{d}]; oo += c_ * ost.v[{d}]; }}\n")
        else:
            lines.append("    io += (long long)rem_ * ist.v[0]; oo += (long long)rem_ * ost.v[0];\n")
    lines.append(f"    out[oo] = {C.store(C.conv(C.load('in[io]', in_dt), in_dt, out_dt), out_dt)};\n  }}\n}}\n")
    return "".join(lines), name, "ppDDDq"


def strided_copy(lane, out_ptr: int, out_dt, in_ptr: int, in_dt, shape: tuple, ist: tuple, ost: tuple) -> None:
    """out[ost . idx] = in[ist . idx] for every idx of shape (element strides; pointers pre-offset)."""
    n = 1
    for s in shape:
        n *= s
    if n == 0:
        return
    cshape, (cist, cost) = collapse(tuple(shape), [tuple(ist), tuple(ost)])
    nd = len(cshape)
    if in_dt == out_dt and (nd == 0 or (nd == 1 and cist[0] == 1 and cost[0] == 1)):
        check(cu.cuMemcpyDtoDAsync(out_ptr, in_ptr, n * in_dt.itemsize, lane.stream), "cuMemcpyDtoDAsync")
        return
    if nd > MAXD:
        raise LaneflowError(f"copy: more than {MAXD} non-mergeable dimensions")
    wide = n >= 2**31 - 2**20
    kern = lane.ctx.modules.get(("sc", in_dt, out_dt, nd, wide), lambda: _build_strided(in_dt, out_dt, nd, wide))
    kern.launch(lane.handle, grid_1d(lane.ctx, n), (256, 1, 1), (out_ptr, in_ptr, cshape, cist, cost, n))


def strided(lane, prim, ins, outs) -> None:
    """A contiguous copy of a view of the input (``graph/views.py``: a chain of layout ops)."""
    src, out = ins[0], outs[0]
    strided_copy(lane, out.ptr, out.dtype, src.ptr + prim.offset * src.dtype.itemsize, src.dtype, prim.shape,
                 prim.strides, contiguous_strides(prim.shape))


def copy(lane, prim, ins, outs) -> None:
    src, out = ins[0], outs[0]
    if out.nbytes == 0:
        return
    if isinstance(src, np.ndarray):
        host = np.ascontiguousarray(src)
        check(cu.cuMemcpyHtoDAsync(out.ptr, host.ctypes.data, out.nbytes, lane.stream), "copy to gpu (cuMemcpyHtoDAsync)")
        if host.nbytes <= 1 << 16:
            out.host = host
        return
    if src.ctx is out.ctx:
        check(cu.cuMemcpyDtoDAsync(out.ptr, src.ptr, out.nbytes, lane.stream), "copy (cuMemcpyDtoDAsync)")
    else:
        # Between GPUs, on the consumer's lane (this one), after the encoder's wait for the producer's
        # event: no host wait. Direct where the hardware allows (peer access, enabled once per pair).
        out.ctx.peer_access(src.ctx)
        check(cu.cuMemcpyPeerAsync(out.ptr, out.ctx.ctx, src.ptr, src.ctx.ctx, out.nbytes, lane.stream),
              f"copy gpu:{src.ctx.index} -> gpu:{out.ctx.index} of {out.shape} {out.dtype} (cuMemcpyPeerAsync)")


def reshape(lane, prim, ins, outs) -> None:
    src, out = ins[0], outs[0]
    if out.nbytes:
        check(cu.cuMemcpyDtoDAsync(out.ptr, src.ptr, out.nbytes, lane.stream), "reshape (cuMemcpyDtoDAsync)")


def transpose(lane, prim, ins, outs) -> None:
    src, out = ins[0], outs[0]
    st = contiguous_strides(src.shape)
    strided_copy(lane, out.ptr, out.dtype, src.ptr, src.dtype, out.shape, tuple(st[p] for p in prim.perm),
                 contiguous_strides(out.shape))


def broadcast_to(lane, prim, ins, outs) -> None:
    src, out = ins[0], outs[0]
    strided_copy(lane, out.ptr, out.dtype, src.ptr, src.dtype, out.shape, broadcast_strides(src.shape, out.shape),
                 contiguous_strides(out.shape))


def concatenate(lane, prim, ins, outs) -> None:
    out = outs[0]
    ax = prim.axis
    ost = contiguous_strides(out.shape)
    at = 0
    for src in ins:
        if src.size:
            strided_copy(lane, out.ptr + at * ost[ax] * out.dtype.itemsize, out.dtype, src.ptr, src.dtype, src.shape,
                         contiguous_strides(src.shape), ost)
        at += src.shape[ax]


# -- fills -------------------------------------------------------------------------------------------


def _build_fill(kind: str, out_dt):
    name = f"lf_{kind}"
    st = C.storage(out_dt)
    if kind == "full":
        sig, params = f"{st}* out, {C.compute(out_dt)} v, long long n", "p" + C.PARAM[C.dname(out_dt)] + "q"
        val = C.store("v", out_dt)
    elif kind == "arange_i":
        sig, params = f"{st}* out, long long start, long long step, long long n", "pqqq"
        val = C.store(C.conv("(long long)((unsigned long long)start + (unsigned long long)step * (unsigned long long)i)",
                             np.dtype(np.int64), out_dt), out_dt)
    elif kind == "arange_f":
        sig, params = f"{st}* out, double start, double step, long long n", "pddq"
        val = C.store(C.conv("__dadd_rn(start, __dmul_rn(step, (double)i))", np.dtype(np.float64), out_dt), out_dt)
    elif kind == "linspace":
        sig, params = f"{st}* out, double start, double stop, double div, int endpoint, long long n", "pdddiq"
        body = ("double v; double delta = stop - start;\n"
                "    if (div > 0) { double step = delta / div;\n"
                "      v = (step == 0) ? __dadd_rn(__dmul_rn((double)i / div, delta), start)"
                " : __dadd_rn(__dmul_rn((double)i, step), start); }\n"
                "    else v = __dadd_rn(__dmul_rn((double)i, delta), start);\n"
                "    if (endpoint && n > 1 && i == n - 1) v = stop;\n"
                + ("    v = floor(v);\n" if np.dtype(out_dt).kind in "iu" else ""))
        val = C.store(C.conv("v", np.dtype(np.float64), out_dt), out_dt)
        return (f'extern "C" __global__ void {name}({sig}) {{\n'
                f"  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;"
                f" i += (long long)blockDim.x * gridDim.x) {{\n    {body}    out[i] = {val};\n  }}\n}}\n"), name, params
    elif kind == "eye":
        sig, params = f"{st}* out, long long m, long long k, long long n", "pqqq"
        val = C.store(C.conv("((i % m) - (i / m) == k)", np.dtype(bool), out_dt), out_dt)
    else:
        raise AssertionError(kind)
    return (f'extern "C" __global__ void {name}({sig}) {{\n'
            f"  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;"
            f" i += (long long)blockDim.x * gridDim.x) out[i] = {val};\n}}\n"), name, params


def _fill(lane, kind: str, out, args: tuple) -> None:
    n = out.size
    if n == 0:
        return
    kern = lane.ctx.modules.get(("fill", kind, out.dtype), lambda: _build_fill(kind, out.dtype))
    kern.launch(lane.handle, grid_1d(lane.ctx, n), (256, 1, 1), (out.ptr, *args, n))


def full(lane, prim, ins, outs) -> None:
    out = outs[0]
    if out.size == 0:
        return
    raw = np.array(prim.value, dtype=out.dtype).tobytes()
    size = len(raw)
    if size == 1:
        check(cu.cuMemsetD8Async(out.ptr, raw[0], out.size, lane.stream), "cuMemsetD8Async")
    elif size == 2:
        check(cu.cuMemsetD16Async(out.ptr, int.from_bytes(raw, "little"), out.size, lane.stream), "cuMemsetD16Async")
    elif size == 4:
        check(cu.cuMemsetD32Async(out.ptr, int.from_bytes(raw, "little"), out.size, lane.stream), "cuMemsetD32Async")
    elif size == 8 and raw[:4] == raw[4:]:
        check(cu.cuMemsetD32Async(out.ptr, int.from_bytes(raw[:4], "little"), out.size * 2, lane.stream),
              "cuMemsetD32Async")
    else:
        v = np.array(prim.value, dtype=out.dtype)
        # a complex value is passed as its bytes (launch.py's F and Z parameters)
        _fill(lane, "full", out, (raw if out.dtype.kind == "c" else
                                  float(v.astype(np.float32)) if C.is_half(out.dtype) else v.item(),))


def arange(lane, prim, ins, outs) -> None:
    out = outs[0]
    start, step = prim.start, prim.step
    ints = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (start, step))
    if out.dtype.kind in "iub" and ints:
        _fill(lane, "arange_i", out, (int(start), int(step)))
    else:
        _fill(lane, "arange_f", out, (float(start), float(step)))


def linspace(lane, prim, ins, outs) -> None:
    out = outs[0]
    num = out.shape[0]
    if isinstance(prim.start, complex) or isinstance(prim.stop, complex):  # (real bounds into complex: the kernel)
        raise LaneflowError(f"linspace: the CUDA backend has no kernel for complex bounds ({prim.start!r}, "
                            f"{prim.stop!r}; {num} points of {out.dtype}); make it on the CPU (device=lf.cpu) or "
                            "from real and imaginary linspaces")
    div = (num - 1) if prim.endpoint else num
    _fill(lane, "linspace", out, (prim.start, prim.stop, float(div), int(prim.endpoint)))


def eye(lane, prim, ins, outs) -> None:
    out = outs[0]
    _fill(lane, "eye", out, (out.shape[1], prim.k))
