"""Host time against device time of one compiled GPT-2 decode step (bench decode's, bf16, cache 256).

    python tools/probe_decode_host.py [--batch 1] [--lanes 4] [--calls 200] [--captured] [--profile] [--fake]

Three figures per batch size: the host's time per call with the GPU held back (a sleep kernel on the
lane, so no call waits for the device: the compiled call's own host cost), the steady-state time per
call (calls back to back, one synchronisation at the end: max(host, device) when they overlap), and
the device time of one call (events around a single replay). When the steady state is near the host
time, the step is host-bound. ``--profile`` shows where the held-back calls spend it (a call that waits
for the device shows as a wait there). ``--fake`` runs on the fake driver (host cost only).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


#: calls timed while the GPU is held back: a few hundred queued graph launches fill the driver's launch
#: queue, and then every launch waits for the device (the host figure would be the sleep's length)
HELD_CALLS = 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--lanes", type=int, default=4)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--fake", action="store_true")
    ap.add_argument("--captured", action="store_true", help="the weights closed over (graph constants), as "
                    "gpt2_decode.generate compiles its step")
    ap.add_argument("--profile", action="store_true", help="cProfile the held-back calls (top 25 by own time)")
    a = ap.parse_args()
    if a.fake:
        import fake_driver

        fake_driver.install()
    import laneflow as lf
    from laneflow.models import gpt2
    from laneflow.models import gpt2_decode as dec

    cfg = gpt2.GPT2Config()
    dev = lf.Device("gpu")
    print(f"{'B':>3s} {'lanes':>5s} {'host µs/call':>13s} {'steady µs/call':>15s} {'one call µs':>12s}")
    for B in (int(b) for b in a.batch.split(",")):
        st = lf.new_stream(dev, lanes=a.lanes)
        with lf.stream(st):
            params = gpt2.init_params(cfg, seed=0, dtype=lf.bfloat16, device=dev)
            cache = dec.init_cache(cfg, B, 256, dtype=lf.bfloat16)
            tok, pos = lf.array(np.arange(B, dtype=np.int32)), lf.array(np.int32(128))
            lf.eval(list(params.values()), *[x for kv in cache for x in kv], tok, pos)
        if a.captured:
            g = dec.compile_step(cfg, params)
            f = lambda p, t, q, c: g(t, q, c)  # noqa: E731
        else:
            f = dec.compile_step(cfg)
        state = {"c": cache}

        def call():
            with lf.stream(st):
                _, state["c"] = f(params, tok, pos, state["c"])

        for _ in range(20):
            call()
        st.synchronize()
        if not a.fake:
            from laneflow.backends.cuda.kernels.misc import gpu_sleep

            gpu_sleep(st.lanes[0], 2.0)  # the GPU waits: every call below is host time alone
        prof = None
        if a.profile:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        held = min(a.calls, HELD_CALLS)
        t = time.perf_counter()
        for _ in range(held):
            call()
        host = (time.perf_counter() - t) / held * 1e6
        if prof is not None:
            import pstats

            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        st.synchronize()
        t = time.perf_counter()
        for _ in range(a.calls):
            call()
        st.synchronize()
        steady = (time.perf_counter() - t) / a.calls * 1e6
        ones = []
        for _ in range(20):
            st.synchronize()
            t = time.perf_counter()
            call()
            st.synchronize()
            ones.append((time.perf_counter() - t) * 1e6)
        one = float(np.median(ones))
        print(f"{B:3d} {a.lanes:5d} {host:13.1f} {steady:15.1f} {one:12.1f}")


if __name__ == "__main__":
    main()
