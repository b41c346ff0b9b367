"""MLX: lazy graphs evaluated once per run (its CUDA backend on Linux GPUs, or its CPU device),
``mx.compile`` for the compiled row, and explicit ``mx.new_stream`` streams."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...models import gpt2 as model
from ..harness import Impl, chain_program
from . import PeerUnavailable, require


def _mx():
    return require("mlx.core", "MLX")


def _device(device: Any):
    mx = _mx()
    dev = mx.gpu if device.type == "gpu" else mx.cpu
    if device.type == "gpu":
        try:
            ok = mx.is_available(mx.gpu) if hasattr(mx, "is_available") else True
        except Exception:  # noqa: BLE001
            ok = False
        if not ok:
            raise PeerUnavailable("MLX has no GPU backend here")
    return mx, dev


def check(device: Any) -> None:
    _device(device)


def _setup(case, device):
    mx, dev = _device(device)
    args = {k: _array(mx, v) for k, v in case.inputs.items()}
    mx.eval(*args.values())
    return mx, dev, args


def _array(mx, v: np.ndarray):
    if v.dtype.name == "bfloat16":  # MLX does not take ml_dtypes' bfloat16 from numpy
        return mx.array(v.astype(np.float32)).astype(mx.bfloat16)
    return mx.array(v)


def _impl(mx, dev, name, fn, to_host=None, lanes=None, note="") -> Impl:
    def run():
        with mx.stream(dev):
            y = fn()
        mx.eval(y)
        return y
    return Impl(f"mlx {name}", run, to_host or _host, lanes=lanes, note=note)


def _host(out: Any) -> Any:
    if isinstance(out, (list, tuple)):
        return [_host(o) for o in out]
    mx = _mx()
    if out.dtype in (mx.bfloat16, mx.float16):
        out = out.astype(mx.float32)
    return np.array(out)


def dispatch(case, device, lanes):
    mx, dev, args = _setup(case, device)
    n = case.params["n"]

    chain, x0 = chain_program(n), args["x"]
    return [_impl(mx, dev, "lazy chain", lambda: chain(x0), lanes=1)]


def experts(case, device, lanes):
    mx, dev, args = _setup(case, device)
    X, W = args["x"], args["w"]
    E = X.shape[0]

    def step(X, W):
        return [X[i] @ W[i] for i in range(E)]
    stack = lambda ys: np.stack(_host(ys))  # noqa: E731
    cstep = mx.compile(step)
    return [_impl(mx, dev, "eager", lambda: step(X, W), stack, lanes=1),
            _impl(mx, dev, "compiled", lambda: cstep(X, W), stack, lanes=1),
            _impl(mx, dev, "batched matmul (fused)", lambda: X @ W, lanes=1)]


def branches(case, device, lanes):
    mx, dev, args = _setup(case, device)
    x, W = args["x"], args["w"]
    B = W.shape[0]

    def step(x, W):
        acc = mx.tanh(x @ W[0])
        for b in range(1, B):
            acc = acc + mx.tanh(x @ W[b])
        return acc
    cstep = mx.compile(step)
    return [_impl(mx, dev, "eager", lambda: step(x, W), lanes=1),
            _impl(mx, dev, "compiled", lambda: cstep(x, W), lanes=1)]


def kernels(case, device, lanes):
    mx, dev, args = _setup(case, device)
    a, b, c = args["a"], args["b"], args["c"]
    rows = case.params["rows"]
    return [_impl(mx, dev, "eager", lambda: [a * b + c, mx.exp(a), mx.sum(b),
                                             mx.softmax(c.reshape(rows, -1), axis=-1)], lanes=1)]


def fences(case, device, lanes):
    mx, dev, args = _setup(case, device)
    n = case.params["n"]
    streams = [mx.new_stream(dev), mx.new_stream(dev)]

    def one_stream():
        x = args["x"]
        for _ in range(n):
            x = mx.add(x, 1.0, stream=streams[0])
        return x

    def ping_pong():
        x = args["x"]
        for i in range(n):
            x = mx.add(x, 1.0, stream=streams[i & 1])
        return x
    return [_impl(mx, dev, "one stream", one_stream, lanes=1, note="no fences: baseline"),
            _impl(mx, dev, "two streams", ping_pong, lanes=2)]


def gpt2(case, device, lanes):
    """The model's numpy-style forward on MLX arrays: eager, and ``mx.compile`` (as ``anchors/probe_gpt2.py``)."""
    mx, dev, args = _setup(case, device)

    cfg = case.params["config"]
    params = {k: _array(mx, v) for k, v in case.params["weights"].items()}
    mx.eval(*params.values())
    ids = args["ids"]
    ops = model.plain_ops(mx)

    def forward(params, ids):
        return model.forward(params, ids, cfg, ops)
    compiled = mx.compile(forward)
    return [_impl(mx, dev, "eager", lambda: forward(params, ids), lanes=1),
            _impl(mx, dev, "compiled", lambda: compiled(params, ids), lanes=1)]
