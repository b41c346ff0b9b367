"""``lf.linalg.slogdet`` and ``det``: LU with partial pivoting, one thread per matrix, on a copy in
the op's workspace output. A simple kernel for the array API's small matrices (O(n^3) per thread);
large batched factorizations belong to cuSOLVER (``backends/cuda/linalg.py``).
"""

from __future__ import annotations

from .... import dtypes as dt
from . import cdefs as C


def _build(dtype):
    T = C.compute(dtype)
    R = C.compute(dt.real_dtype(dtype))  # log |det| is real; a complex pivot turns the sign by piv / |piv|
    turn = f"s *= piv / {T}(lf_abs(piv));" if dt.is_complex(dtype) else "if (piv < 0) s = -s;"
    src = (f'extern "C" __global__ void lf_slogdet({T}* __restrict__ sign, {R}* __restrict__ logabs, '
           f"{T}* __restrict__ det, {T}* __restrict__ work, const {T}* __restrict__ in, long long batch, long long n) {{\n"
           "  for (long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x; b < batch;"
           " b += (long long)blockDim.x * gridDim.x) {\n"
           f"    {T}* a = work + b * n * n;\n"
           "    for (long long e = 0; e < n * n; ++e) a[e] = in[b * n * n + e];\n"
           f"    {T} s = 1, d = 1;\n    {R} l = 0;\n"
           "    for (long long k = 0; k < n; ++k) {\n"
           "      long long p = k;\n"
           "      for (long long i = k + 1; i < n; ++i) if (lf_abs(a[i * n + k]) > lf_abs(a[p * n + k])) p = i;\n"
           f"      {T} piv = a[p * n + k];\n"
           "      if (piv == 0) { s = 0; l = -INFINITY; d = 0; break; }\n"
           "      if (piv != piv) { s = piv; l = NAN; d = piv; break; }\n"
           f"      if (p != k) {{ for (long long j = 0; j < n; ++j) {{ {T} t = a[k * n + j]; a[k * n + j] = a[p * n + j];"
           " a[p * n + j] = t; } s = -s; d = -d; }\n"
           f"      {turn}\n"
           "      l += lf_log(lf_abs(piv));\n      d *= piv;\n"
           "      for (long long i = k + 1; i < n; ++i) {\n"
           f"        {T} f = a[i * n + k] / piv;\n"
           "        for (long long j = k + 1; j < n; ++j) a[i * n + j] -= f * a[k * n + j];\n"
           "      }\n    }\n"
           "    sign[b] = s; logabs[b] = l; det[b] = d;\n  }\n}\n")
    return src, "lf_slogdet", "pppppqq"


def slogdet(lane, prim, ins, outs) -> None:
    x = ins[0]
    sign, logabs, det, work = outs
    n = x.shape[-1]
    batch = x.size // (n * n) if n else sign.size
    ctx = lane.ctx
    kern = ctx.modules.get(("slogdet", x.dtype), lambda: _build(x.dtype))
    if batch:
        kern.launch(lane.handle, (int(min(-(-batch // 64), ctx.sm_count * 8)), 1, 1), (64, 1, 1),
                    (sign.ptr, logabs.ptr, det.ptr, work.ptr, x.ptr, batch, n))
