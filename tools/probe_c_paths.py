"""The uncached per-command path with and without its C parts, taking turns (issue 15's per-command
target): a chain of N tiny adds (16 float32, fusion off, plan cache bypassed), evaluated at once, and the
same chain in torch eager in the same process, per add (best of R chains).

    python tools/probe_c_paths.py [--rounds 3] [--n 2000] [--fake]

Each round runs two child processes, one after the other: the C paths on (the default), and off
(LANEFLOW_CSUBMIT=0 LANEFLOW_CELEMENTWISE=0 LANEFLOW_CENQUEUE=0). ``--fake``: on the fake driver (host
time only, no torch).
"""
import argparse
import os
import subprocess
import sys
import time

OFF = {"LANEFLOW_CSUBMIT": "0", "LANEFLOW_CELEMENTWISE": "0", "LANEFLOW_CENQUEUE": "0"}


def child(n: int, reps: int, fake: bool) -> None:
    if fake:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import fake_driver

        fake_driver.install()
    import numpy as np
    import laneflow as lf
    from laneflow.graph import eval_cache, fusion

    st = lf.new_stream(lf.gpu, lanes=1)
    x = lf.array(np.zeros(16, np.float32), stream=st)
    lf.eval(x)
    fusion.set_enabled(False)

    def chain():
        t = time.perf_counter()
        with lf.stream(st), eval_cache.bypass():
            y = x
            for _ in range(n):
                y = y + 1.0
            lf.eval(y)
        st.synchronize()
        return (time.perf_counter() - t) / n * 1e6

    chain()
    lf_us = min(chain() for _ in range(reps))
    torch_us = float("nan")
    if not fake:
        import torch

        tx = torch.zeros(16, device="cuda")

        def tchain():
            t = time.perf_counter()
            y = tx
            for _ in range(n):
                y = y + 1.0
            torch.cuda.synchronize()
            return (time.perf_counter() - t) / n * 1e6

        tchain()
        torch_us = min(tchain() for _ in range(reps))
    from laneflow.graph import csubmit

    print(f"RESULT {lf_us:.2f} {torch_us:.2f} {csubmit.load() is not None}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--fake", action="store_true")
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    if a.child:
        child(a.n, a.reps, a.fake)
        return
    print(f"uncached chain of {a.n} tiny adds, fusion off, per add (best of {a.reps}); torch eager in the same process")
    for r in range(a.rounds):
        for label, env in (("C paths on ", {}), ("C paths off", OFF)):
            cmd = [sys.executable, __file__, "--child", "--n", str(a.n), "--reps", str(a.reps)] + (["--fake"] if a.fake else [])
            p = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
            line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT")), None)
            if line is None:
                print(f"round {r + 1} {label}: failed: {p.stderr.strip().splitlines()[-1:] or p.returncode}")
                continue
            lf_us, torch_us, built = line.split()[1:]
            print(f"round {r + 1} {label}: laneflow {float(lf_us):6.2f} us  torch eager {float(torch_us):6.2f} us"
                  f"  ratio {float(lf_us) / float(torch_us):.2f}  (C submit built: {built})")


if __name__ == "__main__":
    main()
