"""Sorting, searching and scans along an axis: ``lf.sort``/``argsort``, ``searchsorted`` and
``cumulative_sum``/``cumulative_prod``.

Simple, correct kernels rather than fast ones (the array API's functions, mostly called on small
arrays): a sort places each element by counting the elements of its row that come before it (a
stable rank, one thread per element, O(n) work each, so O(n^2) a row: long rows are better sorted on
the CPU); a search is one binary search per thread; a scan is one thread per line, in order.
The order is numpy's: NaN after every number (before, in a descending sort), equal elements in
their original order.

An array is seen as (outer, n, inner): ``n`` the axis' length, ``inner`` the product of the axes
after it; element (o, i, j) is at ``(o * n + i) * inner + j``.
"""

from __future__ import annotations

import numpy as np

from .... import dtypes as dt
from . import cdefs as C


def _lines(shape: tuple, axis: int) -> tuple[int, int, int]:
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    return outer, shape[axis], inner


def _before(in_dt) -> str:
    """``lf_before(a, b)``: a sorts before b (NaN last) in the compute type of in_dt."""
    T = C.compute(in_dt)
    nan = "  if (b != b) return a == a;\n" if C.kind(in_dt) == "f" else ""
    return (f"__device__ __forceinline__ bool lf_before({T} a, {T} b) {{\n{nan}  return a < b;\n}}\n")


def _build_sort(in_dt, arg: bool, descending: bool):
    T = C.compute(in_dt)
    st = C.storage(in_dt)
    out_t = "long long" if arg else st
    first, second = ("vj", "v") if not descending else ("v", "vj")
    src = (_before(in_dt)
           + f'extern "C" __global__ void lf_sort({out_t}* __restrict__ out, const {st}* __restrict__ in, '
           "long long outer, long long n, long long inner) {\n"
           "  long long total = outer * n * inner;\n"
           "  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;"
           " e += (long long)blockDim.x * gridDim.x) {\n"
           "    long long j = e % inner, i = (e / inner) % n, base = (e / inner / n) * n * inner + j;\n"
           f"    {T} v = {C.load('in[e]', in_dt)};\n"
           "    long long rank = 0;\n"
           "    for (long long k = 0; k < n; ++k) {\n"
           f"      {T} vj = {C.load('in[base + k * inner]', in_dt)};\n"
           f"      if (lf_before({first}, {second}) || (k < i && !lf_before({second}, {first}))) ++rank;\n"
           "    }\n"
           f"    out[base + rank * inner] = {'i' if arg else 'in[e]'};\n"
           "  }\n}\n")
    return src, "lf_sort", "ppqqq"


def _launch(ctx, lane, kern, total: int, args: tuple) -> None:
    if total:
        grid = (int(min(-(-total // 256), ctx.sm_count * 16)), 1, 1)
        kern.launch(lane.handle, grid, (256, 1, 1), args)


def sort(lane, prim, ins, outs) -> None:
    x, out = ins[0], outs[0]
    outer, n, inner = _lines(x.shape, prim.axis)
    ctx = lane.ctx
    kern = ctx.modules.get(("sort", x.dtype, prim.arg, prim.descending),
                           lambda: _build_sort(x.dtype, prim.arg, prim.descending))
    _launch(ctx, lane, kern, x.size, (out.ptr, x.ptr, outer, n, inner))


def _build_search(in_dt, right: bool):
    T = C.compute(in_dt)
    st = C.storage(in_dt)
    # left: the first i with not (x[i] before v); right: the first i with v before x[i]
    go_right = "!lf_before(v, s)" if right else "lf_before(s, v)"
    src = (_before(in_dt)
           + f'extern "C" __global__ void lf_search(long long* __restrict__ out, const {st}* __restrict__ sorted, '
           f"const {st}* __restrict__ q, long long n, long long m) {{\n"
           "  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < m;"
           " e += (long long)blockDim.x * gridDim.x) {\n"
           f"    {T} v = {C.load('q[e]', in_dt)};\n"
           "    long long lo = 0, hi = n;\n"
           "    while (lo < hi) {\n      long long mid = lo + (hi - lo) / 2;\n"
           f"      {T} s = {C.load('sorted[mid]', in_dt)};\n"
           f"      if ({go_right}) lo = mid + 1; else hi = mid;\n    }}\n"
           "    out[e] = lo;\n  }\n}\n")
    return src, "lf_search", "pppqq"


def searchsorted(lane, prim, ins, outs) -> None:
    s, q, out = ins[0], ins[1], outs[0]
    ctx = lane.ctx
    kern = ctx.modules.get(("searchsorted", s.dtype, prim.right), lambda: _build_search(s.dtype, prim.right))
    _launch(ctx, lane, kern, q.size, (out.ptr, s.ptr, q.ptr, s.shape[0], q.size))


def _build_scan(in_dt, out_dt, op: str, initial: bool):
    acc_dt = dt.float32 if C.is_half(out_dt) else out_dt
    A = C.compute(acc_dt)
    comb = {"sum": "acc + v", "prod": "acc * v"}[op] if C.kind(acc_dt) in "fc" else \
        {"sum": f"lf_wadd<{A}>(acc, v)", "prod": f"lf_wmul<{A}>(acc, v)"}[op]
    ident = "0" if op == "sum" else "1"
    store = C.store(C.conv("acc", acc_dt, out_dt), out_dt)
    src = (f'extern "C" __global__ void lf_scan({C.storage(out_dt)}* __restrict__ out, '
           f"const {C.storage(in_dt)}* __restrict__ in, long long outer, long long n, long long inner) {{\n"
           "  long long lines = outer * inner, m = n + " + ("1" if initial else "0") + ";\n"
           "  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < lines;"
           " e += (long long)blockDim.x * gridDim.x) {\n"
           "    long long j = e % inner, o = e / inner;\n"
           "    const long long src = o * n * inner + j, dst = o * m * inner + j;\n"
           f"    {A} acc = ({A}){ident};\n"
           + ("    out[dst] = " + store + ";\n" if initial else "")
           + "    for (long long i = 0; i < n; ++i) {\n"
           f"      {A} v = {C.conv(C.load('in[src + i * inner]', in_dt), in_dt, acc_dt)};\n"
           f"      acc = {comb};\n"
           f"      out[dst + (i + {1 if initial else 0}) * inner] = {store};\n"
           "    }\n  }\n}\n")
    return src, "lf_scan", "ppqqq"


def scan(lane, prim, ins, outs) -> None:
    x, out = ins[0], outs[0]
    outer, n, inner = _lines(x.shape, prim.axis)
    ctx = lane.ctx
    kern = ctx.modules.get(("scan", x.dtype, out.dtype, prim.name, prim.include_initial),
                           lambda: _build_scan(x.dtype, out.dtype, prim.op, prim.include_initial))
    _launch(ctx, lane, kern, outer * inner, (out.ptr, x.ptr, outer, n, inner))
