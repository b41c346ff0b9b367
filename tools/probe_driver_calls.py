"""Host cost of the driver calls every laneflow command makes, through cuda-bindings, ctypes and the C
shim (``backends/cuda/cshim.c``, what ``backends/cuda/fastcall.py`` uses when it builds), and what a
tiny op costs laneflow (with the shim and with ``LANEFLOW_CSHIM=0``) and torch, on one GPU.

    python tools/probe_driver_calls.py [--n 20000]

Prints one line per call kind: microseconds per call (median of 5 rounds of n calls).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import numpy as np


def rounds(fn, n: int, sync) -> float:
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        fn(n)
        sync()
        ts.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(ts)


def _ctypes():
    """The same calls straight into libcuda through ctypes (what was measured against cuda-bindings)."""
    import ctypes
    from types import SimpleNamespace

    lib = ctypes.CDLL("libcuda.so.1")
    vp, u32, sz, i32 = ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t, ctypes.c_int

    def fn(name, *argtypes):
        f = getattr(lib, name)
        f.argtypes, f.restype = list(argtypes), i32
        return f

    launch = fn("cuLaunchKernel", vp, u32, u32, u32, u32, u32, u32, u32, vp, vp, vp)
    alloc = fn("cuMemAllocFromPoolAsync", ctypes.POINTER(ctypes.c_uint64), sz, vp, vp)
    out = ctypes.c_uint64(0)
    ref = ctypes.byref(out)

    def alloc_async(nbytes, pool, s):
        err = alloc(ref, nbytes, pool, s)
        return err, out.value

    return SimpleNamespace(
        launch=lambda f, gx, gy, gz, bx, by, bz, smem, s, argv: launch(f, gx, gy, gz, bx, by, bz, smem, s, argv, None),
        record=fn("cuEventRecord", vp, vp), alloc=alloc_async, free=fn("cuMemFreeAsync", ctypes.c_uint64, vp))


def calls(n: int) -> None:
    from cuda.bindings import driver as cu

    import laneflow as lf
    from laneflow.backends.cuda import cshim, fastcall
    from laneflow.runtime.backend import backend_for

    ctx = backend_for(lf.gpu).context(0)
    fast, slow = _ctypes(), fastcall._through(cu)
    mod = cshim.load()
    kinds = [("cuda-bindings", slow), ("ctypes", fast)]
    if mod is not None:
        kinds.append(("C shim", fastcall._shim(mod)))
    else:
        print(f"C shim: not built ({cshim.why_not()})")
    st = cu.cuStreamCreate(1)[1]
    h = int(st)
    kern = ctx.modules.get(("probe empty",), lambda: ('extern "C" __global__ void lf_empty(int x) {}\n', "lf_empty", "i"))
    ev = cu.cuEventCreate(2)[1]
    evh = int(ev)
    pool, poolh = ctx.memory.pool, int(ctx.memory.pool)

    def sync():
        cu.cuStreamSynchronize(st)

    for name, c in kinds:
        raw = c is not slow
        fn = int(kern.fn) if raw else kern.fn
        s = h if raw else st
        e = evh if raw else ev
        p = poolh if raw else pool
        argv = kern._argv_addr

        def launch(k):
            for _ in range(k):
                c.launch(fn, 1, 1, 1, 32, 1, 1, 0, s, argv)

        def record(k):
            for _ in range(k):
                c.record(e, s)

        def alloc_free(k):
            for _ in range(k):
                _, ptr = c.alloc(256, p, s)
                c.free(ptr, s)

        for what, f in (("cuLaunchKernel", launch), ("cuEventRecord", record),
                        ("cuMemAllocFromPoolAsync + cuMemFreeAsync", alloc_free)):
            f(100)
            sync()
            print(f"{what:<45} {name:<14} {rounds(f, n, sync):7.2f} us per call", flush=True)


def chain(n: int) -> None:
    import laneflow as lf
    from laneflow.graph import eval_cache, fusion

    fusion.set_enabled(False)
    s = lf.new_stream(lf.gpu, lanes=1)
    x0 = lf.array(np.zeros(16, np.float32), stream=s)
    lf.eval(x0)

    def run(k):
        with eval_cache.bypass():
            x = x0
            with lf.stream(s):
                for _ in range(k):
                    x = x + 1.0
            lf.eval(x)

    run(100)
    print(f"{'laneflow tiny add chain, fusion off, uncached':<45} {'':<14} {rounds(run, n, s.synchronize):7.2f} us per op",
          flush=True)


def torch_chain(n: int) -> None:
    import torch

    x0 = torch.zeros(16, device="cuda")

    def run(k):
        x = x0
        for _ in range(k):
            x = x + 1.0

    run(100)
    print(f"{'torch eager tiny add chain':<45} {'':<14} {rounds(run, n, torch.cuda.synchronize):7.2f} us per op",
          flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--part", default=None)
    a = ap.parse_args()
    if a.part == "calls":
        calls(a.n)
    elif a.part == "chain":
        chain(a.n)
    elif a.part == "torch":
        torch_chain(a.n)
    else:
        import os

        for part, env in (("calls", {}), ("chain", {}), ("chain", {"LANEFLOW_CSHIM": "0"}), ("torch", {})):
            tag = "  (LANEFLOW_CSHIM=0)" if env else "  (C shim if built)"
            p = subprocess.run([sys.executable, __file__, "--part", part, "--n", str(a.n)], capture_output=True,
                               text=True, env={**os.environ, **env})
            for line in (p.stdout + p.stderr).strip().splitlines():
                print(line + (tag if part == "chain" and "us per" in line else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
