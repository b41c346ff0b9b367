"""Philox-4x32-10 on the GPU, bit for bit the function of ``backends/cpu/philox.py``.

Element i of a draw uses counter (i, 0, 0, tag) under the key, so the integer words are identical on
every device; floats are formed with the same operations in the same order (products and sums are
rounded separately, never fused, as numpy rounds them).
"""

from __future__ import annotations

import numpy as np

from .... import dtypes as dt
from ....dtypes import inside_range
from . import cdefs as C
from .launch import grid_1d

_PHILOX = r"""
__device__ __forceinline__ void lf_philox(unsigned long long idx, unsigned k0, unsigned k1, unsigned tag,
                                          unsigned& w0, unsigned& w1, unsigned& w2, unsigned& w3) {
  unsigned c0 = (unsigned)idx, c1 = (unsigned)(idx >> 32), c2 = 0u, c3 = tag;
  #pragma unroll
  for (int r = 0; r < 10; ++r) {
    unsigned long long p0 = (unsigned long long)c0 * 0xD2511F53ull;
    unsigned long long p1 = (unsigned long long)c2 * 0xCD9E8D57ull;
    unsigned hi0 = (unsigned)(p0 >> 32), lo0 = (unsigned)p0, hi1 = (unsigned)(p1 >> 32), lo1 = (unsigned)p1;
    unsigned n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  w0 = c0; w1 = c1; w2 = c2; w3 = c3;
}
"""


_BITS = {"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8}


def _build(dist: str, key_dt, out_dt):
    wide = out_dt == dt.float64
    ks = C.storage(key_dt)
    if dist == "uniform":
        # k * 2**-bits with bits the significand width of out_dt (exact there), a + (b - a) * u in
        # double, rounded to out_dt and clipped into [low, high) as the CPU backend does.
        bits = _BITS[C.dname(out_dt)]
        if bits > 32:
            k = f"((((unsigned long long)w0) << {bits - 32}) ^ (((unsigned long long)w1) >> {64 - bits}))"
        else:
            k = f"(w0 >> {32 - bits})"
        val = (f"double u = __dmul_rn((double){k}, {2.0 ** -bits!r});\n"
               "    double r = __dadd_rn(a, __dmul_rn(ba, u));\n"
               f"    {C.compute(out_dt)} v = {C.conv('r', dt.float64, out_dt)};\n"
               "    v = v < lo ? lo : v; v = v > hi ? hi : v;\n")
        res = "v"
        sig_ab = f"double a, double ba, {C.compute(out_dt)} lo, {C.compute(out_dt)} hi"
        params = "ppdd" + C.PARAM[C.dname(out_dt)] * 2 + "q"
    elif wide:
        val = ("double u1 = (double)((((unsigned long long)w0) << 21) ^ (((unsigned long long)w1) >> 11));\n"
               "    double u2 = (double)((((unsigned long long)w2) << 21) ^ (((unsigned long long)w3) >> 11));\n"
               "    u1 = __dsub_rn(1.0, __dmul_rn(u1, 1.0 / 9007199254740992.0)); u2 = __dmul_rn(u2, 1.0 / 9007199254740992.0);\n"
               "    double z = __dmul_rn(sqrt(__dmul_rn(-2.0, log(u1))), cos(__dmul_rn(2.0 * 3.141592653589793, u2)));\n"
               "    double r = __dadd_rn(a, __dmul_rn(ba, z));\n")
        res = C.conv("r", dt.float64, out_dt)
        sig_ab = "double a, double ba"
        params = "ppddq"
    else:
        val = ("float u1 = __fsub_rn(1.0f, __fmul_rn((float)(w0 >> 8), 1.0f / 16777216.0f));\n"
               "    float u2 = __fmul_rn((float)(w1 >> 8), 1.0f / 16777216.0f);\n"
               "    float z = __fmul_rn(sqrtf(__fmul_rn(-2.0f, logf(u1))), cosf(__fmul_rn(6.2831855f, u2)));\n"
               "    float r = __fadd_rn(a, __fmul_rn(ba, z));\n")
        res = C.conv("r", dt.float32, out_dt)
        sig_ab = "float a, float ba"
        params = "ppffq"
    store = C.store(res, out_dt)
    src = (_PHILOX + f'extern "C" __global__ void lf_random({C.storage(out_dt)}* __restrict__ out, const {ks}* key, '
           f"{sig_ab}, long long n) {{\n"
           "  unsigned k0 = (unsigned)(long long)key[0], k1 = (unsigned)(long long)key[1];\n"
           "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;"
           " i += (long long)blockDim.x * gridDim.x) {\n"
           "    unsigned w0, w1, w2, w3; lf_philox((unsigned long long)i, k0, k1, 0u, w0, w1, w2, w3);\n"
           f"    {val}    out[i] = {store};\n  }}\n}}\n")
    return src, "lf_random", params


def _inside(dtype, low: float, high: float) -> tuple:
    """Smallest value of dtype >= low and largest < high: the CPU backend's clip bounds, as floats."""
    lo, hi = inside_range(dtype, low, high)
    return float(lo), float(hi)


def random(lane, prim, ins, outs) -> None:
    key, out = ins[0], outs[0]
    n = out.size
    if n == 0:
        return
    kern = lane.ctx.modules.get(("random", prim.dist, key.dtype, out.dtype), lambda: _build(prim.dist, key.dtype, out.dtype))
    if prim.dist == "uniform":
        lo, hi = _inside(out.dtype, prim.a, prim.b)
        args = (out.ptr, key.ptr, float(prim.a), float(prim.b - prim.a), lo, hi, n)
    elif out.dtype == dt.float64:
        args = (out.ptr, key.ptr, float(prim.a), float(prim.b), n)
    else:
        args = (out.ptr, key.ptr, float(np.float32(prim.a)), float(np.float32(prim.b)), n)
    kern.launch(lane.handle, grid_1d(lane.ctx, n), (256, 1, 1), args)


def _build_split(key_dt, out_dt):
    src = (_PHILOX + f'extern "C" __global__ void lf_split({C.storage(out_dt)}* __restrict__ out, '
           f"const {C.storage(key_dt)}* key, long long num) {{\n"
           "  unsigned k0 = (unsigned)(long long)key[0], k1 = (unsigned)(long long)key[1];\n"
           "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < num;"
           " i += (long long)blockDim.x * gridDim.x) {\n"
           "    unsigned w0, w1, w2, w3; lf_philox((unsigned long long)i, k0, k1, 1u, w0, w1, w2, w3);\n"
           f"    out[2 * i] = {C.store(C.conv('w0', dt.uint32, out_dt), out_dt)};"
           f" out[2 * i + 1] = {C.store(C.conv('w1', dt.uint32, out_dt), out_dt)};\n  }}\n}}\n")
    return src, "lf_split", "ppq"


def random_split(lane, prim, ins, outs) -> None:
    key, out = ins[0], outs[0]
    kern = lane.ctx.modules.get(("split", key.dtype, out.dtype), lambda: _build_split(key.dtype, out.dtype))
    kern.launch(lane.handle, grid_1d(lane.ctx, prim.num), (256, 1, 1), (out.ptr, key.ptr, prim.num))
