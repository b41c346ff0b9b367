"""The byte and FLOP floor of a workload, from the device's bandwidth and matmul rate measured in
the same run (never from a spec sheet).

- CPU: numpy (what laneflow's CPU kernels call): a large copy, and a float32 matrix product.
- GPU: the first of PyTorch, CuPy or laneflow itself that can run there: a device-to-device copy,
  and a matrix product in the workload's dtype, timed with device events where available.

A floor is ``max(bytes / bandwidth, flops / rate)``: no implementation can beat it on that device.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import laneflow as lf


class Floors:
    def __init__(self, device: Any, quick: bool = False):
        self.device = device
        self.quick = quick
        self._bw: tuple[float, str] | None = None
        self._flops: dict[str, tuple[float, str]] = {}

    # -- measured rates ----------------------------------------------------------------------------
    def bandwidth(self) -> tuple[float, str]:
        """(bytes per second counting reads and writes, how it was measured)."""
        if self._bw is None:
            self._bw = _gpu_bandwidth(self.quick) if self.device.type == "gpu" else _cpu_bandwidth(self.quick)
        return self._bw

    def flop_rate(self, dtype: Any) -> tuple[float, str]:
        name = np.dtype(dtype).name
        if name not in self._flops:
            if self.device.type == "gpu":
                self._flops[name] = _gpu_flops(name, self.quick)
            else:
                self._flops[name] = _cpu_flops(self.quick)
        return self._flops[name]

    def floor(self, case: Any) -> tuple[float | None, float | None]:
        """(seconds to move the case's bytes, seconds to do its FLOPs) on this device."""
        try:
            b = case.bytes / self.bandwidth()[0] if case.bytes else None
            f = case.flops / self.flop_rate(case.dtype)[0] if case.flops else None
        except Exception:  # noqa: BLE001 - no way to measure here: report no floor rather than a guess
            return None, None
        return b, f

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self._bw is not None:
            out["bandwidth_GBps"] = round(self._bw[0] / 1e9, 2)
            out["bandwidth_how"] = self._bw[1]
        for name, (rate, how) in self._flops.items():
            out[f"matmul_{name}_TFLOPs"] = round(rate / 1e12, 4)
            out[f"matmul_{name}_how"] = how
        return out


def _best(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _cpu_bandwidth(quick: bool) -> tuple[float, str]:
    n = (8 if quick else 64) * 2**20 // 4
    src = np.ones(n, np.float32)
    dst = np.empty_like(src)
    t = _best(lambda: np.copyto(dst, src), 5)
    return 2 * src.nbytes / t, f"numpy copy of {src.nbytes >> 20} MiB, best of 5"


def _cpu_flops(quick: bool) -> tuple[float, str]:
    n = 256 if quick else 1024
    a = np.ones((n, n), np.float32)
    t = _best(lambda: a @ a, 3)
    return 2 * n**3 / t, f"numpy float32 {n}x{n}x{n} matmul, best of 3"


def _gpu_bandwidth(quick: bool) -> tuple[float, str]:
    nbytes = (64 if quick else 1024) * 2**20
    torch = _torch_cuda()
    if torch is not None:
        a = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").fill_(1)
        b = torch.empty_like(a)
        t = _torch_best(torch, lambda: b.copy_(a), 10)
        return 2 * nbytes / t, f"torch device copy of {nbytes >> 20} MiB, best of 10 (events)"
    cp = _cupy()
    if cp is not None:
        a = cp.ones(nbytes // 4, cp.float32)
        b = cp.empty_like(a)
        t = _cupy_best(cp, lambda: b.__setitem__(Ellipsis, a), 10)
        return 2 * nbytes / t, f"cupy device copy of {nbytes >> 20} MiB, best of 10 (events)"
    x = lf.ones(nbytes // 4, dtype=lf.float32, device=lf.gpu)
    lf.eval(x)
    t = _best(lambda: lf.eval(x + 0), 10)
    return 2 * nbytes / t, f"laneflow x + 0 on {nbytes >> 20} MiB, best of 10 (host clock)"


def _gpu_flops(dtype_name: str, quick: bool) -> tuple[float, str]:
    n = 2048 if quick else 8192
    if dtype_name not in ("bfloat16", "float16"):
        n //= 2
    torch = _torch_cuda()
    if torch is not None:
        tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}.get(
            dtype_name, torch.float32)
        a = torch.randn(n, n, device="cuda").to(tdt)
        t = _torch_best(torch, lambda: a @ a, 5)
        return 2 * n**3 / t, f"torch {dtype_name} {n}^3 matmul, best of 5 (events)"
    cp = _cupy()
    if cp is not None and dtype_name in ("float16", "float32", "float64"):
        a = cp.random.standard_normal((n, n)).astype(dtype_name)
        t = _cupy_best(cp, lambda: a @ a, 5)
        return 2 * n**3 / t, f"cupy {dtype_name} {n}^3 matmul, best of 5 (events)"
    a = lf.ones((n, n), dtype=dtype_name, device=lf.gpu)
    lf.eval(a)
    t = _best(lambda: lf.eval(a @ a), 5)
    return 2 * n**3 / t, f"laneflow {dtype_name} {n}^3 matmul, best of 5 (host clock)"


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _cupy():
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
        return cupy
    except Exception:  # noqa: BLE001
        return None


def _torch_best(torch, fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        best = min(best, s.elapsed_time(e) / 1e3)
    return best


def _cupy_best(cp, fn, reps: int) -> float:
    fn()
    cp.cuda.Device().synchronize()
    best = float("inf")
    for _ in range(reps):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        fn()
        e.record()
        e.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(s, e) / 1e3)
    return best
