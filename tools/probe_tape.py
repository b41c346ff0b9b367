"""What trace-guided replay (graph/tape.py) gains on GPT-2 small's cached eager forward, A/B in one
process: rounds take turns between the tape on and paused, each round ``--steps`` forwards, timed on the
host as the split of building the graph and ``lf.eval`` (medians over all rounds), then cProfile of the
evaluations with the tape on and off (``--profile``). ``--maker``: the A/B is the tape's node maker in C
(ops/ctape.c) against the steps making their nodes in Python, each on a stream of its own whose tape was
recorded that way; ``--csteps``: the steps in C (ctape.step) against Python steps with the C node maker.

    python tools/probe_tape.py [--device gpu] [--batch 1] [--rounds 6] [--steps 20] [--plain] [--profile]
                               [--maker | --csteps]
"""
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
import laneflow as lf  # noqa: E402
from laneflow.graph import tape  # noqa: E402
from laneflow.models import gpt2  # noqa: E402
from laneflow.ops import ctape, tape_steps  # noqa: E402


def arg(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main() -> None:
    if "--fake" in sys.argv:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import fake_driver

        fake_driver.install()
    dev = lf.Device(arg("--device", "gpu"))
    batch, rounds, steps = int(arg("--batch", "1")), int(arg("--rounds", "6")), int(arg("--steps", "20"))
    ops = gpt2.LANEFLOW_OPS if "--plain" in sys.argv else gpt2.NN_OPS
    cfg = gpt2.GPT2Config()
    csteps = "--csteps" in sys.argv
    maker = "--maker" in sys.argv or csteps
    if maker and ctape.load() is None:
        sys.exit(f"--maker, --csteps: the tape's C module is not built here ({ctape.why_not()})")
    params = gpt2.init_params(cfg, seed=0, dtype=lf.bfloat16 if dev.type == "gpu" else lf.float32, device=dev)
    lf.eval(list(params.values()))
    streams = {}
    for on in (True, False) if maker else (True,):
        st = lf.new_stream(dev, lanes=1)
        ids = lf.array(np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, 16)), stream=st)
        lf.eval(ids)
        streams[on] = (st, ids)
    streams.setdefault(False, streams[True])  # (tape on and off: one stream)
    times: dict = {True: ([], []), False: ([], [])}
    label = ({True: "C steps", False: "Py+mkr "} if csteps else {True: "C maker", False: "Python "} if maker
             else {True: "tape on ", False: "tape off"})

    def forward(on: bool, record: bool = True) -> None:
        st, ids = streams[on]
        t0 = time.perf_counter()
        with lf.stream(st):
            y = gpt2.forward(params, ids, cfg, ops)
        t1 = time.perf_counter()
        lf.eval(y)
        t2 = time.perf_counter()
        st.synchronize()
        if record:
            times[on][0].append(t1 - t0)
            times[on][1].append(t2 - t1)

    tape_steps._maker()
    cstep = tape_steps._GLOBALS.get("CSTEP")
    for on in (True, False) if maker else (True,):
        if csteps:  # (the steps of the tape this stream records; else as loaded)
            tape_steps._GLOBALS["CSTEP"] = cstep if on else None
        elif maker:
            tape_steps._GLOBALS["C"] = on
        for _ in range(8):
            forward(on, record=False)
    for r in range(rounds):
        for on in (True, False):
            tape.set_enabled(on or maker)
            for k in range(steps):
                forward(on, record=k >= 2)
    tape.set_enabled(True)
    print(f"GPT-2 small {'plain' if ops is gpt2.LANEFLOW_OPS else 'lf.nn'} eager on {dev}, B={batch}: medians of "
          f"{rounds} rounds x {steps} forwards; {tape.STATS}; last failed recording: {tape.LAST_FAILURE[0]}")
    for on in (True, False):
        b, e = times[on]
        print(f"  {label[on]}: build {statistics.median(b) * 1e6:7.0f} us   "
              f"eval {statistics.median(e) * 1e6:7.0f} us")
    if "--profile" in sys.argv:
        for on in (True, False):
            tape.set_enabled(on)
            for _ in range(3):
                forward(on, record=False)
            prof = cProfile.Profile()
            for _ in range(20):
                with lf.stream(st):
                    y = gpt2.forward(params, ids, cfg, ops)
                prof.enable()
                lf.eval(y)
                prof.disable()
                st.synchronize()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
            print(f"== lf.eval, tape {'on' if on else 'off'}, by own time")
            print("\n".join(s.getvalue().splitlines()[4:]))
        tape.set_enabled(True)


if __name__ == "__main__":
    main()
