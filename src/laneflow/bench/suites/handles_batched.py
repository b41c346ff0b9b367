"""handles, part 4: batched small-matrix linear algebra (issue 18) against per-lane handles and the peers.

The target workload: ``batch`` x (n x n) float32 solves, one right-hand side each (4096 x 32 x 32 on the
GPU). Rows, all through ``lf.linalg.solve`` on the whole batch:

- *batched*: one cuBLAS getrfBatched + getrsBatched call under one handle per device (``device``
  policy), and the same under the ``stream`` policy;
- *looped*: the per-matrix loop (``LANEFLOW_LINALG_BATCHED_MAX_N=0``) split over ``lanes`` lanes, under the
  ``stream`` policy (a cuSOLVER handle per lane, JAX's design) and the ``device`` policy (one shared
  handle whose calls run one after another);
- the peers ``torch.linalg.solve`` and ``jax.numpy.linalg.solve`` (jitted) on the same batch.

Each laneflow row reports the handles its work holds and their memory (count x the per-handle bytes
measured at the first create in this process, ``handles._Library``; the H200 anchors when unmeasured).

Then the crossover (``linalg_batched.BATCHED_MAX_N``): looped vs batched on one lane for
n in ``cross_ns`` (32, 64, 128 on the GPU) and solve, cholesky and inv, on ``cross_batch`` matrices.

``LANEFLOW_BENCH_HANDLES=batched`` runs this part alone (``python -m laneflow bench handles``).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

import laneflow as lf

from ...runtime import handle_pool as hp
from .. import laneflow_impls as lfi
from ..harness import Case, Impl, Result

MiB = 1 << 20
ENV = "LANEFLOW_LINALG_BATCHED_MAX_N"
#: max n that takes the batched path in the "batched" rows, and the value that forces the loop
ALWAYS, NEVER = "1024", "0"


def _handle_bytes(lib: str) -> int:
    from ...backends.cuda.handles import ESTIMATED_HANDLE_BYTES, _Library

    return _Library._measured.get(lib, ESTIMATED_HANDLE_BYTES.get(lib, 0))


def _setting(run: Callable, policy: str, max_n: str) -> Callable:
    """``run`` under handle ``policy`` and batched-path setting ``max_n`` (both restored after)."""

    def wrapped():
        old_policy, old_env = hp._policy, os.environ.get(ENV)
        hp.set_handle_policy(policy)
        os.environ[ENV] = max_n
        try:
            return run()
        finally:
            hp.set_handle_policy(old_policy)
            if old_env is None:
                os.environ.pop(ENV, None)
            else:
                os.environ[ENV] = old_env

    return wrapped


def _row(case: Case, device: Any, label: str, fn: Callable, inputs: list, lanes: int, policy: str,
         batched: bool, lib: str) -> Impl:
    """One laneflow row; ``lib``: the library the batched path calls (the loop always calls cuSOLVER)."""
    impl = lfi.eager(case, device, fn, inputs, lanes, label=label, report_cache=False,
                     note=f"{policy} policy, {'one batched call' if batched else 'per-matrix loop'}")
    impl.run = _setting(impl.run, policy, ALWAYS if batched else NEVER)
    lib = lib if batched else "cusolverDn"
    count = 1 if batched or policy == "device" else lanes  # batched: one command, so one lane's handle
    impl.extra.update(policy=policy, path="batched" if batched else "looped", handle_library=lib,
                      handles=count, handle_MiB=round(count * _handle_bytes(lib) / MiB, 1))
    return impl


def _solve(a, b):
    return lf.linalg.solve(a, b)


def batched_part(ctx, p: dict) -> list[Result]:
    """The rows above; prints the verdict against the issue's targets."""
    rng = np.random.default_rng(1818)
    B, n, lanes = p["batch"], p["n"], p["lanes"]
    a = (rng.standard_normal((B, n, n)) + np.sqrt(n) * np.eye(n)).astype(np.float32)
    b = rng.standard_normal((B, n, 1)).astype(np.float32)
    case = Case("handles", f"{B} x ({n}x{n}) float32 solves: batched vs per-lane handles", {"a": a, "b": b},
                np.linalg.solve(a.astype(np.float64), b.astype(np.float64)), dtype=np.float32, rtol=5e-3,
                params={"batch": B, "n": n})
    why = lfi.unavailable(ctx.device)
    if why:
        return [lfi.skipped(case, "laneflow", why)]
    specs = [("laneflow batched, device policy", 1, "device", True),
             ("laneflow batched, stream policy", 1, "stream", True),
             (f"laneflow looped, {lanes} lanes, stream policy", lanes, "stream", False),
             (f"laneflow looped, {lanes} lanes, device policy", lanes, "device", False)]
    rows = [lfi.guard(case, label, c, lambda label=label, c=c, pol=pol, bt=bt:
                      _row(case, ctx.device, label, _solve, [a, b], c, pol, bt, "cublas")) for label, c, pol, bt in specs]
    results = ctx.run_case(case, "handles_batched", rows)
    _verdict(results, lanes)
    results += _crossover(ctx, p)
    return results


def _crossover(ctx, p: dict) -> list[Result]:
    rng = np.random.default_rng(1819)
    ops = {"solve": (_solve, lambda a, b: np.linalg.solve(a, b), "cublas"),
           "cholesky": (lambda a, b: lf.linalg.cholesky(a), lambda a, b: np.linalg.cholesky(a), "cusolverDn"),
           "inv": (lambda a, b: lf.linalg.inv(a), lambda a, b: np.linalg.inv(a), "cublas")}
    out: list[Result] = []
    table = []
    for n in p["cross_ns"]:
        B = p["cross_batch"]
        g = rng.standard_normal((B, n, n))
        a = (g @ np.swapaxes(g, -1, -2) + n * np.eye(n)).astype(np.float32)  # positive definite, for cholesky
        b = rng.standard_normal((B, n, 1)).astype(np.float32)
        for op, (fn, ref, lib) in ops.items():
            case = Case("handles", f"crossover: {op} of {B} x ({n}x{n}) float32, looped vs batched, one lane",
                        {"a": a, "b": b}, ref(a.astype(np.float64), b.astype(np.float64)), dtype=np.float32,
                        rtol=5e-3, params={"n": n, "op": op})
            rows = [lfi.guard(case, f"laneflow {path}", 1, lambda path=path, fn=fn, lib=lib, case=case, a=a, b=b:
                              _row(case, ctx.device, f"laneflow {path}", fn, [a, b], 1, "device", path == "batched",
                                   lib)) for path in ("looped", "batched")]
            res = ctx.run_case(case, "handles_batched", rows, peers=False)
            out += res
            t = {r.impl.split()[-1]: r.median for r in res if r.median}
            if len(t) == 2:
                table.append((op, n, t["looped"] * 1e3, t["batched"] * 1e3, t["looped"] / t["batched"]))
    for op, n, lt, bt, sp in table:
        print(f"crossover {op:8s} n={n:4d}: looped {lt:8.3f} ms, batched {bt:8.3f} ms, batched {sp:6.2f}x")
    return out


def _verdict(results: list[Result], lanes: int) -> None:
    by = {r.impl: r for r in results if r.median}
    dev = by.get("laneflow batched, device policy")
    st = by.get(f"laneflow looped, {lanes} lanes, stream policy")
    if dev is None or st is None:
        return
    mem = dev.extra["handle_MiB"] / st.extra["handle_MiB"] if st.extra.get("handle_MiB") else float("nan")
    line = (f"batched (device policy) vs looped on {lanes} lanes (stream policy): {st.median / dev.median:.2f}x "
            f"(target >= 1.0) at handle memory {dev.extra['handle_MiB']:.0f} vs {st.extra['handle_MiB']:.0f} MiB "
            f"= {mem:.3f}x (target <= 0.125)")
    for peer in ("torch", "jax"):
        r = next((x for n_, x in by.items() if n_.startswith(peer)), None)
        if r is not None:
            line += f"; vs {r.impl}: {r.median / dev.median:.2f}x (target >= 1.0)"
    print(line)
