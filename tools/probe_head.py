"""GPT-2's head (x @ wte.T) at vocabulary sizes around 50,257: is the padded-rows path taken, and what
does each width cost (us per product, 20 products per compiled replay)."""

import time

import numpy as np

import laneflow as lf
from laneflow.backends.cuda import matmul as mm

calls = []
_orig = mm.strided_copy


def _count(*a, **k):
    calls.append(a[5])
    return _orig(*a, **k)


mm.strided_copy = _count
R = 20
with lf.stream(lf.new_stream(lf.gpu, lanes=1)):
    x = lf.array(np.random.default_rng(0).standard_normal((1, 16, 768)).astype(lf.bfloat16))
    for V in (50257, 50264, 50240, 50304, 50176):
        w = lf.array((np.random.default_rng(1).standard_normal((V, 768)) * 0.02).astype(lf.bfloat16))
        calls.clear()
        f = lf.compile(lambda x, w: [x @ w.T for _ in range(R)])
        for _ in range(3):
            lf.eval(f(x, w))
        lf.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            y = f(x, w)
        lf.eval(y)
        lf.synchronize()
        print(f"V={V}: {(time.perf_counter() - t0) / 50 / R * 1e6:.1f} us, padded copies seen {len(calls)} {calls[:1]}")
