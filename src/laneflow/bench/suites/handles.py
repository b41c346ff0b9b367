"""handles: should a BLAS/solver handle belong to a device or to a stream? What each policy costs.

Part 1, the pools themselves (GPU only), for each policy (device, thread, stream; and device with two
cuSOLVER handles per device, ``lf.cuda.set_handles_per_device``) and c lanes in ``counts``: fresh cuBLAS
and cuSOLVER pools drive bare library calls (nvmath bindings) on c lanes of one stream, and the table
gives the handles created, the device memory they and their workspaces hold (``cuMemGetInfo`` before
and after, with laneflow's memory pool trimmed first), the first call (handle creation included), the
throughput of many small GEMMs (cuBLAS) and of many small LU solves (cuSOLVER) issued round-robin over
the lanes (the policies take turns in a rotating order, median of 8 rounds; a shared cuSOLVER handle is
handed over between lanes, as ``lf.linalg`` uses it, so its solves never overlap), and a heavy case:
cuBLAS with a 256 MiB workspace per lane. One host thread drives every policy, so ``thread`` behaves as
``device`` here (one handle per host thread).

Part 2, host cost per call: a bare ``cublasSgemm`` / ``cusolverDnDgetrs`` on a bound handle vs the same
call through ``pool.use(lane)`` (set-stream elided), in a ``with`` block and with the explicit release
laneflow's own ops use, and alternating between two lanes (set-stream and set-workspace every call).

Part 3, through laneflow's ops: c independent GEMMs and c independent solves on c lanes of one stream,
with PyTorch/CuPy/JAX on c streams side by side when they import.

Part 4 (``handles_batched.py``): a batch of small solves as one batched call under one handle per device
against the per-matrix loop on per-lane handles, with torch.linalg.solve and jax.numpy.linalg.solve, and
the looped/batched crossover at n = 32, 64, 128. ``LANEFLOW_BENCH_HANDLES=batched`` runs part 4 alone
(about 50 s on an H200, 2026-12-04), ``=pools,ops`` parts 1-3.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import numpy as np

import laneflow as lf

from ... import dtypes
from ...runtime import handle_pool as hp
from ...runtime.backend import backend_for
from ...runtime.handle_pool import HandlePool
from .. import laneflow_impls as lfi
from ..harness import Case, Impl, Result, skipped, suite
from ..report import print_table
from ..memory import device_used_bytes
from .common import SEED, dtype, f32, normal
from .handles_batched import batched_part

MiB = 1 << 20
HEAVY_WORKSPACE = 256 * MiB
#: The rows of part 1: (label, handle policy, cuSOLVER handles per device under the device policy).
VARIANTS = (("device", "device", 1), ("thread", "thread", 1), ("stream", "stream", 1),
            ("device, 2 cuSOLVER", "device", 2))


def _apply(variant: tuple) -> None:

    _label, policy, solvers = variant
    hp.set_handle_policy(policy)
    hp.set_handles_per_device("cusolverDn", solvers if solvers > 1 else None)


@suite("handles", "library handles per device vs per stream: memory, first call, host cost, throughput",
       needs_gpu=True)
def run(ctx):
    p = ctx.size(quick={"counts": (1, 2), "M": 16, "K": 256, "N": 256, "dtype": "float32", "solve_n": 16,
                        "gemms": 64, "solves": 16, "batch": 64, "n": 8, "lanes": 2, "cross_ns": (8, 16),
                        "cross_batch": 16},
                 cpu=None,
                 gpu={"counts": (1, 2, 4, 8, 16, 32), "M": 64, "K": 1024, "N": 1024, "dtype": "bfloat16",
                      "solve_n": 64, "gemms": 4096, "solves": 1024, "batch": 4096, "n": 32, "lanes": 16,
                      "cross_ns": (32, 64, 128), "cross_batch": 512})
    parts = os.environ.get("LANEFLOW_BENCH_HANDLES", "pools,ops,batched").split(",")
    results: list[Result] = []
    if "pools" in parts and ctx.gpu and lfi.unavailable(ctx.device) is None:
        try:
            results += _pool_part(ctx, p)
        except Exception as e:  # noqa: BLE001 - report, and still run the op-level part
            results.append(Result("handles", "handle policies (bare library calls)", "pools",
                                  error=f"{type(e).__name__}: {e}"[:300]))
    if "ops" in parts:
        results += _ops_part(ctx, p)
    if "batched" in parts:
        results += batched_part(ctx, p)
    return results


# -- part 1 and 2: the pools ---------------------------------------------------------------------

class _Dev:
    """Raw device buffers for the bare library calls (freed at close)."""

    def __init__(self, gctx, lane):
        from cuda.bindings import driver as cu

        self.cu, self.gctx, self.lane = cu, gctx, lane
        self.ptrs: list[int] = []

    def put(self, a: np.ndarray) -> int:
        a = np.ascontiguousarray(a)
        ptr = self.empty(a.nbytes)
        self._ok(self.cu.cuMemcpyHtoD(ptr, a.ctypes.data, a.nbytes))
        return ptr

    def empty(self, nbytes: int) -> int:
        ptr = self.gctx.memory.raw_alloc(max(nbytes, 1), self.lane.stream, "bench handles")
        self._ok(self.cu.cuStreamSynchronize(self.lane.stream))
        self.ptrs.append(ptr)
        return ptr

    def get(self, ptr: int, shape: tuple, dt) -> np.ndarray:
        out = np.empty(shape, dt)
        self._ok(self.cu.cuMemcpyDtoH(out.ctypes.data, ptr, out.nbytes))
        return out

    def close(self) -> None:
        for p in self.ptrs:
            self.gctx.memory.raw_free(p, self.lane.stream)
        self.ptrs.clear()

    @staticmethod
    def _ok(res) -> None:
        if res[0]:
            raise RuntimeError(f"CUDA driver error {res[0]}")


def _gpu_context(device):

    return backend_for(device).context(device.index)


def _free_bytes(gctx) -> int:
    from cuda.bindings import driver as cu

    gctx.synchronize()
    pool = gctx.memory.pool
    cu.cuMemPoolTrimTo(pool, 0)  # give unused pool memory back, so a new workspace shows in cuMemGetInfo
    _err, free, _ = cu.cuMemGetInfo()
    return int(free)


def _libs(gctx, heavy: bool = False):
    from nvmath.bindings import cublas, cusolverDn

    from ...backends.cuda.handles import CublasLibrary, CusolverDnLibrary

    class Heavy(CublasLibrary):
        def workspace_bytes(self, device):
            return HEAVY_WORKSPACE

    blas = HandlePool((Heavy if heavy else CublasLibrary)(gctx, cublas))
    return blas, HandlePool(CusolverDnLibrary(gctx, cusolverDn)), cublas, cusolverDn


def _pool_part(ctx, p) -> list[Result]:

    gctx = _gpu_context(ctx.device)
    rows, results = [], []
    saved = hp._policy, hp._per_device.get("cusolverDn")
    try:
        rates = {c: _throughput(ctx.device, gctx, c, p) for c in p["counts"]}
        for variant in VARIANTS:
            _apply(variant)
            policy = variant[0]
            for c in p["counts"]:
                fig = _probe(ctx.device, gctx, c, p)
                fig.update(rates[c][policy])
                fig["policy"], fig["lanes"] = policy, c
                rows.append(fig)
                r = Result("handles", "handle policies: bare cuBLAS/cuSOLVER calls over c lanes", f"{policy} policy",
                           lanes=c, times=[fig["gemm_s"]], items=p["gemms"], item_name="GEMM", checked=False,
                           note="time = the GEMM batch; figures in extra")
                r.extra.update({k: v for k, v in fig.items() if k not in ("policy", "gemm_s")})
                results.append(r)
        _apply(VARIANTS[0])
        cost = _host_cost(ctx.device, gctx)
    finally:
        hp.set_handle_policy(saved[0])
        hp.set_handles_per_device("cusolverDn", saved[1])
    r = Result("handles", "host cost per library call: bare vs through the pool", "pool", lanes=2, checked=False,
               times=[cost["blas_pool_same_lane_us"] * 1e-6], note="figures in extra (microseconds per call)")
    r.extra.update(cost)
    results.append(r)
    _print_tables(rows, cost, p)
    return results


class _Work:
    """Bare cuBLAS GEMMs (64^3 float32) and LU solves (getrf + getrs, float64) on c lanes of one stream,
    through the given pools; the buffers are one set per lane."""

    def __init__(self, device, gctx, c: int, p):
        self.s = lf.new_stream(device, lanes=c)
        self.lanes = self.s.lanes
        self.dev = dev = _Dev(gctx, self.lanes[0])
        rng = np.random.default_rng(SEED + 11)
        g = self.g = 64
        self.a = rng.standard_normal((g, g)).astype(np.float32)
        self.b = rng.standard_normal((g, g)).astype(np.float32)
        self.pa, self.pb = dev.put(self.a), dev.put(self.b)
        self.pc = [dev.empty(g * g * 4) for _ in self.lanes]
        self.pc_lt = [dev.empty(g * g * 4) for _ in self.lanes]
        n = self.n = p["solve_n"]
        self.m = rng.standard_normal((n, n)) + n * np.eye(n)
        self.rhs = rng.standard_normal(n)
        self.pm, self.prhs = dev.put(self.m), dev.put(self.rhs)
        self.lu = [dev.empty(n * n * 8) for _ in self.lanes]
        self.x = [dev.empty(n * 8) for _ in self.lanes]
        self.info = [dev.empty(4) for _ in self.lanes]
        self.ipiv = [dev.empty(n * 4) for _ in self.lanes]
        self.one, self.zero = np.ones(1, np.float32), np.zeros(1, np.float32)
        self.lwork = None

    def gemm(self, blas, cublas, k: int) -> None:
        g, lane = self.g, self.lanes[k]
        with blas.use(lane) as (h, _ws):
            cublas.sgemm(h, 0, 0, g, g, g, self.one.ctypes.data, self.pa, g, self.pb, g, self.zero.ctypes.data,
                         self.pc[k], g)

    def lt_gemm(self, lt_pool, k: int) -> None:
        """The same GEMM through cuBLASLt, as laneflow's matmul runs it (the stream goes with the call,
        so a shared handle never needs a set-stream; the lane's workspace comes from the pool)."""
        p, lane = self.lt_plan, self.lanes[k]
        e = lt_pool.use(lane)
        try:
            h, (ws, nbytes) = e.current
            self.lt.matmul(h, p.desc, p.alpha.ctypes.data, self.pb, p.a, self.pa, p.b, p.beta.ctypes.data,
                           self.pc_lt[k], p.c, self.pc_lt[k], p.c, p.algo_ptr, ws, nbytes, lane.handle)
        finally:
            e.lock.release()

    def lt_pool(self, gctx):
        """A fresh cuBLASLt pool (its handles keyed by the policy in force at each use) and the plan."""
        from ...backends.cuda.handles import CublasLtLibrary
        from ...backends.cuda.matmul import _lib
    
        lib = _lib(gctx)
        self.lt = lib.lt
        g = self.g  # row-major C = A @ B of the buffers, as matmul.py calls it
        self.lt_plan = lib.plan(dtypes.float32, g, g, g, 1, 0, 0)
        return HandlePool(CublasLtLibrary(gctx, lib.lt))

    def solve(self, solver, sv, k: int) -> None:
        """One LU solve through the pool, as lf.linalg does: under a shared handle (device and thread
        policies) the pool hands the cuSOLVER handle over between lanes, so solves never overlap."""
        from cuda.bindings import driver as cu

        n, lane = self.n, self.lanes[k]
        if self.lwork is None:
            with solver.use(lane) as (h, _):
                self.lwork = sv.dgetrf_buffer_size(h, n, n, self.lu[k], n)
        cu.cuMemcpyDtoDAsync(self.lu[k], self.pm, n * n * 8, lane.stream)
        cu.cuMemcpyDtoDAsync(self.x[k], self.prhs, n * 8, lane.stream)
        with solver.use(lane, self.lwork * 8) as (h, ws):
            sv.dgetrf(h, n, n, self.lu[k], n, ws[0], self.ipiv[k], self.info[k])
            sv.dgetrs(h, 1, n, 1, self.lu[k], n, self.ipiv[k], self.x[k], n, self.info[k])  # op T: buffer = m^T

    def check(self) -> tuple[bool, bool]:
        c = len(self.lanes)
        got = self.dev.get(self.pc[c - 1], (self.g, self.g), np.float32)
        gemm_ok = bool(np.allclose(got, self.b @ self.a, rtol=1e-4, atol=1e-3))  # column-major C = A B
        if getattr(self, "lt", None) is not None:  # cuBLASLt, as laneflow calls it: row-major a @ b
            got = self.dev.get(self.pc_lt[c - 1], (self.g, self.g), np.float32)
            gemm_ok = gemm_ok and bool(np.allclose(got, self.a @ self.b, rtol=1e-4, atol=1e-3))
        solve_ok = bool(np.allclose(self.dev.get(self.x[c - 1], (self.n,), np.float64),
                                    np.linalg.solve(self.m, self.rhs)))
        return gemm_ok, solve_ok

    def close(self) -> None:
        self.dev.close()
        self.s.close()


def _throughput(device, gctx, c: int, p, rounds: int = 8) -> dict[str, dict[str, Any]]:
    """GEMMs/s and solves/s of each variant at c lanes, round-robin over the lanes from one host thread.
    The variants take turns within each round (the median over rounds is reported), so drift of the
    machine hits all of them alike; one pair of pools serves them all (its handles are keyed by policy)."""

    w = _Work(device, gctx, c, p)
    blas, solver, cublas, sv = _libs(gctx)
    gemms, solves = p["gemms"], p["solves"]
    lt = w.lt_pool(gctx)
    samples: dict = {v[0]: {"gemm": [], "lt": [], "solve": []} for v in VARIANTS}
    ok = {}
    try:
        for v in VARIANTS:  # warm-up: every variant's handles and workspaces exist before timing
            _apply(v)
            for k in range(c):
                w.gemm(blas, cublas, k)
                w.lt_gemm(lt, k)
                w.solve(solver, sv, k)
        gctx.synchronize()
        def run_gemms():
            for i in range(gemms):
                w.gemm(blas, cublas, i % c)

        def run_lt():
            for i in range(gemms):
                w.lt_gemm(lt, i % c)

        def run_solves():
            for i in range(solves):
                w.solve(solver, sv, i % c)

        n = len(VARIANTS)
        for r in range(rounds):
            for v in VARIANTS[r % n:] + VARIANTS[:r % n]:  # each variant first in some rounds: no order bias
                _apply(v)
                pol = v[0]
                samples[pol]["gemm"].append(_timed(gctx, run_gemms, 1))
                samples[pol]["lt"].append(_timed(gctx, run_lt, 1))
                samples[pol]["solve"].append(_timed(gctx, run_solves, 1))
                ok[pol] = w.check()
    finally:
        gctx.synchronize()
        blas.close(free_workspaces=True)
        solver.close(free_workspaces=True)
        lt.close(free_workspaces=True)
        w.close()
    out = {}
    for pol, smp in samples.items():
        g, sl = float(np.median(smp["gemm"])), float(np.median(smp["solve"]))
        out[pol] = {"gemm_s": g, "gemms_per_s": round(gemms / g), "solves_per_s": round(solves / sl),
                    "lt_gemms_per_s": round(gemms / float(np.median(smp["lt"]))),
                    "gemm_ok": ok[pol][0], "solve_ok": ok[pol][1]}
    return out


def _probe(device, gctx, c: int, p) -> dict[str, Any]:
    """One policy at c lanes: fresh pools, first calls, memory held, heavy case; then released."""
    w = _Work(device, gctx, c, p)
    lanes = w.lanes
    out: dict[str, Any] = {}
    free0 = _free_bytes(gctx)
    blas, solver, cublas, sv = _libs(gctx)
    try:
        t0 = time.perf_counter()
        w.gemm(blas, cublas, 0)
        gctx.synchronize()
        out["first_call_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
        t0 = time.perf_counter()
        for k in range(len(lanes)):
            w.gemm(blas, cublas, k)
            w.solve(solver, sv, k)
        gctx.synchronize()
        out["first_use_all_lanes_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
        free1 = _free_bytes(gctx)
        out["handles_cublas"], out["handles_cusolver"] = blas.handles(), solver.handles()
        out["held_MiB"] = round((free0 - free1) / MiB, 1)
        out["workspace_MiB"] = round((blas.workspace_bytes() + solver.workspace_bytes()) / MiB, 1)
    finally:
        gctx.synchronize()
        blas.close(free_workspaces=True)
        solver.close(free_workspaces=True)
    rng = np.random.default_rng(SEED + 12)
    out.update(_heavy(device, gctx, w.s, w.dev, rng))
    w.close()
    return out


def _heavy(device, gctx, s, dev, rng) -> dict[str, Any]:
    """cuBLAS with a 256 MiB workspace per lane: one 2048^3 float32 GEMM per lane."""
    g = 2048
    a = dev.put(rng.standard_normal((g, g)).astype(np.float32))
    cs = [dev.empty(g * g * 4) for _ in s.lanes]
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    free0 = _free_bytes(gctx)
    blas, _, cublas, _ = _libs(gctx, heavy=True)
    try:
        t0 = time.perf_counter()
        for k, lane in enumerate(s.lanes):
            with blas.use(lane) as (h, _ws):
                cublas.sgemm(h, 0, 0, g, g, g, one.ctypes.data, a, g, a, g, zero.ctypes.data, cs[k], g)
        gctx.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        held = (free0 - _free_bytes(gctx)) / MiB
    finally:
        gctx.synchronize()
        blas.close(free_workspaces=True)
    return {"heavy_ms": round(ms, 2), "heavy_held_MiB": round(held, 1)}


def _timed(gctx, fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        gctx.synchronize()
        t = time.perf_counter()
        fn()
        gctx.synchronize()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def _host_cost(device, gctx) -> dict[str, float]:
    """Host microseconds per call: bare vs through the pool (same lane, and alternating two lanes)."""
    from cuda.bindings import driver as cu

    s = lf.new_stream(device, lanes=2)
    l0, l1 = s.lanes
    dev = _Dev(gctx, l0)
    g = 8
    pa = dev.put(np.eye(g, dtype=np.float32))
    pc = dev.empty(g * g * 4)
    pm = dev.put(np.eye(g))
    px = dev.put(np.ones(g))
    ipiv = dev.put(np.arange(1, g + 1, dtype=np.int32))
    info = dev.empty(4)
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    blas, solver, cublas, sv = _libs(gctx)
    sgemm, dgetrs = cublas.sgemm, sv.dgetrs
    al, be = one.ctypes.data, zero.ctypes.data
    calls = 64  # few enough that the launch queue never fills: the figures are host time, not GPU time
    out: dict[str, float] = {}
    try:
        hb, hs = cublas.create(), sv.create()
        cublas.set_stream(hb, l0.handle)
        sv.set_stream(hs, l0.handle)

        def bare_blas():
            for _ in range(calls):
                sgemm(hb, 0, 0, g, g, g, al, pa, g, pa, g, be, pc, g)

        def pool_blas():
            use = blas.use
            for _ in range(calls):
                with use(l0) as (h, _w):
                    sgemm(h, 0, 0, g, g, g, al, pa, g, pa, g, be, pc, g)

        def pool_blas_alt():
            use = blas.use
            for i in range(calls):
                with use(l1 if i & 1 else l0) as (h, _w):
                    sgemm(h, 0, 0, g, g, g, al, pa, g, pa, g, be, pc, g)

        def pool_blas_release():  # how laneflow's hot paths call it: no with-protocol calls
            use = blas.use
            for _ in range(calls):
                e = use(l0)
                try:
                    h, _w = e.current
                    sgemm(h, 0, 0, g, g, g, al, pa, g, pa, g, be, pc, g)
                finally:
                    e.lock.release()

        def pool_solver_release():
            use = solver.use
            for _ in range(calls):
                e = use(l0)
                try:
                    h, _w = e.current
                    dgetrs(h, 0, g, 1, pm, g, ipiv, px, g, info)
                finally:
                    e.lock.release()

        def bare_solver():
            for _ in range(calls):
                dgetrs(hs, 0, g, 1, pm, g, ipiv, px, g, info)

        def pool_solver():
            use = solver.use
            for _ in range(calls):
                with use(l0) as (h, _w):
                    dgetrs(h, 0, g, 1, pm, g, ipiv, px, g, info)

        fns = {"blas_bare": bare_blas, "blas_pool_same_lane": pool_blas, "blas_pool_release": pool_blas_release,
               "blas_pool_alternating": pool_blas_alt, "solver_bare": bare_solver,
               "solver_pool_same_lane": pool_solver, "solver_pool_release": pool_solver_release}
        for fn in fns.values():
            fn()  # warm-up (first use, workspace)
        samples: dict = {k: [] for k in fns}
        for _ in range(101):  # interleaved, so drift hits every variant alike
            for name, fn in fns.items():
                gctx.synchronize()
                t = time.perf_counter()
                fn()
                samples[name].append((time.perf_counter() - t) / calls)
        for name, ts in samples.items():
            out[f"{name}_us"] = round(float(np.median(ts)) * 1e6, 3)
        for lib in ("blas", "solver"):  # median of the paired differences: robust to drift
            for how, key in (("same_lane", "with"), ("release", "release")):
                d = np.subtract(samples[f"{lib}_pool_{how}"], samples[f"{lib}_bare"])
                out[f"{lib}_overhead_{key}_us"] = round(float(np.median(d)) * 1e6, 3)
        from ...backends.cuda.handles import _Library

        for lib, nbytes in _Library._measured.items():
            out[f"{lib}_handle_MiB_at_create"] = round(nbytes / MiB, 1)
        gctx.synchronize()
        cublas.destroy(hb)
        sv.destroy(hs)
    finally:
        gctx.synchronize()
        blas.close(free_workspaces=True)
        solver.close(free_workspaces=True)
        cu.cuStreamSynchronize(l0.stream)
        dev.close()
        s.close()
    return out


def _print_tables(rows: list[dict], cost: dict, p) -> None:

    headers = ["policy", "lanes", "cuBLAS handles", "cuSOLVER handles", "held MiB", "of which workspaces MiB",
               "first call ms", "first use, all lanes ms", f"{p['gemms']} GEMMs 64^3: GEMM/s",
               "same via cuBLASLt: GEMM/s", f"{p['solves']} LU solves n={p['solve_n']}: solve/s",
               "heavy (256 MiB ws/lane): held MiB", "heavy ms",
               "ok"]
    table = [[r["policy"], r["lanes"], r["handles_cublas"], r["handles_cusolver"], r["held_MiB"], r["workspace_MiB"],
              r["first_call_ms"], r["first_use_all_lanes_ms"], r["gemms_per_s"], r["lt_gemms_per_s"], r["solves_per_s"],
              r["heavy_held_MiB"], r["heavy_ms"], "yes" if r["gemm_ok"] and r["solve_ok"] else "NO"] for r in rows]
    print_table("handles: one handle per device vs per host thread vs per lane (bare library calls, one host "
                "thread, round-robin over the lanes)", headers, table)
    print_table("handles: host cost per library call (microseconds)", list(cost), [[cost[k] for k in cost]])
    _verdict(rows, cost, p)


def _verdict(rows: list[dict], cost: dict, p) -> None:
    lanes = 16 if 16 in p["counts"] else max(p["counts"])
    dev = next((r for r in rows if r["policy"] == "device" and r["lanes"] == lanes), None)
    st = next((r for r in rows if r["policy"] == "stream" and r["lanes"] == lanes), None)
    if dev is None or st is None:
        return
    hd, hs = dev["held_MiB"] - dev["workspace_MiB"], st["held_MiB"] - st["workspace_MiB"]
    mem = hd / hs if hs > 0 else float("nan")
    total = dev["held_MiB"] / st["held_MiB"] if st["held_MiB"] > 0 else float("nan")
    thr_g = dev["gemms_per_s"] / st["gemms_per_s"]
    thr_s = dev["solves_per_s"] / st["solves_per_s"]
    thr_lt = dev["lt_gemms_per_s"] / st["lt_gemms_per_s"]
    two = next((r for r in rows if r["policy"] == "device, 2 cuSOLVER" and r["lanes"] == lanes), None)
    print(f"at {lanes} lanes, device vs stream policy: handle memory {hd:.0f} vs {hs:.0f} MiB = {mem:.3f}x (target <= "
          f"0.125; with the per-lane workspaces {total:.3f}x), GEMM throughput "
          f"{thr_g:.2f}x (cuBLAS legacy API: a set-stream per lane switch; through cuBLASLt, laneflow's matmul: "
          f"{thr_lt:.2f}x) and solve throughput {thr_s:.2f}x (target >= 0.95; a shared cuSOLVER handle runs its "
          f"solves one after another); pool host cost above a bare call, as laneflow's ops use it (explicit "
          f"release) / in a with block: cuBLAS {cost['blas_overhead_release_us']} / "
          f"{cost['blas_overhead_with_us']} us, "
          f"cuSOLVER {cost['solver_overhead_release_us']} / {cost['solver_overhead_with_us']} us (target <= 0.5)")
    if two is not None:
        h2 = two["held_MiB"] - two["workspace_MiB"]
        print(f"device policy with 2 cuSOLVER handles per device (lf.cuda.set_handles_per_device): handle memory "
              f"{h2:.0f} MiB = {h2 / hs if hs > 0 else float('nan'):.3f}x of the stream policy's, solve throughput "
              f"{two['solves_per_s'] / st['solves_per_s']:.2f}x")


# -- part 3: through laneflow's ops, with the peers --------------------------------------------------

def _ops_part(ctx, p) -> list[Result]:
    M, K, N, dt = p["M"], p["K"], p["N"], dtype(p["dtype"])
    rng = np.random.default_rng(SEED + 3)
    results = []
    for c in p["counts"]:
        x = normal(rng, (c, M, K), dt)
        w = normal(rng, (K, N), dt, 1 / np.sqrt(K))
        case = Case("handles", f"c concurrent GEMMs {M}x{K} @ {K}x{N} {dt.name}, c = {p['counts']}",
                    {"x": x, "w": w},
                    np.matmul(f32(x), f32(w)), bytes=(c * (M * K + M * N) + K * N) * dt.itemsize,
                    flops=2 * c * M * K * N, dtype=dt, params={"c": c})
        why = lfi.unavailable(ctx.device)
        rows = [lfi.skipped(case, "laneflow", why)] if why else [
            lfi.guard(case, f"laneflow {c} lanes", c, lambda x=x, w=w, c=c: _lanes(ctx.device, x, w, c))]
        results += ctx.run_case(case, "handles", rows)
    n = p["solve_n"]
    for c in p["counts"]:
        a = rng.standard_normal((c, n, n)) + n * np.eye(n)
        b = rng.standard_normal((c, n, 4))
        case = Case("handles", f"c concurrent solves {n}x{n} float64 (4 right-hand sides), c = {p['counts']}",
                    {"a": a, "b": b}, np.linalg.solve(a, b), dtype=np.float64, rtol=1e-9, params={"c": c})
        why = lfi.unavailable(ctx.device)
        rows = [lfi.skipped(case, "laneflow", why)] if why else [
            lfi.guard(case, f"laneflow {c} lanes", c, lambda a=a, b=b, c=c: _solves(ctx.device, a, b, c))]
        rows += _peer_solves(ctx, case, a, b, c)
        results += dataclasses.replace(ctx, peers=[]).run_case(case, "handles", rows)  # peers are inline here
    return results


def _lanes(device, x, w, c: int) -> Impl:
    before = device_used_bytes(device)
    t0 = time.perf_counter()
    s = lf.new_stream(device, lanes=c)
    args = [lf.array(w, stream=s)] + [lf.array(xi, stream=s) for xi in x]

    def run():
        with lf.stream(s):
            ys = [xi @ args[0] for xi in args[1:]]
        lf.eval(ys)
        return ys
    run()
    first = time.perf_counter() - t0
    after = device_used_bytes(device)
    impl = Impl(f"laneflow {c} lane{'s' if c > 1 else ''}", run, lfi.stacked, lanes=c, close=s.close,
                note="one stream; first run includes stream creation")
    impl.extra = {"first_run_ms": round(first * 1e3, 3),
                  "memory_growth_MiB": None if before is None else round((after - before) / 2**20, 2)}
    return impl


def _solves(device, a, b, c: int) -> Impl:
    s = lf.new_stream(device, lanes=c)
    A = [lf.array(ai, stream=s) for ai in a]
    B = [lf.array(bi, stream=s) for bi in b]
    lf.eval(*A, *B)

    def run():
        ys = [lf.linalg.solve(ai, bi, stream=s) for ai, bi in zip(A, B)]
        lf.eval(ys)
        return ys
    return Impl(f"laneflow {c} lane{'s' if c > 1 else ''}", run, lfi.stacked, lanes=c, close=s.close,
                note=f"handle policy {lf.cuda.handle_policy()}" + ("; each solve checks devInfo (waits for its lane)"
                                                                  if device.type == "gpu" else ""))


def _peer_solves(ctx, case, a, b, c: int) -> list[Impl | Result]:
    """The same solves through the peers that import, one stream each (their own handle designs)."""

    out: list[Impl | Result] = []
    if not ctx.gpu:
        return out
    if "torch" in ctx.peers:
        try:
            import torch

            if not torch.cuda.is_available():
                raise ImportError("no CUDA")
            ta = [torch.from_numpy(ai).cuda() for ai in a]
            tb = [torch.from_numpy(bi).cuda() for bi in b]
            tstreams = [torch.cuda.Stream() for _ in range(c)]

            def run_torch(torch=torch, ta=ta, tb=tb, tstreams=tstreams):
                ys = [None] * c
                cur = torch.cuda.current_stream()
                for k in range(c):
                    tstreams[k].wait_stream(cur)
                    with torch.cuda.stream(tstreams[k]):
                        ys[k] = torch.linalg.solve(ta[k], tb[k])
                for st in tstreams:
                    cur.wait_stream(st)
                return ys
            out.append(Impl(f"torch {c} streams", run_torch, lambda ys: np.stack([y.cpu().numpy() for y in ys]),
                            lanes=c, sync=torch.cuda.synchronize))
        except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
            out.append(skipped(case, "torch", f"{type(e).__name__}: {e}"[:120]))
    if "cupy" in ctx.peers:
        try:
            import cupy as cp

            ca = [cp.asarray(ai) for ai in a]
            cb = [cp.asarray(bi) for bi in b]
            cstreams = [cp.cuda.Stream(non_blocking=True) for _ in range(c)]

            def run_cupy(cp=cp, ca=ca, cb=cb, cstreams=cstreams):
                ys = [None] * c
                for k in range(c):
                    with cstreams[k]:
                        ys[k] = cp.linalg.solve(ca[k], cb[k])
                for st in cstreams:
                    st.synchronize()
                return ys
            out.append(Impl(f"cupy {c} streams", run_cupy, lambda ys: np.stack([cp.asnumpy(y) for y in ys]),
                            lanes=c, sync=lambda: cp.cuda.Device().synchronize()))
        except Exception as e:  # noqa: BLE001
            out.append(skipped(case, "cupy", f"{type(e).__name__}: {e}"[:120]))
    if "jax" in ctx.peers:
        try:
            import jax
            import jax.numpy as jnp

            x64 = getattr(jax, "enable_x64", None)
            if x64 is not None:
                def enable_x64(x64=x64):
                    return x64(True)
            else:
                from jax.experimental import enable_x64
            gpu = [d for d in jax.devices() if d.platform == "gpu"]
            if not gpu:
                raise ImportError("no GPU device in JAX")
            with enable_x64():
                ja = [jax.device_put(jnp.asarray(ai), gpu[0]) for ai in a]
                jb = [jax.device_put(jnp.asarray(bi), gpu[0]) for bi in b]
                solve = jax.jit(jnp.linalg.solve)

            def run_jax(ja=ja, jb=jb, solve=solve, enable_x64=enable_x64):
                with enable_x64():
                    ys = [solve(ai, bi) for ai, bi in zip(ja, jb)]
                    for y in ys:
                        y.block_until_ready()
                return ys
            out.append(Impl("jax jit (its own streams)", run_jax, lambda ys: np.stack([np.asarray(y) for y in ys]),
                            lanes=None))
        except Exception as e:  # noqa: BLE001
            out.append(skipped(case, "jax", f"{type(e).__name__}: {e}"[:120]))
    return out

