"""Is a kernel that reads one 256 MiB array and writes one (the broadcast multiply of bench kernels)
limited by writing into a fresh output? Times, with CUDA events on PyTorch (a peer, for reference)
and laneflow: copy into a preallocated buffer, copy into a fresh one, x * v into a preallocated and a
fresh buffer, and laneflow's own x * v and x + 0.0. Prints GB/s of bytes read + written.

    python tools/probe_bandwidth.py     # needs a GPU; PyTorch rows when it imports
"""
import numpy as np

import laneflow as lf

ROWS, COLS = 65536, 1024
NB = ROWS * COLS * 4


def report(name, sec, nbytes):
    print(f"{name:48s} {sec * 1e6:8.1f} us  {nbytes / sec / 1e9:7.0f} GB/s", flush=True)


def torch_rows():
    try:
        import torch
    except ImportError:
        return
    x = torch.rand(ROWS, COLS, device="cuda")
    v = torch.rand(COLS, device="cuda")
    out = torch.empty_like(x)
    big = torch.empty(ROWS * 4, COLS, device="cuda")  # 1 GiB
    big2 = torch.empty_like(big)
    cases = {"torch copy_ 1 GiB into preallocated": (lambda: big2.copy_(big), 2 * 4 * NB),
             "torch copy_ 256 MiB into preallocated": (lambda: out.copy_(x), 2 * NB),
             "torch clone 256 MiB (fresh output)": (lambda: x.clone(), 2 * NB),
             "torch mul(x, v, out=preallocated)": (lambda: torch.mul(x, v, out=out), 2 * NB),
             "torch x * v (fresh output)": (lambda: x * v, 2 * NB),
             "torch x + y (fresh output)": (lambda: x + out, 3 * NB)}
    for name, (fn, nbytes) in cases.items():
        for _ in range(3):
            fn()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ts = []
        for _ in range(10):
            torch.cuda.synchronize()
            s.record()
            fn()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e) / 1e3)
        report(name, float(np.median(ts)), nbytes)


def laneflow_rows():
    from laneflow.backends.cuda.timing import StreamEventTimer

    s = lf.new_stream(lf.gpu, lanes=1)
    rng = np.random.default_rng(0)
    x = lf.array(rng.random((ROWS, COLS), dtype=np.float32), stream=s)
    v = lf.array(rng.random(COLS, dtype=np.float32), stream=s)
    y = lf.array(rng.random((ROWS, COLS), dtype=np.float32), stream=s)
    lf.eval(x, v, y)
    timer = StreamEventTimer(s)
    cases = {"laneflow x * v (fresh output from the pool)": (lambda: x * v, 2 * NB),
             "laneflow x + 0.5 (fresh output from the pool)": (lambda: x + 0.5, 2 * NB),
             "laneflow x + y (fresh output from the pool)": (lambda: x + y, 3 * NB)}
    for name, (fn, nbytes) in cases.items():
        ts = []
        for r in range(13):
            with lf.stream(s):
                z = fn()
            timer.start()
            lf.async_eval(z)
            t = timer.stop()
            if r >= 3:
                ts.append(t)
            del z
        report(name, float(np.median(ts)), nbytes)


if __name__ == "__main__":
    torch_rows()
    laneflow_rows()
