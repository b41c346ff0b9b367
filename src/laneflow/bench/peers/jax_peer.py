"""JAX: ``jax.jit`` per call for dispatch, one jitted program for the multi-op workloads (XLA does
its own scheduling); the einsum/batched form as the fused limit. Host clock around
``block_until_ready`` (JAX has no user-visible events)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ...models import gpt2 as model
from ..harness import FIRST_CALL_NOTE, Impl, first_call
from . import PeerUnavailable, require


def _jax():
    # Without this JAX takes 75 % of GPU memory at import, starving every other row.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return require("jax", "JAX")


def _device(device: Any):
    jax = _jax()
    kind = "gpu" if device.type == "gpu" else "cpu"
    try:
        devs = jax.devices(kind)
    except RuntimeError:
        devs = []
    if len(devs) <= device.index:
        raise PeerUnavailable(f"JAX sees no {kind} device {device.index}")
    return jax, devs[device.index]


def check(device: Any) -> None:
    _device(device)


def _setup(case, device):
    jax, dev = _device(device)
    args = {k: jax.device_put(v, dev) for k, v in case.inputs.items()}
    for v in args.values():
        v.block_until_ready()
    return jax, args


def _impl(jax, name, fn, lanes=None, note="") -> Impl:
    def run():
        return jax.block_until_ready(fn())
    return Impl(f"jax {name}", run, _host, lanes=lanes, note=note)


def _host(out: Any) -> Any:
    if isinstance(out, (list, tuple)):
        return [_host(o) for o in out]
    return np.asarray(out)  # bfloat16 comes back as ml_dtypes.bfloat16, which numpy compares fine


def dispatch(case, device, lanes):
    jax, args = _setup(case, device)
    f = jax.jit(lambda x: x + 1.0)
    n = case.params["n"]

    def chain():
        x = args["x"]
        for _ in range(n):
            x = f(x)
        return x
    return [_impl(jax, "jit per op", chain, lanes=1)]


def experts(case, device, lanes):
    jax, args = _setup(case, device)
    jnp = jax.numpy
    X, W = args["x"], args["w"]
    E = X.shape[0]
    listed = jax.jit(lambda X, W: jnp.stack([X[i] @ W[i] for i in range(E)]))
    fused = jax.jit(lambda X, W: jnp.einsum("emk,ekn->emn", X, W))
    return [_impl(jax, "jit list", lambda: listed(X, W), lanes=1),
            _impl(jax, "jit einsum (fused)", lambda: fused(X, W), lanes=1)]


def branches(case, device, lanes):
    jax, args = _setup(case, device)
    jnp = jax.numpy
    x, W = args["x"], args["w"]
    B = W.shape[0]

    def prog(x, W):
        acc = jnp.tanh(x @ W[0])
        for b in range(1, B):
            acc = acc + jnp.tanh(x @ W[b])
        return acc
    listed = jax.jit(prog)
    fused = jax.jit(lambda x, W: jnp.tanh(jnp.einsum("mk,bkn->bmn", x, W)).sum(0))
    return [_impl(jax, "jit", lambda: listed(x, W), lanes=1),
            _impl(jax, "jit einsum (fused)", lambda: fused(x, W), lanes=1)]


def kernels(case, device, lanes):
    jax, args = _setup(case, device)
    jnp = jax.numpy
    rows = case.params["rows"]
    f = jax.jit(lambda a, b, c: [a * b + c, jnp.exp(a), jnp.sum(b), jax.nn.softmax(c.reshape(rows, -1), axis=-1)])
    a, b, c = args["a"], args["b"], args["c"]
    return [_impl(jax, "jit", lambda: f(a, b, c), lanes=1)]


def handles_batched(case, device, lanes):
    """``jax.numpy.linalg.solve`` on the whole batch, jitted (XLA's batched LU)."""
    jax, args = _setup(case, device)
    import jax.numpy as jnp

    solve = jax.jit(jnp.linalg.solve)
    return [_impl(jax, "jit linalg.solve (batched)", lambda: solve(args["a"], args["b"]), lanes=1)]


def gpt2(case, device, lanes):
    """``jax.jit`` of the model's numpy-style forward (as ``anchors/probe_gpt2.py``), weights as arguments."""
    jax, dev = _device(device)

    cfg = case.params["config"]
    params = {k: jax.device_put(v, dev) for k, v in case.params["weights"].items()}  # bfloat16 stays bfloat16
    ids = jax.device_put(case.inputs["ids"], dev)
    ops = model.plain_ops(jax.numpy, softmax=jax.nn.softmax)
    f = jax.jit(lambda params, ids: model.forward(params, ids, cfg, ops))
    # (first: the trace and compile of these shapes, as laneflow's and torch's first-call rows)
    return [first_call(case, _impl(jax, "jit, first call", lambda: f(params, ids), lanes=1, note=FIRST_CALL_NOTE)),
            _impl(jax, "jit", lambda: f(params, ids), lanes=1, note="the same forward on jax.numpy")]


def decode(case, device, lanes):
    """``jax.jit`` of one decode step with the caches donated (``donate_argnums``, as
    ``anchors/probe_decode.py``), the model's own blocks on ``jax.numpy``, the keys and values written
    with ``lax.dynamic_update_slice`` at a traced position."""
    jax, dev = _device(device)
    jnp = jax.numpy
    cfg, S, POS, B = (case.params[k] for k in ("config", "S", "POS", "B"))
    params = {k: jax.device_put(v, dev) for k, v in case.params["weights"].items()}
    ops = model.plain_ops(jnp, softmax=jax.nn.softmax)
    scale = 1.0 / cfg.head_dim ** 0.5
    P = model.PREFIX

    def step(params, tok, pos, kc, vc):
        wpe = params[P + "wpe.weight"]
        h = params[P + "wte.weight"][tok][:, None] + jax.lax.dynamic_slice_in_dim(wpe, pos, 1)[None]
        keep = (jnp.arange(S) <= pos)[None, None, None, :]
        nk, nv = [], []

        def attend(q, k, v, i):
            ki = jax.lax.dynamic_update_slice(kc[i], k.astype(kc[i].dtype), (0, 0, pos, 0))
            vi = jax.lax.dynamic_update_slice(vc[i], v.astype(vc[i].dtype), (0, 0, pos, 0))
            nk.append(ki)
            nv.append(vi)
            att = jnp.where(keep, (q @ ki.swapaxes(-1, -2)) * scale, -1e9)
            return jax.nn.softmax(att, axis=-1) @ vi
        for i in range(cfg.n_layer):
            h = model.block(params, i, h, cfg, ops, attend)
        return model.head(params, h, cfg, ops)[:, 0], nk, nv

    f = jax.jit(step, donate_argnums=(3, 4))
    dt = case.params["weights"][P + "wte.weight"].dtype
    state = {"k": [jnp.zeros((B, cfg.n_head, S, cfg.head_dim), dt, device=dev) for _ in range(cfg.n_layer)],
             "v": [jnp.zeros((B, cfg.n_head, S, cfg.head_dim), dt, device=dev) for _ in range(cfg.n_layer)]}
    ids = jax.device_put(case.inputs["ids"], dev)
    for t in range(POS):  # fill the caches with the prompt, one step a token
        _, state["k"], state["v"] = f(params, ids[:, t], jnp.int32(t), state["k"], state["v"])
    tok, pos = ids[:, POS], jnp.int32(POS)

    def run():
        out, state["k"], state["v"] = f(params, tok, pos, state["k"], state["v"])
        return out
    return [_impl(jax, "jit", run, lanes=1, note="caches donated (donate_argnums)")]
