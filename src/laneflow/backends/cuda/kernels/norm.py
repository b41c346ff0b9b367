"""lf.nn.layer_norm and rms_norm: one kernel, contiguous rows over the last axis.

Rows of up to 1,024 elements take one warp each when there are many rows (``vpl`` values per lane in
registers, shuffles only); few rows, or longer ones, one block of 256 threads each (registers up to 8,192 elements, then three reads of the row
from global memory). Statistics accumulate in float32 (float64 for float64), two passes over the
held values as numpy does: the mean, then the mean squared deviation; ``(x - mean) / sqrt(var + eps)``
with a division, as the CPU reference computes it.
"""

from __future__ import annotations

from ....dtypes import float64
from . import cdefs as C
from .launch import grid_1d

_THREADS = 256
#: Longest row one warp takes (32 lanes x 32 values).
_WARP_MAX = 1024
#: Longest row a block holds in registers (256 threads x 32 values).
_BLOCK_MAX = 8192
#: A warp per row only when there are this many rows per SM: with fewer, a row's three dependent passes
#: on one warp are the kernel's whole time (GPT-2's 768-wide rows at 1 to 16 tokens: 15.7 us a norm on
#: the H200 against 8.9 us for the same rows as a block-per-row program, tools/op_times.py 2026-12-04).
_WARP_ROWS_PER_SM = 4


def _build(op: str, x_dt, w_dt, b_dt, out_dt, tpr: int, vpl: int):
    """Kernel source: ``tpr`` threads per row (32 or 256), ``vpl`` values per thread held in
    registers (0: the row is re-read from global memory at each pass)."""
    W = "double" if out_dt == float64 else "float"
    ld = lambda e, d: f"(({W}){C.load(e, d)})"  # noqa: E731
    sig = [f"{C.storage(out_dt)}* __restrict__ out", f"const {C.storage(x_dt)}* __restrict__ x"]
    codes = "pp"
    if w_dt is not None:
        sig.append(f"const {C.storage(w_dt)}* __restrict__ w")
        codes += "p"
    if b_dt is not None:
        sig.append(f"const {C.storage(b_dt)}* __restrict__ b")
        codes += "p"
    sig += ["long long rows", "long long N", f"{W} eps"]
    codes += "qq" + ("d" if W == "double" else "f")

    def reduce(v: str) -> str:
        s = f"      for (int o_ = 16; o_ > 0; o_ >>= 1) {v} += __shfl_xor_sync(0xffffffffu, {v}, o_);\n"
        if tpr > 32:
            s += (f"      if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = {v};\n      __syncthreads();\n"
                  f"      {v} = (threadIdx.x & 31) < {tpr // 32} ? sm[threadIdx.x & 31] : ({W})0;\n"
                  f"      for (int o_ = 16; o_ > 0; o_ >>= 1) {v} += __shfl_xor_sync(0xffffffffu, {v}, o_);\n"
                  "      __syncthreads();\n")
        return s

    layer = op == "layer_norm"
    if vpl:
        head = f"      {W} v[{vpl}];\n"
        each = f"      #pragma unroll\n      for (int k = 0; k < {vpl}; ++k) {{ long long c = (long long)k * {tpr} + t; if (c < N) {{ "
        val = "v[k]"
        head += each + f"v[k] = {ld('xr[c]', x_dt)}; }} else v[k] = 0; }}\n"
    else:
        head = ""
        each = f"      for (long long c = t; c < N; c += {tpr}) {{ "
        val = f"{ld('xr[c]', x_dt)}"
    body = head
    if layer:
        body += f"      {W} s = 0;\n" + each + f"s += {val}; }}" + (" }\n" if vpl else "\n") + reduce("s")
        body += f"      const {W} mean = s / ({W})N;\n"
        body += f"      {W} q = 0;\n" + each + f"{W} d_ = {val} - mean; q += d_ * d_; }}" + (" }\n" if vpl else "\n")
    else:
        body += f"      const {W} mean = 0;\n      {W} q = 0;\n" + each + f"{W} d_ = {val}; q += d_ * d_; }}" + (" }\n" if vpl else "\n")
    body += reduce("q")
    body += f"      const {W} den = sqrt(q / ({W})N + eps);\n"
    y = f"{W} y = ({val} - mean) / den;"
    if w_dt is not None:
        y += f" y = y * {ld('w[c]', w_dt)};"
    if b_dt is not None:
        y += f" y = y + {ld('b[c]', b_dt)};"
    body += each + y + f" outr[c] = {C.store('y', out_dt)}; }}" + (" }\n" if vpl else "\n")
    rpb = _THREADS // tpr
    src = (f'extern "C" __global__ void __launch_bounds__({_THREADS}) lf_norm({", ".join(sig)}) {{\n'
           + (f"  __shared__ {W} sm[32];\n" if tpr > 32 else "")
           + f"  const int t = threadIdx.x % {tpr};\n"
           f"  for (long long row = (long long)blockIdx.x * {rpb} + threadIdx.x / {tpr}; row < rows;"
           f" row += (long long)gridDim.x * {rpb}) {{\n"
           f"      const {C.storage(x_dt)}* xr = x + row * N;\n"
           f"      {C.storage(out_dt)}* outr = out + row * N;\n"
           + body + "  }\n}\n")
    return src, "lf_norm", codes


def norm(lane, prim, ins, outs) -> None:
    x, out = ins[0], outs[0]
    if out.size == 0:
        return
    N = x.shape[-1]
    rows = out.size // N
    w = ins[1] if prim.weight else None
    b = ins[1 + prim.weight] if prim.bias else None
    if N <= _WARP_MAX and rows >= _WARP_ROWS_PER_SM * lane.ctx.sm_count:
        tpr = 32
        vpl = -(-N // 32)
    else:
        tpr = _THREADS
        vpl = -(-N // _THREADS) if N <= _BLOCK_MAX else 0
    vpl = 1 << (vpl - 1).bit_length() if vpl > 1 else vpl  # a power of two: few distinct kernels
    spec = ("norm", prim.name, x.dtype, None if w is None else w.dtype, None if b is None else b.dtype, out.dtype,
            tpr, vpl)
    ctx = lane.ctx
    kern = ctx.modules.get(spec, lambda: _build(prim.name, x.dtype, None if w is None else w.dtype,
                                                None if b is None else b.dtype, out.dtype, tpr, vpl))
    args = [out.ptr, x.ptr] + ([w.ptr] if w is not None else []) + ([b.ptr] if b is not None else [])
    args += [rows, N, prim.eps]
    rpb = _THREADS // tpr
    kern.launch(lane.handle, grid_1d(ctx, rows, threads=rpb, per_sm=8 if tpr > 32 else 32), (_THREADS, 1, 1),
                tuple(args))
