"""Per-op host time of a chain of N tiny adds on the GPU, with the commands it issued (lf.stats()),
fusion on and off: tells whether a chain fused, and what an op costs either way."""
import gc
import sys
import time

import numpy as np

import laneflow as lf
from laneflow.graph import fusion

if "--peers" in sys.argv:  # as `bench dispatch --peers ...` runs: the peers' modules loaded (a big heap)
    for name in ("torch", "jax", "cupy"):
        try:
            __import__(name)
        except ImportError:
            pass
if "--heap" in sys.argv:  # or a stand-in: a million long-lived tracked objects
    _heap = [{"k": i} for i in range(1_000_000)]
    gc.collect()
gc_time = [0.0, 0]


def _gc_cb(phase, info, t=[0.0]):
    if phase == "start":
        t[0] = time.perf_counter()
    else:
        gc_time[0] += time.perf_counter() - t[0]
        gc_time[1] += info["generation"] == 2


gc.callbacks.append(_gc_cb)
print("tracked objects", len(gc.get_objects()))
dev = lf.gpu if lf.gpu_available() else lf.cpu
for on in (True, False):
    fusion.set_enabled(on)
    for n in (2000, 10000):
        s = lf.new_stream(dev, lanes=1)
        x0 = lf.array(np.zeros(16, np.float32), stream=s)
        lf.eval(x0)
        ts = []
        gc_time[:] = [0.0, 0]
        for r in range(4):
            s.synchronize()
            before = lf.stats()
            t = time.perf_counter()
            with lf.stream(s):
                x = x0
                for _ in range(n):
                    x = x + 1.0
            t1 = time.perf_counter()
            lf.async_eval(x)
            t2 = time.perf_counter()
            s.synchronize()
            t3 = time.perf_counter()
            after = lf.stats()
            ts.append((t3 - t, t1 - t, t2 - t1, t3 - t2))
        ok = float(np.asarray(x)[0]) == n
        cmds = {k: after[k] - before[k] for k in after if isinstance(after[k], (int, float)) and after[k] != before[k]}
        best = min(ts)
        print(f"fusion={on} n={n}: {best[0] / n * 1e6:.2f} us/op (build {best[1] / n * 1e6:.2f}, eval {best[2] / n * 1e6:.2f},"
              f" sync {best[3] / n * 1e6:.2f}) ok={ok} gc {gc_time[0] / 4 * 1e3:.1f} ms/run, {gc_time[1]} full;"
              f" stats delta {cmds}", flush=True)
        s.close()
