"""Probe (GPU): can cuSOLVER dense calls be captured into a CUDA graph (stream capture, relaxed mode)?
For each routine laneflow uses, on a fresh handle: capture without any earlier call, then run it once
uncaptured and capture again (a library that sets itself up lazily on first use), then launch the
graph and compare with numpy. Prints one line per routine and attempt; after a failed capture the
routine's second attempt is skipped (the eager call after a failed syevd capture failed too).

On the H200 (2026-11-30, cuSOLVER of CUDA 13; docs/perf/probe-solver-capture-h200-2026-11-30.txt):
potrf+potrs, getrf+getrs, geqrf and geqrf+orgqr capture and replay correctly; gesvd and syevd fail
capture (INTERNAL_ERROR, EXECUTION_FAILED), so laneflow refuses to capture eigh and svd and replays
those plans as commands.

Issue 18 adds the batched routines laneflow's small-matrix path uses (``backends/cuda/linalg_batched.py``),
on a batch of 4: cuSOLVER potrfBatched, syevjBatched and gesvdjBatched (Jacobi, with their params
objects), and cuBLAS getrfBatched + getrsBatched and matinvBatched (pointer arrays in device memory).
Record the syevjBatched and gesvdjBatched lines in ``linalg_batched.BATCHED_CAPTURES`` (eigh and svd
on the batched path stop forcing a compiled function onto commands when both attempts capture and
match numpy).

    python tools/probe_solver_capture.py
"""

from __future__ import annotations

import numpy as np
from cuda.bindings import driver as cu
from nvmath.bindings import cublas, cusolver, cusolverDn as sv

import laneflow as lf
from laneflow.backends.cuda.driver import check



def main(n: int = 8) -> None:
    s = lf.new_stream(lf.gpu, lanes=1)
    lane = s.lanes[0]
    ctx = lane.ctx
    st = lane.stream
    mem = ctx.memory
    rng = np.random.default_rng(0)
    a0 = rng.standard_normal((n, n))
    spd = a0 @ a0.T + n * np.eye(n)
    rhs = rng.standard_normal(n)

    def put(x):
        x = np.ascontiguousarray(x)
        p = mem.raw_alloc(max(x.nbytes, 8), mem.free_stream, "probe")
        check(cu.cuMemcpyHtoD(p, x.ctypes.data, x.nbytes), "cuMemcpyHtoD")
        return p

    def get(p, shape):
        out = np.empty(shape)
        check(cu.cuMemcpyDtoH(out.ctypes.data, p, out.nbytes), "cuMemcpyDtoH")
        return out

    A, B = put(spd), put(rhs)
    work = mem.raw_alloc(1 << 24, mem.free_stream, "probe")
    info = mem.raw_alloc(64, mem.free_stream, "probe")
    ipiv = mem.raw_alloc(8 * n, mem.free_stream, "probe")
    Wv = mem.raw_alloc(8 * n, mem.free_stream, "probe")
    S = mem.raw_alloc(8 * n, mem.free_stream, "probe")
    T = mem.raw_alloc(8 * n * n, mem.free_stream, "probe")
    X = mem.raw_alloc(8 * n, mem.free_stream, "probe")
    tau = mem.raw_alloc(8 * n, mem.free_stream, "probe")
    ctx.synchronize()
    LOW = int(cublas.FillMode.LOWER)
    lw = 1 << 21  # doubles of workspace (16 MiB)

    def reset(h):
        check(cu.cuMemcpyDtoDAsync(T, A, 8 * n * n, st), "cuMemcpyDtoDAsync")
        check(cu.cuMemcpyDtoDAsync(X, B, 8 * n, st), "cuMemcpyDtoDAsync")

    routines = {
        "potrf+potrs": (lambda h: (reset(h), sv.dpotrf(h, LOW, n, T, n, work, lw, info),
                                   sv.dpotrs(h, LOW, n, 1, T, n, X, n, info)),
                        lambda: get(X, (n,)), np.linalg.solve(spd, rhs)),
        "getrf+getrs": (lambda h: (reset(h), sv.dgetrf(h, n, n, T, n, work, ipiv, info),
                                   sv.dgetrs(h, 0, n, 1, T, n, ipiv, X, n, info)),
                        lambda: get(X, (n,)), np.linalg.solve(spd, rhs)),
        "geqrf": (lambda h: (reset(h), sv.dgeqrf(h, n, n, T, n, tau, work, lw, info)),
                  lambda: np.abs(np.diag(get(T, (n, n)))), np.abs(np.diag(np.linalg.qr(spd)[1]))),
        "geqrf+orgqr": (lambda h: (reset(h), sv.dgeqrf(h, n, n, T, n, tau, work, lw, info),
                                   sv.dorgqr(h, n, n, n, T, n, tau, work, lw, info)),
                        lambda: np.abs(get(T, (n, n))), np.abs(np.linalg.qr(spd.T)[0].T)),
        "gesvd": (lambda h: (reset(h), sv.dgesvd(h, ord("N"), ord("N"), n, n, T, n, S, 0, n, 0, n, work, lw, 0, info)),
                  lambda: get(S, (n,)), np.linalg.svd(spd, compute_uv=False)),
        "syevd": (lambda h: (reset(h), sv.dsyevd(h, int(cusolver.EigMode.NOVECTOR), LOW, n, T, n,
                                                 Wv, work, lw, info)),
                  lambda: get(Wv, (n,)), np.linalg.eigvalsh(spd)),
    }
    batched, outputs = _batched_routines(n, spd, rhs, put, get, mem, work, lw, st)
    routines = {**batched, **routines}  # before syevd: a failed syevd capture broke the next eager call
    for name, (call, read, want) in routines.items():
        lib = cublas if name.startswith("cublas") else sv
        for warm in (False, True):
            h = lib.create()
            lib.set_stream(h, lane.handle)
            try:
                if warm:
                    call(h)
                    check(cu.cuStreamSynchronize(st), "cuStreamSynchronize")
                check(cu.cuStreamBeginCapture(st, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED), "cuStreamBeginCapture")
                err = None
                try:
                    call(h)
                except Exception as e:  # noqa: BLE001
                    err = e
                cerr, graph = cu.cuStreamEndCapture(st)
                if err is not None or int(cerr):
                    print(f"{name:12s} warm={warm!s:5s}: capture failed: {err or cerr!r}")
                    if graph is not None and not int(cerr):
                        cu.cuGraphDestroy(graph)
                    break  # the stream may be unusable after a failed capture: next routine
                ex = check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
                check(cu.cuMemsetD8Async(X, 0, 8 * n, st), "cuMemsetD8Async")
                check(cu.cuMemsetD8Async(Wv, 0, 8 * n, st), "cuMemsetD8Async")
                check(cu.cuMemsetD8Async(S, 0, 8 * n, st), "cuMemsetD8Async")
                for p, nbytes in outputs:
                    check(cu.cuMemsetD8Async(p, 0, nbytes, st), "cuMemsetD8Async")
                check(cu.cuGraphLaunch(ex, st), "cuGraphLaunch")
                check(cu.cuStreamSynchronize(st), "cuStreamSynchronize")
                good = np.allclose(read(), want, rtol=1e-9)
                print(f"{name:12s} warm={warm!s:5s}: captured; the graph's result matches numpy: {good}")
                cu.cuGraphExecDestroy(ex)
                cu.cuGraphDestroy(graph)
            finally:
                lib.destroy(h)
    s.close()


def _batched_routines(n, spd, rhs, put, get, mem, work, lw, stream, batch: int = 4) -> tuple[dict, list]:
    """The batched routines of laneflow's small-matrix path, on ``batch`` copies of ``spd`` (symmetric, so
    its column-major and row-major layouts agree), and the outputs to zero before each graph launch (so
    a graph that did nothing cannot pass on the warm-up's results). Each call resets its inputs first,
    inside the capture."""
    st_free = mem.free_stream
    A = put(np.stack([spd] * batch))
    R = put(np.stack([rhs] * batch))
    T = mem.raw_alloc(8 * n * n * batch, st_free, "probe")
    X = mem.raw_alloc(8 * n * batch, st_free, "probe")
    C = mem.raw_alloc(8 * n * n * batch, st_free, "probe")
    W = mem.raw_alloc(8 * n * batch, st_free, "probe")
    U = mem.raw_alloc(8 * n * n * batch, st_free, "probe")
    V = mem.raw_alloc(8 * n * n * batch, st_free, "probe")
    info = mem.raw_alloc(4 * batch, st_free, "probe")
    ipiv = mem.raw_alloc(4 * n * batch, st_free, "probe")
    check(cu.cuStreamSynchronize(st_free), "cuStreamSynchronize (probe buffers)")
    t_arr = put(np.array([T + 8 * n * n * i for i in range(batch)], np.uint64))
    x_arr = put(np.array([X + 8 * n * i for i in range(batch)], np.uint64))
    c_arr = put(np.array([C + 8 * n * n * i for i in range(batch)], np.uint64))
    syevj, gesvdj = sv.create_syevj_info(), sv.create_gesvdj_info()
    host_info = np.zeros(1, np.int32)
    LOW, VEC = int(cublas.FillMode.LOWER), int(cusolver.EigMode.VECTOR)

    def reset(h):
        check(cu.cuMemcpyDtoDAsync(T, A, 8 * n * n * batch, stream), "cuMemcpyDtoDAsync")
        check(cu.cuMemcpyDtoDAsync(X, R, 8 * n * batch, stream), "cuMemcpyDtoDAsync")

    solve = np.stack([np.linalg.solve(spd, rhs)] * batch)
    evals = np.stack([np.linalg.eigvalsh(spd)] * batch)
    svals = np.stack([np.linalg.svd(spd, compute_uv=False)] * batch)
    out = {
        "potrfBatched": (lambda h: (reset(h), sv.dpotrf_batched(h, LOW, n, t_arr, n, info, batch)),
                         lambda: np.abs(np.diagonal(get(T, (batch, n, n)), axis1=1, axis2=2)),
                         np.stack([np.abs(np.diag(np.linalg.cholesky(spd)))] * batch)),
        "syevjBatched": (lambda h: (reset(h), sv.dsyevj_batched(h, VEC, LOW, n, T, n, W, work, lw, info, syevj, batch)),
                         lambda: get(W, (batch, n)), evals),
        "gesvdjBatched": (lambda h: (reset(h), sv.dgesvdj_batched(h, VEC, n, n, T, n, W, U, n, V, n, work, lw, info,
                                                                  gesvdj, batch)),
                          lambda: get(W, (batch, n)), svals),
        "cublas getrf+getrsBatched": (lambda h: (reset(h), cublas.dgetrf_batched(h, n, t_arr, n, ipiv, info, batch),
                                                 cublas.dgetrs_batched(h, 0, n, 1, t_arr, n, ipiv, x_arr, n,
                                                                       host_info.ctypes.data, batch)),
                                      lambda: get(X, (batch, n)), solve),
        "cublas matinvBatched": (lambda h: (reset(h), cublas.dmatinv_batched(h, n, t_arr, n, c_arr, n, info, batch)),
                                 lambda: get(C, (batch, n, n)), np.stack([np.linalg.inv(spd)] * batch)),
    }
    return out, [(p, 8 * n * n * batch) for p in (T, C, U, V)] + [(p, 8 * n * batch) for p in (X, W)]


if __name__ == "__main__":
    main()
