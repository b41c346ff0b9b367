"""Where a compiled call's time goes on the GPU: host time per call (no sync), device time per call,
and a cProfile of the host part (with --profile). Usage:

    python tools/graph_probe.py [experts|experts16|experts64|tiny] [calls] [branches] [--profile]

experts: 32 x (16x4096 @ 4096x1024) bf16; experts16: 16 x (64x1024 @ 1024x1024) bf16; experts64:
64 x (256x256 @ 256x256) float32 (the three compile targets of `bench experts`)."""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import numpy as np

import laneflow as lf

which = sys.argv[1] if len(sys.argv) > 1 else "experts"
if len(sys.argv) > 3 and sys.argv[3].isdigit():  # most parallel branches per graph (default laneflow.backends.cuda.cudagraph.capture.MAX_BRANCHES)
    import laneflow.backends.cuda.cudagraph.capture as _g

    _g.MAX_BRANCHES = int(sys.argv[3])
calls = int(sys.argv[2]) if len(sys.argv) > 2 else 200
rng = np.random.default_rng(0)
s = lf.new_stream(lf.gpu, lanes=4)
with lf.stream(s):
    if which.startswith("experts"):
        E, M, K, N = {"experts": (32, 16, 4096, 1024), "experts16": (16, 64, 1024, 1024),
                      "experts64": (64, 256, 256, 256)}[which]
        dt = lf.float32 if which == "experts64" else lf.bfloat16
        xs = [lf.array(rng.standard_normal((M, K)).astype(np.float32)).astype(dt) for _ in range(E)]
        ws = [lf.array((rng.standard_normal((K, N)) / 64).astype(np.float32)).astype(dt) for _ in range(E)]
        args = xs + ws
        f = lf.compile(lambda *a: [a[i] @ a[E + i] for i in range(E)])
    else:
        args = [lf.array(rng.standard_normal(16).astype(np.float32))]
        f = lf.compile(lambda x: x + 1.0)
    lf.eval(*args)
    for _ in range(5):
        out = f(*args)
    lf.eval(out)
    print("stats", f.stats())
    s.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        out = f(*args)
    host = (time.perf_counter() - t) / calls
    s.synchronize()
    wall = (time.perf_counter() - t) / calls
    # device time of one call, alone
    best = 1e9
    for _ in range(20):
        s.synchronize()
        t = time.perf_counter()
        out = f(*args)
        s.synchronize()
        best = min(best, time.perf_counter() - t)
    print(f"{which}: host {host * 1e6:.1f} us/call, wall {wall * 1e6:.1f} us/call (pipelined), one call synced {best * 1e6:.1f} us")
    # device time of the graph alone: its launches back to back between two events
    from probe_compiled_loop import graph_alone_us

    print(f"{which}: graph alone {graph_alone_us(f, s):.1f} us/launch on the device")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        out = f(*args)
    pr.disable()
    s.synchronize()
    if "--profile" in sys.argv:
        pstats.Stats(pr).sort_stats("tottime").print_stats(18)
