"""numpy on the CPU: the reference every CPU row is checked against, shown so laneflow's CPU
overhead over plain numpy calls is visible."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...models import gpt2 as model
from ..harness import Impl, chain_program
from ..suites.dispatch import mixed_program
from . import PeerUnavailable


def check(device: Any) -> None:
    if device.type != "cpu":
        raise PeerUnavailable("numpy runs on the CPU only")


def _impl(name, run, lanes=1, note="") -> Impl:
    return Impl(f"numpy {name}", run, lambda out: out, lanes=lanes, note=note)


def dispatch(case, device, lanes):
    check(device)
    x0, n = case.inputs["x"], case.params["n"]

    chain = chain_program(n)  # float32 + a Python float stays float32 (NEP 50)
    return [_impl("eager", lambda: chain(x0))]


def dispatch_mixed(case, device, lanes):
    check(device)
    prog = mixed_program(case.params["n"], lambda v: v.sum(axis=0, keepdims=True))
    return [_impl("eager", lambda: prog(case.inputs["x"], case.inputs["w"]))]


def experts(case, device, lanes):
    check(device)
    X, W = case.inputs["x"], case.inputs["w"]
    return [_impl("eager", lambda: np.stack([X[i] @ W[i] for i in range(X.shape[0])])),
            _impl("batched matmul (fused)", lambda: np.matmul(X, W))]


def branches(case, device, lanes):
    check(device)
    x, W = case.inputs["x"], case.inputs["w"]

    def step():
        acc = np.tanh(x @ W[0])
        for b in range(1, W.shape[0]):
            acc = acc + np.tanh(x @ W[b])
        return acc
    return [_impl("eager", step)]


def kernels(case, device, lanes):
    check(device)
    a, b, c = (case.inputs[k] for k in "abc")
    rows = case.params["rows"]

    def softmax(z):
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    return [_impl("eager", lambda: [a * b + c, np.exp(a), np.sum(b), softmax(c.reshape(rows, -1))])]


def gpt2(case, device, lanes):
    """The model's numpy-style forward run on numpy arrays (laneflow.models.gpt2.NUMPY_OPS)."""
    check(device)
    cfg, weights, ids = case.params["config"], case.params["weights"], case.inputs["ids"]
    return [_impl("eager", lambda: model.forward(weights, ids, cfg, model.NUMPY_OPS),
                  note="the same forward on numpy arrays")]
