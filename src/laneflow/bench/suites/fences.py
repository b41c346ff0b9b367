"""fences: a dependent chain that alternates between two streams, so every hop needs a fence;
the same chain on one stream is the baseline (per hop difference = fence cost)."""

from __future__ import annotations

import numpy as np

import laneflow as lf

from .. import laneflow_impls as lfi
from ..harness import Case, Impl, suite


@suite("fences", "cross-stream dependency cost: a chain ping-ponging between two streams", needs_gpu=True)
def run(ctx):
    n = ctx.size(quick={"n": 100}, cpu=None, gpu={"n": 1000})["n"]
    x = np.zeros(16, np.float32)
    case = Case("fences", f"chain of {n} tiny adds, alternating streams", {"x": x}, x + np.float32(n),
                items=n, item_name="hop", params={"n": n})
    why = lfi.unavailable(ctx.device)
    rows = [lfi.skipped(case, "laneflow", why)] if why else [
        lfi.guard(case, f"laneflow {k} stream(s)", k, lambda k=k: _chain(ctx.device, x, n, k)) for k in (1, 2)]
    return ctx.run_case(case, "fences", rows)


def _chain(device, x0, n: int, nstreams: int) -> Impl:
    streams = [lf.new_stream(device, lanes=1) for _ in range(nstreams)]
    x0 = lf.array(x0, stream=streams[0])
    lf.eval(x0)
    stats = {}

    def run():
        lf.reset_stats()
        x = x0
        for i in range(n):
            x = lf.add(x, 1.0, stream=streams[i % nstreams])
        lf.eval(x)
        st = lf.stats()
        stats.update(waits_emitted=st["waits_emitted"], waits_elided=st["waits_elided"])
        return x

    def close():
        for s in streams:
            s.close()
    impl = Impl("laneflow one stream" if nstreams == 1 else "laneflow two streams", run, np.asarray,
                lanes=nstreams, close=close, note="no fences: baseline" if nstreams == 1 else "a fence every hop")
    impl.extra = stats
    return impl
