"""Where the host time of an uncached chain of tiny adds with fusion off goes (bench dispatch's row that
fusion cannot shrink): per-add time, its split into building and lf.eval, and cProfile by own time.

    python tools/profile_chain.py [gpu|cpu]
"""
import cProfile
import io
import pstats
import sys
import time

import numpy as np
import laneflow as lf
from laneflow.graph import fusion, eval_cache
dev = lf.Device(sys.argv[1] if len(sys.argv) > 1 else "gpu")
st = lf.new_stream(dev, lanes=1)
x = lf.array(np.ones(16, np.float32), stream=st); lf.eval(x)
fusion.set_enabled(False)
def chain(n):
    with eval_cache.bypass(), lf.stream(st):
        y = x
        for _ in range(n):
            y = y + x
        lf.eval(y)
    st.synchronize()
chain(100)
for n in (2000,):
    t = time.perf_counter(); chain(n); dt = time.perf_counter() - t
    print(f"chain of {n}: {dt / n * 1e6:.1f} us per add")
    t = time.perf_counter()
    with lf.stream(st):
        y = x
        for _ in range(n):
            y = y + x
    t1 = time.perf_counter()
    with eval_cache.bypass():
        lf.eval(y)
    st.synchronize()
    print(f"build {(t1 - t) / n * 1e6:.2f} us, eval {(time.perf_counter() - t1) / n * 1e6:.2f} us per add")
p = cProfile.Profile(); p.enable(); chain(2000); p.disable()
s = io.StringIO(); pstats.Stats(p, stream=s).sort_stats("tottime").print_stats(40); print(s.getvalue()[:9000])
