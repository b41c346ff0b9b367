"""Matrix products through cuBLASLt (nvmath-python's bindings), with a plan cache.

One cuBLASLt handle per device; each lane has its own workspace, so lanes never share one.
Row-major ``C = A @ B`` is computed as the column-major ``C^T = B^T A^T``, which needs no
transposes: the row-major buffers already are the column-major transposes. Batches use strided
batching; an operand whose batch is a single matrix is broadcast with batch stride 0, any other
broadcast is materialised first. A plan (descriptors, layouts, the algorithm the heuristic chose)
is cached by dtype, shape, batch strides and the TF32 setting, so a repeated matmul is not re-planned.

float16/bfloat16 accumulate in float32; float32 does not use TF32 unless enabled with
:func:`set_allow_tf32` (or ``LANEFLOW_ALLOW_TF32=1``); float64 computes in float64; complex64 and
complex128 are cuBLASLt's C and Z products (``CUDA_C_32F``/``CUDA_C_64F`` data and scale types, 32F/64F
compute). Integer and bool products run in a simple kernel with numpy's wrapping arithmetic.
"""

from __future__ import annotations

import os

import numpy as np
from cuda.bindings import driver as cu

from ... import dtypes as dt
from ...errors import LaneflowError
from ...ops.primitives import MatmulEpilogue
from ...shapes import broadcast_shapes
from .driver import check
from .handles import LT_WORKSPACE_BYTES, cublaslt_pool, device_handles
from .kernels import cdefs as C
from .kernels.copy import strided_copy
from .kernels.launch import grid_1d
from .kernels.plan import broadcast_strides, contiguous_strides
from .kernels.pointers import upload_for_graph

_allow_tf32 = os.environ.get("LANEFLOW_ALLOW_TF32", "") == "1"
WORKSPACE_BYTES = LT_WORKSPACE_BYTES
_CUDA_TYPE = {"float16": 2, "bfloat16": 14, "float32": 0, "float64": 1, "complex64": 4, "complex128": 5}  # cudaDataType_t
#: per dtype: (cuBLAS compute type, scale type (cudaDataType_t of alpha and beta), their host dtype)
_COMPUTE_OF = {
    "float16": ("COMPUTE_32F", 0, np.float32), "bfloat16": ("COMPUTE_32F", 0, np.float32),
    "float32": ("COMPUTE_32F", 0, np.float32), "float64": ("COMPUTE_64F", 1, np.float64),
    "complex64": ("COMPUTE_32F", 4, np.complex64), "complex128": ("COMPUTE_64F", 5, np.complex128),
}


def set_allow_tf32(allow: bool) -> None:
    """Let float32 matmuls use TF32 tensor cores (faster, about 1e-3 relative error). Off by default."""
    global _allow_tf32
    _allow_tf32 = bool(allow)


def _lt():
    try:
        from nvmath.bindings import cublas, cublasLt
    except ImportError as e:
        raise LaneflowError(f"matmul: nvmath-python is needed for GPU matmul ({e}); install laneflow[cuda]") from None
    return cublas, cublasLt


#: Shortest unaligned rows (elements) a product writes through a padded temporary (see ``matmul``)
_PAD_MIN_N = 1024
#: (bias, residual, act) of a plain product
_NO_EPILOGUE = (False, False, None)


class _Plan:
    """One product's cuBLASLt descriptors and algorithm. The scalars' and the bias pointer's host
    addresses are taken once here, not per call (a numpy ``.ctypes`` costs about a microsecond)."""

    __slots__ = ("desc", "a", "b", "c", "algo", "algo_ptr", "ws", "alpha", "beta", "keep", "alpha_ptr", "beta_ptr",
                 "bias", "bias_addr")


class MatmulLib:
    """Per-device cuBLASLt state: the handle pool (one handle per device by default, a workspace per
    lane; see :mod:`laneflow.runtime.handle_pool`), a handle for planning, and the plan cache."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.cublas, self.lt = _lt()
        ctx.ensure_current()
        self.pool = cublaslt_pool(ctx, self.lt)
        self.handle = self.lt.create()  # for heuristics queries only; algorithms are valid on any handle
        self.plans: dict = {}
        self._blas = None

    def plan(self, dtype, m: int, n: int, k: int, batch: int, sa: int, sb: int, ta: bool = False, lda: int = 0,
             tb: bool = False, ldb: int = 0, epi: tuple = _NO_EPILOGUE, ldc: int = 0) -> _Plan:
        """The plan of ``A (m x k) @ B (k x n)`` per batch entry: batch strides ``sa``, ``sb``;
        ``ta``/``tb``: the operand is stored transposed (column-major) with leading dimension
        ``lda``/``ldb`` (0: contiguous row-major); ``epi``: (bias, residual, act) of a
        ``MatmulEpilogue``; ``ldc``: the result's row stride (0: n)."""
        tf32 = _allow_tf32 and dtype == dt.float32
        key = (dtype, m, n, k, batch, sa, sb, tf32, ta, lda, tb, ldb, epi, ldc)
        p = self.plans.get(key)
        if p is None:
            p = self.plans[key] = self._make(dtype, m, n, k, batch, sa, sb, tf32, ta, lda or k, tb, ldb or n, epi,
                                                 ldc or n)
        return p

    def _make(self, dtype, m, n, k, batch, sa, sb, tf32, ta=False, lda=0, tb=False, ldb=0,
              epi: tuple = _NO_EPILOGUE, ldc: int = 0) -> _Plan:
        lt, cublas = self.lt, self.cublas
        ct = cublas.ComputeType
        name = C.dname(dtype)
        dtype_id = _CUDA_TYPE[name]
        compute_name, scale, sdt = _COMPUTE_OF[name]
        compute = ct.COMPUTE_32F_FAST_TF32 if tf32 else getattr(ct, compute_name)
        p = _Plan()
        p.keep = []
        p.desc = lt.matmul_desc_create(int(compute), scale)
        # column-major view: D (n x m, ld n) = A' (n x k: our B) @ B' (k x m: our A). A row-major
        # operand is its own column-major transpose (op N); one stored transposed (a transposed view)
        # is the column-major matrix itself, read with op T.
        D = lt.MatmulDescAttribute
        if tb:
            self._set(lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, p.desc, D.TRANSA, 1)
        if ta:
            self._set(lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, p.desc, D.TRANSB, 1)
        bias, residual, act = epi
        if bias:  # column-major D is (n x m): cuBLASLt's bias runs along its n rows, our last axis
            E = lt.Epilogue
            self._set(lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, p.desc, D.EPILOGUE,
                      int(E.GELU_BIAS if act == "gelu_tanh" else E.BIAS))
        ldb, lda = ldb or n, lda or k
        p.a = self._layout(dtype_id, k, n, ldb, batch, sb) if tb else self._layout(dtype_id, n, k, ldb, batch, sb)
        p.b = self._layout(dtype_id, m, k, lda, batch, sa) if ta else self._layout(dtype_id, k, m, lda, batch, sa)
        ldc = ldc or n
        p.c = self._layout(dtype_id, n, m, ldc, batch, m * ldc)
        pref = lt.matmul_preference_create()
        try:
            self._set(lt.matmul_preference_set_attribute, lt.get_matmul_preference_attribute_dtype, pref,
                      lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES, WORKSPACE_BYTES)
            results = np.zeros(1, dtype=lt.matmul_heuristic_result_dtype)
            count = np.zeros(1, np.int32)
            lt.matmul_algo_get_heuristic(self.handle, p.desc, p.a, p.b, p.c, p.c, pref, 1, results.ctypes.data,
                                         count.ctypes.data)
        finally:
            lt.matmul_preference_destroy(pref)
        if count[0] < 1:
            what = f" with epilogue {epi}" if epi != _NO_EPILOGUE else ""
            raise LaneflowError(f"matmul: cuBLASLt has no algorithm for {dtype} ({m}x{k} @ {k}x{n}, batch {batch})"
                                f"{what}; LANEFLOW_FUSE=0 runs the epilogue as separate kernels")
        p.algo = results
        names = results.dtype.names or ()
        off = results.dtype.fields["algo"][1] if "algo" in names else 0
        p.algo_ptr = results.ctypes.data + off
        p.ws = int(results["workspace_size"][0]) if "workspace_size" in names else WORKSPACE_BYTES
        p.alpha = np.ones(1, sdt)
        p.beta = (np.ones if residual else np.zeros)(1, sdt)  # D = A B + beta C: C is the residual
        p.alpha_ptr, p.beta_ptr = p.alpha.ctypes.data, p.beta.ctypes.data
        p.bias = np.zeros(1, lt.get_matmul_desc_attribute_dtype(D.BIAS_POINTER)) if bias else None
        p.bias_addr = p.bias.ctypes.data if bias else 0
        return p

    def _layout(self, type_id: int, rows: int, cols: int, ld: int, batch: int, stride: int) -> int:
        lt = self.lt
        lay = lt.matrix_layout_create(type_id, rows, cols, max(ld, 1))
        if batch > 1:
            A = lt.MatrixLayoutAttribute
            self._set(lt.matrix_layout_set_attribute, lt.get_matrix_layout_attribute_dtype, lay, A.BATCH_COUNT, batch)
            self._set(lt.matrix_layout_set_attribute, lt.get_matrix_layout_attribute_dtype, lay,
                      A.STRIDED_BATCH_OFFSET, stride)
        return lay

    @staticmethod
    def _set(setter, dtype_of, obj, attr, value) -> None:
        buf = np.array([value], dtype=dtype_of(attr))
        setter(obj, attr, buf.ctypes.data, buf.itemsize)

    def blas_pool(self):
        """The device's cuBLAS (legacy API) pool: grouped matmuls use ``cublasGemmBatchedEx``."""
        pool = self._blas
        if pool is None:
            pool = self._blas = device_handles(self.ctx).pool("cublas")
        return pool

    def run(self, lane, p: _Plan, a_ptr: int, b_ptr: int, c_ptr: int, r_ptr: int = 0, bias_ptr: int = 0) -> None:
        """``D (c_ptr) = A B`` (+ the residual at ``r_ptr``, + the bias at ``bias_ptr``, per the plan)."""
        e = self.pool.use(lane)  # held until released below (no with-protocol calls on this hot path)
        try:
            handle, (ws_ptr, ws_size) = e.current
            lt = self.lt
            if bias_ptr:  # the plan's descriptor is shared: its bias pointer is set for this call
                p.bias[0] = bias_ptr
                lt.matmul_desc_set_attribute(p.desc, lt.MatmulDescAttribute.BIAS_POINTER, p.bias_addr, p.bias.itemsize)
            lt.matmul(handle, p.desc, p.alpha_ptr, b_ptr, p.a, a_ptr, p.b, p.beta_ptr,
                           r_ptr or c_ptr, p.c, c_ptr, p.c, p.algo_ptr, ws_ptr, ws_size, lane.handle)
        finally:
            e.lock.release()


def _lib(ctx) -> MatmulLib:
    lib = ctx.matmul
    if lib is None:
        lib = ctx.matmul = MatmulLib(ctx)
    return lib


def _strided_matrix(x, batch_shape: tuple, mat: tuple) -> tuple | None:
    """(batch stride, transposed, ld) of a strided view ``x`` (``x.strides``, in
    elements) that cuBLASLt reads as it is: each matrix row-major (unit column stride) or column-major
    (unit row stride) with room between rows, and the batch dims one stride apart (or one matrix
    broadcast). None when it must be copied first."""
    st = x.strides
    nd = len(x.shape)
    if nd < 2:
        return None
    r, c = mat
    rs, cs = st[-2], st[-1]
    if (cs == 1 or c == 1) and (r == 1 or rs >= c):
        trans, ld = False, (rs if r > 1 else c)
    elif (rs == 1 or r == 1) and (c == 1 or cs >= r):
        trans, ld = True, (cs if c > 1 else r)
    else:
        return None
    xb = [(s, t) for s, t in zip(x.shape[:-2], st[:-2]) if s != 1]
    nb = 1
    for s, _ in xb:
        nb *= s
    if nb == 1:
        return 0, trans, ld
    full = (1,) * (len(batch_shape) - (nd - 2)) + tuple(x.shape[:-2]) == tuple(batch_shape)
    if not full:
        return None
    for (s0, t0), (s1, t1) in zip(xb, xb[1:]):  # the batch dims must merge into one
        if t0 != s1 * t1:
            return None
    return xb[-1][1], trans, ld


def _operand(lane, x, dtype, batch_shape: tuple, mat: tuple, temps: list) -> tuple[int, int, bool, int]:
    """(pointer, batch stride, transposed, leading dimension) of x as ``batch_shape + mat`` in
    dtype: x where it lies when cuBLASLt can read it there (contiguous, or a strided view that
    ``_strided_matrix`` accepts), else a contiguous copy (a cast, a broadcast, other strides)."""
    xb = x.shape[:-2] if len(x.shape) >= 2 else ()
    xmat = mat
    nb = 1
    for s in xb:
        nb *= s
    msize = mat[0] * mat[1]
    strides = getattr(x, "strides", None)
    if strides is not None and x.dtype == dtype and C.dname(dtype) in _CUDA_TYPE:
        got = _strided_matrix(x, batch_shape, mat)
        if got is not None:
            return x.ptr, got[0], got[1], got[2]
    full = (1,) * (len(batch_shape) - len(xb)) + tuple(xb) == tuple(batch_shape)
    if strides is None and x.dtype == dtype and (nb == 1 or full):
        return x.ptr, (0 if nb == 1 else msize), False, mat[1]
    # cast, broadcast and/or gather into a temporary
    keep_batch = not (nb == 1)
    shape = (tuple(batch_shape) if keep_batch else ()) + xmat
    total = 1
    for s in shape:
        total *= s
    ptr = lane.ctx.memory.raw_alloc(max(1, total * dtype.itemsize), lane.stream, "matmul")
    temps.append(ptr)
    src_shape = (tuple(xb) if keep_batch else ()) + xmat
    if strides is None:
        src_strides = broadcast_strides(src_shape, shape)
    else:  # the view's own strides, broadcast over the batch
        own = tuple(strides) if keep_batch else tuple(strides[-2:]) if len(strides) >= 2 else (0, strides[-1])
        pad = len(shape) - len(own)
        src_strides = tuple(0 if d < pad or src_shape[d - pad] == 1 else own[d - pad] for d in range(len(shape)))
    strided_copy(lane, ptr, dtype, x.ptr, x.dtype, shape, src_strides, contiguous_strides(shape))
    return ptr, (msize if keep_batch else 0), False, mat[1]


def _dense(lane, x, dtype, temps: list) -> int:
    """A pointer to x as contiguous, 16-byte aligned memory of ``dtype`` (an epilogue's bias or
    residual): x itself, or a copy when it is a strided view or sits at an odd offset."""
    strides = getattr(x, "strides", None)
    if strides is None and x.dtype == dtype and x.ptr % 16 == 0:
        return x.ptr
    shape = tuple(x.shape)
    n = 1
    for s in shape:
        n *= s
    ptr = lane.ctx.memory.raw_alloc(max(1, n * dtype.itemsize), lane.stream, "matmul")
    temps.append(ptr)
    strided_copy(lane, ptr, dtype, x.ptr, x.dtype, shape,
                 tuple(strides) if strides is not None else contiguous_strides(shape), contiguous_strides(shape))
    return ptr


class _Rows:
    """An operand (batch..., M, K) seen as (rows, K): the same memory, one matrix."""

    __slots__ = ("ptr", "dtype", "shape")

    def __init__(self, a, rows: int, k: int):
        self.ptr, self.dtype, self.shape = a.ptr, a.dtype, (rows, k)


def matmul(lane, prim, ins, outs) -> None:
    a, b = ins[0], ins[1]  # (then a MatmulEpilogue's bias and residual)
    out = outs[0]
    if out.size == 0:
        return
    K = a.shape[-1]
    M = a.shape[-2] if len(a.shape) >= 2 else 1
    N = b.shape[-1] if len(b.shape) >= 2 else 1
    if len(b.shape) == 2 and len(a.shape) > 2 and a.dtype == out.dtype and getattr(a, "strides", None) is None:
        # a batch of rows times one matrix: one GEMM over all the rows (a and out are contiguous)
        M = out.size // N
        a = _Rows(a, M, K)
    batch_shape = broadcast_shapes([a.shape[:-2] if len(a.shape) >= 2 else (), b.shape[:-2] if len(b.shape) >= 2 else ()])
    batch = 1
    for s in batch_shape:
        batch *= s
    if K == 0:
        check(cu.cuMemsetD8Async(out.ptr, 0, out.nbytes, lane.stream), "cuMemsetD8Async")
        return
    dtype = out.dtype
    temps: list = []
    try:
        pa, sa, ta, lda = _operand(lane, a, dtype, batch_shape, (M, K), temps)
        pb, sb, tb, ldb = _operand(lane, b, dtype, batch_shape, (K, N), temps)
        if C.dname(dtype) in _CUDA_TYPE:
            lib = _lib(lane.ctx)
            epi = (prim.bias, prim.residual, prim.act) if prim.__class__ is MatmulEpilogue else _NO_EPILOGUE
            bias_ptr = _dense(lane, ins[2], dtype, temps) if epi[0] else 0
            r_ptr = _dense(lane, ins[2 + epi[0]], dtype, temps) if epi[1] else 0
            per = 16 // dtype.itemsize
            if N % per and N >= _PAD_MIN_N and batch == 1 and not epi[1]:
                # A width that is not a multiple of 16 bytes (GPT-2's 50,257 logits) leaves cuBLASLt
                # only slow kernels: 84 us for GPT-2 small's head at 16 tokens, against 19.6 at 50,264
                # or 50,240 (H200, tools/probe_head.py), padded output rows or not. So the first
                # N - N % per columns are one product and the last few another, both into rows padded
                # to 16 bytes, and one copy packs them.
                isz = dtype.itemsize
                ldc = -(-N // per) * per
                n1 = N - N % per
                ldb = ldb or N
                tmp = lane.ctx.memory.raw_alloc(M * ldc * isz, lane.stream, "matmul")
                temps.append(tmp)
                p = lib.plan(dtype, M, n1, K, batch, sa, sb, ta, lda, tb, ldb, epi, ldc)
                lib.run(lane, p, pa, pb, tmp, 0, bias_ptr)
                p = lib.plan(dtype, M, N - n1, K, batch, sa, sb, ta, lda, tb, ldb, epi, ldc)
                lib.run(lane, p, pa, pb + (n1 * ldb if tb else n1) * isz, tmp + n1 * isz, 0,
                        bias_ptr + n1 * isz if bias_ptr else 0)
                strided_copy(lane, out.ptr, dtype, tmp, dtype, (M, N), (ldc, 1), (N, 1))
            else:
                p = lib.plan(dtype, M, N, K, batch, sa, sb, ta, lda, tb, ldb, epi)
                lib.run(lane, p, pa, pb, out.ptr, r_ptr, bias_ptr)
        else:
            _int_matmul(lane, dtype, pa, sa, pb, sb, out.ptr, M, N, K, batch)
    finally:
        for t in temps:
            lane.ctx.memory.raw_free(t, lane.stream)


#: Largest group of matmuls in one command (``Backend.limits``): the pointer kernel passes the group's
#: A, B and C pointers as one kernel parameter block, which must stay under 4 KiB.
MAX_GROUP = 128
#: dtypes whose matmuls group into one pointer-array batched GEMM (graph/grouping.py)
GROUPED_DTYPES = frozenset(np.dtype(d) for d in (np.float16, dt.bfloat16, np.float32, np.float64))
_PTR_SLOTS = 3 * MAX_GROUP  # pointers per cuBLAS call: A, B and C arrays of up to MAX_GROUP matrices

_PTR_SRC = f"""
struct lf_ptr_block {{ unsigned long long v[{_PTR_SLOTS}]; }};
extern "C" __global__ void lf_store_ptrs(unsigned long long* __restrict__ dst, int n, lf_ptr_block p) {{
  int i = threadIdx.x;
  if (i < n) dst[i] = p.v[i];
}}
"""


_COMPUTE: dict = {}


def _compute_type(cublas, dtype) -> tuple[int, np.ndarray, np.ndarray]:
    """(cuBLAS compute type, alpha, beta) for a grouped GEMM of ``dtype`` (cached: alpha and beta are
    host scalars the call reads at once, never written)."""
    tf32 = _allow_tf32 and dtype == dt.float32
    hit = _COMPUTE.get((dtype, tf32))
    if hit is None:
        ct = cublas.ComputeType
        compute_name, _, sdt = _COMPUTE_OF[C.dname(dtype)]
        hit = int(ct.COMPUTE_32F_FAST_TF32 if tf32 else getattr(ct, compute_name)), np.ones(1, sdt), np.zeros(1, sdt)
        _COMPUTE[(dtype, tf32)] = hit
    return hit


def matmul_group(lane, prim, ins, outs) -> None:
    """Independent matmuls of equal shapes, ``outs[i] = ins[i] @ ins[n + i]``, as pointer-array batched
    GEMMs (``cublasGemmBatchedEx``; one call per ``MAX_GROUP`` matrices). The pointer arrays are
    written on the lane by a kernel whose parameter block holds them, so no host memory has to
    outlive the call; inside a graph capture they are written once into the graph's own memory.

    Measured on the H200 (``tools/probe_grouped.py``): 32 x (16x4096 @ 4096x1024) bf16 in 66.7 us
    against 66.0 for a strided batch over stacked operands and 685 for 32 separate cuBLASLt calls.
    """
    n = len(outs)
    a0, b0, c0 = ins[0], ins[n], outs[0]
    M, K, N = a0.shape[-2], a0.shape[-1], b0.shape[-1]
    batch = 1
    for s in a0.shape[:-2]:
        batch *= s
    dtype = c0.dtype
    isz = dtype.itemsize
    sa, sb, sc = M * K * isz, K * N * isz, M * N * isz
    # column-major view, as in `matmul`: C^T (N x M) = B^T (N x K) @ A^T (K x M)
    if batch == 1:
        pa, pb, pc = [b.ptr for b in ins[n:]], [a.ptr for a in ins[:n]], [c.ptr for c in outs]
    else:
        pa = [b.ptr + j * sb for b in ins[n:] for j in range(batch)]
        pb = [a.ptr + j * sa for a in ins[:n] for j in range(batch)]
        pc = [c.ptr + j * sc for c in outs for j in range(batch)]
    ctx = lane.ctx
    lib = _lib(ctx)
    store = ctx.modules.get(("store_ptrs", _PTR_SLOTS), lambda: (_PTR_SRC, "lf_store_ptrs", "pi" + "Q" * _PTR_SLOTS))
    compute, alpha, beta = _compute_type(lib.cublas, dtype)
    tid = _CUDA_TYPE[C.dname(dtype)]
    pool = lib.blas_pool()
    cb = pool.library.mod
    mem = ctx.memory
    for s in range(0, len(pc), MAX_GROUP):
        cnt = min(MAX_GROUP, len(pc) - s)
        words = pa[s:s + cnt] + pb[s:s + cnt] + pc[s:s + cnt]
        arr = mem.raw_alloc(len(words) * 8, lane.stream, "matmul")
        try:
            if mem.capture is not None:
                # Being captured into a graph: the addresses are fixed, so the array is written once
                # now and the graph has no pointer kernel to run at every launch.
                upload_for_graph(mem, arr, np.array(words, np.uint64), "grouped matmul pointers")
            else:
                store.launch_prefix(lane.handle, (1, 1, 1), (_PTR_SLOTS, 1, 1), (arr, len(words), *words))
            with pool.use(lane) as (handle, _):
                cb.gemm_batched_ex(handle, 0, 0, N, M, K, alpha.ctypes.data, arr, tid, N, arr + cnt * 8, tid, K,
                                   beta.ctypes.data, arr + 2 * cnt * 8, tid, N, cnt, compute, -1)
        finally:
            mem.raw_free(arr, lane.stream)


def _build_int(dtype):
    T = C.compute(dtype)
    acc = "bool" if dtype == dt.bool_ else T
    step = "acc = acc || (x && y);" if dtype == dt.bool_ else f"acc = lf_wadd<{T}>(acc, lf_wmul<{T}>(x, y));"
    st = C.storage(dtype)
    src = (f'extern "C" __global__ void lf_imatmul({st}* __restrict__ c, const {st}* __restrict__ a, long long sa, '
           f"const {st}* __restrict__ b, long long sb, long long M, long long N, long long K, long long total) {{\n"
           "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;"
           " i += (long long)blockDim.x * gridDim.x) {\n"
           "    long long j = i % N, r = (i / N) % M, bt = i / (M * N);\n"
           "    const " + st + "* ap = a + bt * sa + r * K; const " + st + "* bp = b + bt * sb + j;\n"
           f"    {acc} acc = 0;\n"
           f"    for (long long k = 0; k < K; ++k) {{ {T} x = ap[k]; {T} y = bp[k * N]; {step} }}\n"
           "    c[i] = acc;\n  }\n}\n")
    return src, "lf_imatmul", "ppqpqqqqq"


def _int_matmul(lane, dtype, pa, sa, pb, sb, pc, M, N, K, batch) -> None:
    total = batch * M * N
    kern = lane.ctx.modules.get(("imatmul", dtype), lambda: _build_int(dtype))
    kern.launch(lane.handle, grid_1d(lane.ctx, total), (256, 1, 1), (pc, pa, sa, pb, sb, M, N, K, total))
