"""Probe (GPU): where the device policy loses solve throughput (issue 4: 0.90x of the stream policy at
16 lanes in `bench handles`). Times, on one host thread with bare nvmath calls (as `bench handles`):

1. host cost of a stream switch alone: ``cusolverDnSetStream`` and ``cublasSetStream`` alternating
   between two streams, against setting the same stream again;
2. host cost of one n=64 LU solve (``dgetrf`` + ``dgetrs``) when the handle stays on one stream,
   when it switches stream before every solve (the device policy under round-robin), and with one
   handle per stream (the stream policy);
3. the alternative the device policy could use instead of switching: the handle stays on its own
   stream and each solve is ordered by events (record on the lane, wait on the handle's stream, solve,
   record, the lane waits);
4. throughput of 1024 solves round-robin over 16 streams for 2 and 3 and the stream policy.

    python tools/probe_solver_policy.py
"""

from __future__ import annotations

import time

import numpy as np
from cuda.bindings import driver as cu
from nvmath.bindings import cublas, cusolverDn as sv

import laneflow as lf
from laneflow.backends.cuda.driver import check



def per_call(fn, calls=256, reps=21) -> float:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        for i in range(calls):
            fn(i)
        ts.append((time.perf_counter() - t) / calls)
    return float(np.median(ts)) * 1e6


def main(n: int = 64, lanes: int = 16, solves: int = 1024) -> None:
    s = lf.new_stream(lf.gpu, lanes=lanes)
    ctx = s.lanes[0].ctx
    streams = [int(lane.stream) for lane in s.lanes]
    rng = np.random.default_rng(0)
    m = rng.standard_normal((n, n)) + n * np.eye(n)
    rhs = rng.standard_normal(n)
    mem = ctx.memory

    def put(a):
        a = np.ascontiguousarray(a)
        p = mem.raw_alloc(a.nbytes, mem.free_stream, "probe")
        check(cu.cuMemcpyHtoD(p, a.ctypes.data, a.nbytes), "cuMemcpyHtoD")
        return p

    pm, prhs = put(m), put(rhs)
    lu = [mem.raw_alloc(n * n * 8, mem.free_stream, "probe") for _ in streams]
    x = [mem.raw_alloc(n * 8, mem.free_stream, "probe") for _ in streams]
    ipiv = [mem.raw_alloc(n * 4, mem.free_stream, "probe") for _ in streams]
    info = [mem.raw_alloc(4, mem.free_stream, "probe") for _ in streams]
    hs = sv.create()
    hb = cublas.create()
    lwork = sv.dgetrf_buffer_size(hs, n, n, lu[0], n)
    ws = [mem.raw_alloc(lwork * 8, mem.free_stream, "probe") for _ in streams]
    per_stream = [sv.create() for _ in streams]
    for h, st in zip(per_stream, streams):
        sv.set_stream(h, st)
    ctx.synchronize()
    print(f"n={n}, {lanes} streams, {solves} solves")

    # 1. a stream switch alone
    a, b = streams[0], streams[1]
    print(f"cusolverDnSetStream same stream   {per_call(lambda i: sv.set_stream(hs, a)):7.2f} us")
    print(f"cusolverDnSetStream alternating   {per_call(lambda i: sv.set_stream(hs, b if i & 1 else a)):7.2f} us")
    print(f"cublasSetStream same stream       {per_call(lambda i: cublas.set_stream(hb, a)):7.2f} us")
    print(f"cublasSetStream alternating       {per_call(lambda i: cublas.set_stream(hb, b if i & 1 else a)):7.2f} us")

    def solve(h, k, st):
        check(cu.cuMemcpyDtoDAsync(lu[k], pm, n * n * 8, st), "cuMemcpyDtoDAsync")
        check(cu.cuMemcpyDtoDAsync(x[k], prhs, n * 8, st), "cuMemcpyDtoDAsync")
        sv.dgetrf(h, n, n, lu[k], n, ws[k], ipiv[k], info[k])
        sv.dgetrs(h, 1, n, 1, lu[k], n, ipiv[k], x[k], n, info[k])

    # 2. host cost per solve (few calls per sample: host time, not a full launch queue)
    sv.set_stream(hs, a)
    same = per_call(lambda i: solve(hs, 0, a), calls=32)
    ctx.synchronize()

    def switching(i):
        st = streams[i % lanes]
        sv.set_stream(hs, st)
        solve(hs, i % lanes, st)
    switch = per_call(switching, calls=32)
    ctx.synchronize()
    own = per_call(lambda i: solve(per_stream[i % lanes], i % lanes, streams[i % lanes]), calls=32)
    ctx.synchronize()

    # 3. events instead of switching: the handle stays on its own stream
    home = check(cu.cuStreamCreate(1), "cuStreamCreate")  # non-blocking
    sv.set_stream(hs, int(home))
    evs = [check(cu.cuEventCreate(2), "cuEventCreate") for _ in range(4 * lanes)]  # CU_EVENT_DISABLE_TIMING

    def by_events(i):
        k = i % lanes
        st = streams[k]
        e1, e2 = evs[(2 * i) % len(evs)], evs[(2 * i + 1) % len(evs)]
        check(cu.cuEventRecord(e1, st), "cuEventRecord")
        check(cu.cuStreamWaitEvent(home, e1, 0), "cuStreamWaitEvent")
        check(cu.cuMemcpyDtoDAsync(lu[k], pm, n * n * 8, home), "cuMemcpyDtoDAsync")
        check(cu.cuMemcpyDtoDAsync(x[k], prhs, n * 8, home), "cuMemcpyDtoDAsync")
        sv.dgetrf(hs, n, n, lu[k], n, ws[k], ipiv[k], info[k])
        sv.dgetrs(hs, 1, n, 1, lu[k], n, ipiv[k], x[k], n, info[k])
        check(cu.cuEventRecord(e2, home), "cuEventRecord")
        check(cu.cuStreamWaitEvent(st, e2, 0), "cuStreamWaitEvent")
    events = per_call(by_events, calls=32)
    ctx.synchronize()
    print(f"solve, one handle on one stream    {same:7.2f} us host")
    print(f"solve, one handle switching stream {switch:7.2f} us host (device policy, round-robin)")
    print(f"solve, a handle per stream         {own:7.2f} us host (stream policy)")
    print(f"solve, one handle ordered by events {events:6.2f} us host (no switch; serialises on one stream)")

    # 4. throughput
    def rate(fn):
        best = 0.0
        for _ in range(3):
            ctx.synchronize()
            t = time.perf_counter()
            for i in range(solves):
                fn(i)
            ctx.synchronize()
            best = max(best, solves / (time.perf_counter() - t))
        return best
    sv.set_stream(hs, a)
    r_switch = rate(switching)
    r_own = rate(lambda i: solve(per_stream[i % lanes], i % lanes, streams[i % lanes]))
    sv.set_stream(hs, int(home))
    r_events = rate(by_events)
    print(f"solves/s: switching {r_switch:.0f}, handle per stream {r_own:.0f} "
          f"({r_switch / r_own:.2f}x), events {r_events:.0f} ({r_events / r_own:.2f}x)")
    got = np.empty(n)
    check(cu.cuMemcpyDtoH(got.ctypes.data, x[0], n * 8), "cuMemcpyDtoH")
    print("solve matches numpy:", bool(np.allclose(got, np.linalg.solve(m, rhs))))  # op T on the column-major m^T
    for h in [hs, *per_stream]:
        sv.destroy(h)
    cublas.destroy(hb)


if __name__ == "__main__":
    main()
