"""bench dispatch's uncached programs in a loop, for a native profiler on a GPU machine (issue 15: where an
uncached command's host time goes, the driver and our C modules included), and a summary of its samples.

    LANEFLOW_NATIVE_KEEP=/tmp/lfso py-spy record --native -r 2000 -f raw -o chain.raw -- \\
        python tools/profile_native.py chain --seconds 12
    python tools/profile_native.py --summary chain.raw

Workloads: ``chain`` (tiny adds, fusion off: bench dispatch's per-command row) and ``mixed`` (its mixed
chain: matmul, reshapes, add, sum, multiply, subtract), each evaluated whole with the plan cache bypassed,
on one lane. ``LANEFLOW_NATIVE_KEEP`` leaves laneflow's C modules on disk, so the profiler names their
functions (``native.py``). ``--fake``: on the fake driver (no GPU). The summary keeps the samples under
the timed function and prints the largest inclusive and self shares (Python frames with their file).
"""
import argparse
import collections
import os
import sys
import time


def run(workload: str, seconds: float, fake: bool) -> None:
    if fake:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import fake_driver

        fake_driver.install()
    import numpy as np

    import laneflow as lf
    from laneflow.bench.harness import chain_program
    from laneflow.bench.suites.dispatch import mixed_program
    from laneflow.graph import eval_cache, fusion

    st = lf.new_stream(lf.gpu, lanes=1)
    if workload == "chain":
        fusion.set_enabled(False)
        n, prog = 4000, chain_program(4000)
        args = [lf.array(np.zeros(16, np.float32), stream=st)]
    else:
        n, prog = 7 * 200, mixed_program(200, lambda v: lf.sum(v, axis=0, keepdims=True))
        rng = np.random.default_rng(0)
        args = [lf.array(rng.standard_normal((16, 16)).astype(np.float32), stream=st),
                lf.array((np.eye(16) * 0.5).astype(np.float32), stream=st)]
    lf.eval(*args)

    def timed() -> float:  # (the summary keeps the samples under this function)
        t = time.perf_counter()
        with lf.stream(st), eval_cache.bypass():
            lf.eval(prog(*args))
        st.synchronize()
        return (time.perf_counter() - t) / n * 1e6

    end, best = time.time() + seconds, float("inf")
    while time.time() < end:
        best = min(best, timed())
    print(f"{workload}: best {best:.2f} us an op (uncached, one lane)")


def summary(path: str, top: int) -> None:
    incl: collections.Counter = collections.Counter()
    own: collections.Counter = collections.Counter()
    total = 0

    def name(frame: str) -> str:
        fn, _, where = frame.partition(" (")
        return f"{fn} [{os.path.basename(where.split(':')[0])}]" if ".py:" in where else fn

    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            frames = stack.split(";")
            at = next((k for k, fr in enumerate(frames) if fr.split(" (")[0].endswith("timed")), None)
            if at is None:
                continue
            n = int(count)
            total += n
            own[name(frames[-1])] += n
            for key in {name(fr) for fr in frames[at:]}:
                incl[key] += n
    print(f"{total} samples under timed()")
    for title, c in (("inclusive", incl), ("self", own)):
        print(f"-- {title}")
        for key, v in c.most_common(top):
            print(f"{100 * v / max(total, 1):5.1f} %  {key[:110]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workload", nargs="?", choices=("chain", "mixed"), default="chain")
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--fake", action="store_true")
    ap.add_argument("--summary", metavar="RAW", help="summarise a py-spy raw file instead")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    if a.summary:
        summary(a.summary, a.top)
    else:
        run(a.workload, a.seconds, a.fake)


if __name__ == "__main__":
    main()
