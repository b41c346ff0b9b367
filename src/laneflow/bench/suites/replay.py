"""replay: host cost of one call of a compiled function, by the size of its graph.

Issue 5's measure: a compiled call should cost at most 2 µs plus 1 µs per graph node on the host. Each
row compiles a chain of N tiny dependent ops (N graph nodes on the GPU) and times only the host: the
timer starts once the device is idle and stops when the last call has been *issued*, without waiting
for the device (a CUDA graph of 1,000 tiny kernels runs longer on the device than it takes to launch).
The median is per call; ``extra`` gives it per node too. With elementwise fusion (on by default;
``LANEFLOW_FUSE=0`` turns it off) the chain's ops fuse into groups of up to 32, so its graph
has fewer nodes than ops; the per-node figure is per op.

A last case measures the per-argument cost: the experts program on tiny matrices (32 x (16x16 @
16x16)), 64 arguments and 32 outputs per call, as ``bench experts`` passes them.
"""

from __future__ import annotations

import time

import numpy as np

import laneflow as lf

from .. import laneflow_impls as lfi
from ..harness import Case, Impl, suite


class HostTimer:
    """Host time from an idle device to the last call issued (the device is not waited for)."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.t0 = 0.0

    def start(self) -> None:
        self.stream.synchronize()
        self.t0 = time.perf_counter()

    def stop(self) -> float:
        return time.perf_counter() - self.t0


def chain(n: int):
    def f(x):
        for _ in range(n):
            x = x * 0.5 + 1.0
        return x
    return f


@suite("replay", "host cost per compiled call, for graphs of 1 to 1000 nodes")
def run(ctx):
    sizes = ctx.size(quick={"n": (1, 10)}, cpu={"n": (1, 100)}, gpu={"n": (1, 100, 1000)})["n"]
    results = []
    for n in sizes:
        x = np.ones(16, np.float32)
        ref = x.copy()
        for _ in range(n):
            ref = ref * np.float32(0.5) + np.float32(1.0)
        # two ops per step: multiply and add
        case = Case("replay", f"compiled chain of {2 * n} tiny ops (16 float32)", {"x": x}, ref,
                    bytes=0, flops=0, items=1, item_name="call", params={"nodes": 2 * n})
        rows = []
        if lfi.unavailable(ctx.device) is None:
            rows.append(lfi.guard(case, "laneflow compiled call (host only)", ctx.lanes,
                                  lambda n=n, x=x, case=case: _compiled(case, ctx.device, ctx.lanes, n, x)))
        results.extend(ctx.run_case(case, "replay", rows))
        for r in results[-len(rows):] if rows else []:
            if r.times:
                r.extra["host_us_per_node"] = round(r.median * 1e6 / (2 * n), 3)
    results.extend(_many_arguments(ctx))
    return results


def _many_arguments(ctx):
    E = 32
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((16, 16)).astype(np.float32) for _ in range(2 * E)]
    ref = [xs[i] @ xs[E + i] for i in range(E)]
    case = Case("replay", f"compiled call with {2 * E} arguments and {E} outputs (experts, 16x16 matrices)",
                {}, ref, bytes=0, flops=0, items=1, item_name="call", params={"arguments": 2 * E, "outputs": E})
    rows = []
    if lfi.unavailable(ctx.device) is None:
        rows.append(lfi.guard(case, "laneflow compiled call (host only)", ctx.lanes,
                              lambda: _compiled_many(case, ctx.device, ctx.lanes, xs, E)))
    return ctx.run_case(case, "replay", rows)


def _compiled_many(case, device, lanes, xs, E) -> Impl:
    s = lf.new_stream(device, lanes=lanes)
    args = [lf.array(x, stream=s) for x in xs]
    lf.eval(*args)
    f = lf.compile(lambda *a: [a[i] @ a[E + i] for i in range(E)])
    with lf.stream(s):
        for _ in range(3):
            lf.eval(*f(*args))

    def run():
        with lf.stream(s):
            return f(*args)

    impl = Impl("laneflow compiled call (host only)", run, to_host=lambda out: [np.asarray(o) for o in out],
                lanes=lanes, sync=s.synchronize, timer=HostTimer(s), close=s.close)
    impl.extra["mode"] = f.stats()[0]["mode"]
    return impl


def _compiled(case, device, lanes, n, x0) -> Impl:
    s = lf.new_stream(device, lanes=lanes)
    x = lf.array(x0, stream=s)
    lf.eval(x)
    f = lf.compile(chain(n))
    with lf.stream(s):
        for _ in range(3):   # trace, then capture (the GPU's graph is made at the second call)
            lf.eval(f(x))

    def run():
        with lf.stream(s):
            return f(x)

    impl = Impl("laneflow compiled call (host only)", run, lanes=lanes, sync=s.synchronize, timer=HostTimer(s),
                close=s.close)
    impl.extra["mode"] = f.stats()[0]["mode"]
    return impl
