"""Probe (GPU): E independent same-shape GEMMs as one call. Compares, with CUDA events on one stream:
cuBLASLt strided batch over stacked operands (the fused limit), cuBLAS legacy cublasGemmBatchedEx
(pointer arrays), and E separate cuBLASLt calls; checks each against numpy. Then a
cProfile of the eager experts step on the real driver. Used to choose how laneflow groups matmuls.

    python tools/probe_grouped.py
"""

from __future__ import annotations

import cProfile
import pstats
import time

import ml_dtypes
import numpy as np
from cuda.bindings import driver as cu

import laneflow as lf
from laneflow.backends.cuda.driver import check
from laneflow.backends.cuda.matmul import _lib

CASES = [(32, 16, 4096, 1024, "bfloat16"), (16, 64, 1024, 1024, "bfloat16"), (64, 256, 256, 256, "float32")]
TYPE = {"bfloat16": 14, "float32": 0}  # cudaDataType_t


def ptr(a):
    return a._data.buffer.data.ptr


def timed(lane, fn, reps=20):
    fn()
    cu.cuStreamSynchronize(lane.stream)
    e0, e1 = check(cu.cuEventCreate(0), "ev"), check(cu.cuEventCreate(0), "ev")
    best = []
    for _ in range(5):
        check(cu.cuEventRecord(e0, lane.stream), "rec")
        for _ in range(reps):
            fn()
        check(cu.cuEventRecord(e1, lane.stream), "rec")
        check(cu.cuEventSynchronize(e1), "sync")
        best.append(check(cu.cuEventElapsedTime(e0, e1), "el") * 1e3 / reps)
    return min(best)


def case(E, M, K, N, dname):
    rng = np.random.default_rng(0)
    npdt = ml_dtypes.bfloat16 if dname == "bfloat16" else np.float32
    xs = rng.standard_normal((E, M, K)).astype(npdt)
    ws = (rng.standard_normal((E, K, N)) / np.sqrt(K)).astype(npdt)
    ref = np.matmul(xs.astype(np.float32), ws.astype(np.float32))
    st = lf.new_stream(lf.gpu, lanes=1)
    lane = st.lanes[0]
    X = [lf.array(x, stream=st) for x in xs]
    W = [lf.array(w, stream=st) for w in ws]
    C = [lf.zeros((M, N), lf.float32 if dname == "float32" else lf.bfloat16, stream=st) for _ in range(E)]
    XS, WS = lf.array(xs, stream=st), lf.array(ws, stream=st)
    lf.eval(*X, *W, *C, XS, WS)
    st.synchronize()
    lib = _lib(lane.ctx)
    cublas = lib.cublas
    dt = np.dtype(npdt)
    rows = {}
    # fused limit: strided batch over stacked operands (laneflow's own lf.matmul path)
    CS = lf.zeros((E, M, N), lf.float32 if dname == "float32" else lf.bfloat16, stream=st)
    lf.eval(CS)
    p = lib.plan(dt, M, N, K, E, M * K, K * N)
    rows["lt strided (stacked)"] = timed(lane, lambda: lib.run(lane, p, ptr(XS), ptr(WS), ptr(CS)))
    # E separate calls
    p1 = lib.plan(dt, M, N, K, 1, 0, 0)
    rows["lt x E calls"] = timed(lane, lambda: [lib.run(lane, p1, ptr(X[i]), ptr(W[i]), ptr(C[i])) for i in range(E)], 5)
    # pointer arrays on the device
    parr = lambda arrs: lf.array(np.array([ptr(a) for a in arrs], np.uint64), stream=st)
    PA, PB, PC = parr(W), parr(X), parr(C)  # column-major: A' = our B (w), B' = our A (x)
    lf.eval(PA, PB, PC)
    st.synchronize()

    def check_out(name):
        cu.cuStreamSynchronize(lane.stream)
        got = np.stack([np.asarray(c).astype(np.float32) for c in C])
        err = float(np.max(np.abs(got - ref)))
        for c in C:  # scrub for the next variant
            pass
        return err

    errs = {}
    # cuBLAS legacy gemm_batched_ex
    try:
        from nvmath.bindings import cublas as cb
        h = cb.create()
        cb.set_stream(h, int(lane.stream))
        alpha, beta = np.ones(1, np.float32), np.zeros(1, np.float32)
        tid = TYPE[dname]
        def run_cb():
            cb.gemm_batched_ex(h, 0, 0, N, M, K, alpha.ctypes.data, ptr(PA), tid, N, ptr(PB), tid, K,
                               beta.ctypes.data, ptr(PC), tid, N, E, int(cublas.ComputeType.COMPUTE_32F), -1)
        rows["cublas gemmBatchedEx"] = timed(lane, run_cb)
        errs["cublas gemmBatchedEx"] = check_out("cb")
    except Exception as e:  # noqa: BLE001
        rows["cublas gemmBatchedEx"] = f"failed: {type(e).__name__}: {e}"[:160]
    print(f"\n{E} x ({M}x{K} @ {K}x{N}) {dname}")
    for k, v in rows.items():
        print(f"  {k:24s} {v if isinstance(v, str) else f'{v:8.1f} us'}  {'' if k not in errs else f'max err {errs[k]:.2e}'}")
    st.close()


def profile_eager():
    E, M, K, N = 32, 16, 4096, 1024
    rng = np.random.default_rng(0)
    for lanes in (1, 4):
        st = lf.new_stream(lf.gpu, lanes=lanes)
        with lf.stream(st):
            args = [lf.array(rng.standard_normal((M, K)).astype(ml_dtypes.bfloat16)) for _ in range(E)] + \
                   [lf.array(rng.standard_normal((K, N)).astype(ml_dtypes.bfloat16)) for _ in range(E)]
            lf.eval(*args)
            def work():
                y = [args[i] @ args[E + i] for i in range(E)]
                lf.async_eval(y)
                return y
            for _ in range(5):
                work()
            st.synchronize()
            t = time.perf_counter(); n = 50
            for _ in range(n):
                work()
                st.synchronize()
            full = (time.perf_counter() - t) / n
            t = time.perf_counter()
            for _ in range(n):
                t0 = time.perf_counter(); work(); t1 = time.perf_counter()
                st.synchronize()
            hostpart = t1 - t0
            tb = time.perf_counter(); [args[i] @ args[E + i] for i in range(E)]; tbuild = time.perf_counter() - tb
            st.synchronize()
            print(f"\neager experts {lanes} lane(s): {full*1e6:.0f} us per step incl sync; host (build+eval) {hostpart*1e6:.0f} us; graph build only {tbuild*1e6:.0f} us")
            if lanes == 4:
                pr = cProfile.Profile(); pr.enable()
                for _ in range(30):
                    work(); st.synchronize()
                pr.disable()
                pstats.Stats(pr).sort_stats("tottime").print_stats(22)
        st.close()


if __name__ == "__main__":
    from nvmath.bindings import cublasLt
    print("cublasLt version", cublasLt.get_version())
    for c in CASES:
        case(*c)
    profile_eager()
