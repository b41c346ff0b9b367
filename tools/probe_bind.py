"""Probe (GPU), issue 5's open measurement: how a compiled call should bind an argument that changes
between calls. Two ways exist in ``backends/cuda/cudagraph/binding.py``:

- *staged* (the default up to ``STAGE_LIMIT``): one device copy of the new argument into a fixed
  input buffer, then the same executable graph;
- *updated* (above ``STAGE_LIMIT``): the plan is captured again with the new address and the
  executable is updated in place (``cuGraphExecUpdate``: every kernel node's parameters).

For arguments of several sizes and graphs of several sizes, each call passing a new array, prints the
host time per call and the device-event time per call of both ways (the second by setting
``STAGE_LIMIT`` to 0).

    python tools/probe_bind.py
"""

from __future__ import annotations

import time

import numpy as np

import laneflow as lf
import laneflow.backends.cuda.cudagraph.binding as G
from laneflow.bench.laneflow_impls import laneflow_timer
from laneflow.graph import fusion

fusion.set_enabled(False)  # one graph kernel node per op: ``ops`` chooses the graph's size (2 nodes each)


def one(nbytes: int, ops: int, stage_limit: int, calls: int = 60) -> tuple[float, float, dict]:
    saved = G.STAGE_LIMIT
    G.STAGE_LIMIT = stage_limit
    try:
        s = lf.new_stream(lf.gpu, lanes=2)
        n = max(4, nbytes // 4)
        xs = [lf.array(np.full(n, k, np.float32), stream=s) for k in range(calls + 4)]
        lf.eval(*xs)

        def body(x):
            for _ in range(ops):
                x = x * 1.0001 + 0.5
            return x
        f = lf.compile(body)
        with lf.stream(s):
            for k in range(4):
                out = f(xs[k])
            lf.eval(out)
            s.synchronize()
            t = time.perf_counter()
            for k in range(calls):
                out = f(xs[4 + k])
            host = (time.perf_counter() - t) / calls
            s.synchronize()
            timer = laneflow_timer(s)
            timer.start()
            for k in range(calls):
                out = f(xs[4 + k])
            dev = timer.stop() / calls
            st = f.stats()[0]
        s.close()
        return host * 1e6, dev * 1e6, st
    finally:
        G.STAGE_LIMIT = saved


if __name__ == "__main__":
    print(f"{'arg bytes':>10} {'ops':>5} | {'staged host':>11} {'device':>8} | {'updated host':>12} {'device':>8}")
    for nbytes in (16 << 10, 1 << 20, 16 << 20):
        for ops in (2, 50):
            sh, sd, sst = one(nbytes, ops, 64 << 20)
            uh, ud, ust = one(nbytes, ops, 0)
            print(f"{nbytes:>10} {ops:>5} | {sh:9.1f}us {sd:6.1f}us | {uh:10.1f}us {ud:6.1f}us"
                  f"   (captures {sst['captures']} vs {ust['captures']}, updates {ust['updates']})")
