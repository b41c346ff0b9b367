"""CuPy: eager on one stream, hand-written streams joined with events. GPU only; no bfloat16."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..harness import Impl, chain_program
from ..memory import device_used_bytes
from . import PeerUnavailable, require


def _cupy():
    return require("cupy", "CuPy")


def check(device: Any) -> None:
    cp = _cupy()
    if device.type != "gpu":
        raise PeerUnavailable("CuPy runs on GPUs only")
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        raise PeerUnavailable(f"CuPy sees no GPU ({str(e)[:80]})") from None
    if n <= device.index:
        raise PeerUnavailable(f"CuPy sees no GPU {device.index}")


class EventTimer:
    def __init__(self, cp):
        self.cp = cp

    def start(self) -> None:
        self._s = self.cp.cuda.Event()
        self._s.record()

    def stop(self) -> float:
        e = self.cp.cuda.Event()
        e.record()
        e.synchronize()
        return self.cp.cuda.get_elapsed_time(self._s, e) / 1e3


def _setup(case, device):
    check(device)
    cp = _cupy()
    for k, v in case.inputs.items():
        if v.dtype.name == "bfloat16":
            raise PeerUnavailable("CuPy has no bfloat16")
    cp.cuda.Device(device.index).use()
    args = {k: cp.asarray(v) for k, v in case.inputs.items()}

    def impl(name, run, to_host=None, lanes=None, note="") -> Impl:
        return Impl(f"cupy {name}", run, to_host or _host, lanes=lanes,
                    sync=lambda: cp.cuda.Device().synchronize(), timer=EventTimer(cp), note=note)
    return cp, args, impl


def _host(out: Any) -> Any:
    if isinstance(out, (list, tuple)):
        return [_host(o) for o in out]
    return out.get()


def _multi(cp, streams, parts):
    cur = cp.cuda.get_current_stream()
    fork = cur.record()
    for s in streams:
        s.wait_event(fork)
    for i, part in enumerate(parts):
        with streams[i % len(streams)]:
            part()
    for s in streams:
        cur.wait_event(s.record())


def dispatch(case, device, lanes):
    cp, args, impl = _setup(case, device)
    n = case.params["n"]

    chain, x0 = chain_program(n), args["x"]
    return [impl("eager", lambda: chain(x0), lanes=1)]


def experts(case, device, lanes):
    cp, args, impl = _setup(case, device)
    X, W = args["x"], args["w"]
    E = X.shape[0]
    ys = [cp.empty((X.shape[1], W.shape[2]), X.dtype) for _ in range(E)]
    parts = [lambda i=i: cp.matmul(X[i], W[i], out=ys[i]) for i in range(E)]
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(lanes)]

    def serial():
        for p in parts:
            p()
        return ys

    def multi():
        _multi(cp, streams, parts)
        return ys
    stack = lambda ys: np.stack(_host(ys))  # noqa: E731
    return [impl("eager", serial, stack, lanes=1), impl("streams", multi, stack, lanes=lanes),
            impl("batched matmul (fused)", lambda: cp.matmul(X, W), lanes=1)]


def branches(case, device, lanes):
    cp, args, impl = _setup(case, device)
    x, W = args["x"], args["w"]
    B = W.shape[0]
    hs: list = [None] * B
    parts = [lambda i=i: hs.__setitem__(i, cp.tanh(x @ W[i])) for i in range(B)]
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(lanes)]

    def serial():
        for p in parts:
            p()
        return cp.stack(hs).sum(0)

    def multi():
        _multi(cp, streams, parts)
        return cp.stack(hs).sum(0)
    return [impl("eager", serial, lanes=1), impl("streams", multi, lanes=lanes)]


def kernels(case, device, lanes):
    cp, args, impl = _setup(case, device)
    a, b, c = args["a"], args["b"], args["c"]
    cr = c.reshape(case.params["rows"], -1)
    res: list = [None] * 4

    def softmax(z):
        e = cp.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    parts = [lambda: res.__setitem__(0, a * b + c), lambda: res.__setitem__(1, cp.exp(a)),
             lambda: res.__setitem__(2, b.sum()), lambda: res.__setitem__(3, softmax(cr))]
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(lanes)]

    def serial():
        for p in parts:
            p()
        return list(res)

    def multi():
        _multi(cp, streams, parts)
        return list(res)
    return [impl("eager", serial, lanes=1), impl("streams", multi, lanes=lanes)]


def fences(case, device, lanes):
    cp, args, impl = _setup(case, device)
    n = case.params["n"]
    streams = [cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)]

    def one_stream():
        x = args["x"]
        for _ in range(n):
            x = x + 1.0
        return x

    def ping_pong():
        cur = cp.cuda.get_current_stream()
        streams[0].wait_event(cur.record())
        x = args["x"]
        ev = None
        for i in range(n):
            s = streams[i & 1]
            if ev is not None:
                s.wait_event(ev)
            with s:
                x = x + 1.0
            ev = s.record()
        cur.wait_event(ev)
        return x
    return [impl("one stream", one_stream, lanes=1, note="no fences: baseline"),
            impl("two streams", ping_pong, lanes=2, note="event record + wait every hop")]


def handles(case, device, lanes):
    cp, args, impl = _setup(case, device)
    X, w = args["x"], args["w"]
    c = X.shape[0]
    cp.cuda.Device().synchronize()
    before = device_used_bytes(device)
    t0 = time.perf_counter()
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(c)]
    ys: list = [None] * c

    def run():
        _multi(cp, streams, [lambda i=i: ys.__setitem__(i, X[i] @ w) for i in range(c)])
        return list(ys)
    run()
    cp.cuda.Device().synchronize()
    first = time.perf_counter() - t0
    after = device_used_bytes(device)
    it = impl(f"{c} streams", run, lambda ys: np.stack(_host(ys)), lanes=c)
    it.extra.update(first_run_ms=round(first * 1e3, 3),
                    memory_growth_MiB=None if before is None else round((after - before) / 2**20, 2))
    return [it]
