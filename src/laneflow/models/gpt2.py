"""GPT-2 (the math of Hugging Face's ``GPT2LMHeadModel``) written with laneflow's numpy-style ops.

Parameters are a flat dict with Hugging Face's names (``transformer.h.0.attn.c_attn.weight``) and its
Conv1D layout: a projection's weight is ``(in, out)``, so a layer is ``x @ w + b``. The language-model
head is tied to the token embedding (``lm_head.weight`` is used only when a checkpoint has its own).

>>> cfg = GPT2Config.tiny()
>>> params = init_params(cfg, seed=0)
>>> logits = forward(params, lf.array(np.zeros((1, 8), np.int64)), cfg)   # (1, 8, 256)

The forward is written once over an array namespace: :func:`plain_ops` gives the pieces (embedding
lookup, layer norm, causal attention, GELU) for laneflow, numpy, ``jax.numpy`` or ``mlx.core``, and
:class:`Ops` is the seam where fused versions replace them (:data:`NN_OPS`: ``lf.nn``). :func:`reference_forward`
is a separate numpy implementation, written differently (einsum per head, float64), to check against.
"""

from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

import laneflow as lf

from . import safetensors_io

#: Prefix of the body's parameters in ``GPT2LMHeadModel``'s state dict (the hub's ``gpt2`` file has none).
PREFIX = "transformer."

__all__ = ["GPT2Config", "Ops", "Shard", "LANEFLOW_OPS", "NN_OPS", "NUMPY_OPS", "nn_ops", "PREFIX", "block", "config_from_params", "forward", "head", "init_params",
           "load_safetensors", "numpy_params", "numpy_softmax", "param_shapes", "plain_ops", "reference_forward",
           "save_safetensors", "to_laneflow"]

@dataclass(frozen=True)
class GPT2Config:
    """GPT-2's shape; the defaults are GPT-2 small (124M parameters). Frozen, so it can be a static
    argument of ``lf.compile``."""

    n_layer: int = 12
    n_embd: int = 768
    n_head: int = 12
    vocab_size: int = 50257
    n_positions: int = 1024
    layer_norm_epsilon: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_embd", "n_head", "vocab_size", "n_positions"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"GPT2Config: {name} must be a positive int, got {v!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPT2Config: n_embd {self.n_embd} is not a multiple of n_head {self.n_head}")

    @classmethod
    def tiny(cls) -> "GPT2Config":
        """2 layers, 64 wide, 4 heads, vocabulary 256, 64 positions: runs in milliseconds (tests)."""
        return cls(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def num_params(self) -> int:
        """Parameters in :func:`param_shapes` (the tied head counted once)."""
        return sum(math.prod(s) for s in param_shapes(self).values())

    def matmul_flops(self, batch: int, tokens: int) -> int:
        """FLOPs of one forward's matrix products (projections, attention scores and values, head)."""
        d, n = self.n_embd, batch * tokens
        per_layer = 2 * n * d * (3 * d + d + 4 * d + 4 * d) + 2 * 2 * batch * tokens * tokens * d
        return self.n_layer * per_layer + 2 * n * d * self.vocab_size


def param_shapes(cfg: GPT2Config) -> dict[str, tuple[int, ...]]:
    """Hugging Face name -> shape of every parameter, in the state dict's order."""
    d, f = cfg.n_embd, 4 * cfg.n_embd
    block = {"ln_1.weight": (d,), "ln_1.bias": (d,), "attn.c_attn.weight": (d, 3 * d), "attn.c_attn.bias": (3 * d,),
             "attn.c_proj.weight": (d, d), "attn.c_proj.bias": (d,), "ln_2.weight": (d,), "ln_2.bias": (d,),
             "mlp.c_fc.weight": (d, f), "mlp.c_fc.bias": (f,), "mlp.c_proj.weight": (f, d), "mlp.c_proj.bias": (d,)}
    out = {PREFIX + "wte.weight": (cfg.vocab_size, d), PREFIX + "wpe.weight": (cfg.n_positions, d)}
    for i in range(cfg.n_layer):
        out.update({f"{PREFIX}h.{i}.{k}": shape for k, shape in block.items()})
    out[PREFIX + "ln_f.weight"] = (d,)
    out[PREFIX + "ln_f.bias"] = (d,)
    return out


def numpy_params(cfg: GPT2Config, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random float32 weights with Hugging Face's names and init scale.

    Embeddings and projections are N(0, 0.02) as in ``GPT2PreTrainedModel._init_weights``, the
    residual projections (``c_proj``) N(0, 0.02 / sqrt(2 n_layer)). Where Hugging Face starts from
    zeros and ones (biases, layer norms) these are small random values instead, so a test sees a bias
    or a norm weight that is applied to the wrong axis.
    """
    rng = np.random.default_rng(seed)
    resid = 0.02 / math.sqrt(2 * cfg.n_layer)
    out = {}
    for name, shape in param_shapes(cfg).items():
        z = rng.standard_normal(shape, dtype=np.float32)
        leaf = name.rsplit(".", 2)
        if leaf[-2].startswith("ln_"):
            z = (1.0 + 0.1 * z) if leaf[-1] == "weight" else 0.02 * z
        elif leaf[-1] == "bias":
            z = 0.02 * z
        else:
            z = (resid if leaf[-2] == "c_proj" else 0.02) * z
        out[name] = z.astype(np.float32)
    return out


def init_params(cfg: GPT2Config, seed: int = 0, dtype: Any = lf.float32, device: Any = None) -> dict[str, lf.Array]:
    """:func:`numpy_params` as laneflow arrays of ``dtype`` on ``device`` (evaluated)."""
    return to_laneflow(numpy_params(cfg, seed), dtype, device)


def to_laneflow(params: Mapping[str, np.ndarray], dtype: Any = None, device: Any = None) -> dict[str, lf.Array]:
    """Host weights as laneflow arrays (``dtype``: keep each array's own when None), evaluated."""
    to = None if dtype is None else lf.dtype(dtype)
    out = {k: lf.array(v if to is None or v.dtype == to else v.astype(to), device=device) for k, v in params.items()}
    lf.eval(*out.values())
    return out


def config_from_params(params: Mapping[str, Any], n_head: int = 12,
                       layer_norm_epsilon: float = 1e-5) -> GPT2Config:
    """The config whose shapes ``params`` has (the head count is not in the weights: pass it)."""
    vocab, d = params[PREFIX + "wte.weight"].shape
    n_layer = len({k.split(".")[2] for k in params if k.startswith(PREFIX + "h.")})
    return GPT2Config(n_layer=n_layer, n_embd=d, n_head=n_head, vocab_size=vocab,
                      n_positions=params[PREFIX + "wpe.weight"].shape[0], layer_norm_epsilon=layer_norm_epsilon)


# -- checkpoints -----------------------------------------------------------------------------------

#: Tensors a GPT-2 checkpoint may hold that are not parameters: older transformers saved each block's
#: causal mask (``h.0.attn.bias``, shape (1, 1, n_positions, n_positions)) and ``attn.masked_bias``.
_BUFFER = re.compile(r"h\.\d+\.(attn|crossattention)\.(bias|masked_bias)")


def load_safetensors(path: str | os.PathLike, dtype: Any = None, device: Any = None, *,
                     cfg: GPT2Config | None = None) -> dict[str, lf.Array]:
    """GPT-2 parameters from a safetensors file, with the names :func:`forward` takes.

    Takes ``GPT2LMHeadModel``'s names (``transformer.h.0...``) or ``GPT2Model``'s (``h.0...``, the hub's
    ``gpt2`` file); ignores the attention-mask buffers older files hold; drops ``lm_head.weight`` when it
    equals ``wte`` (tied). ``dtype``: convert every tensor to it (None: keep the file's, e.g. bfloat16).
    The shapes must be those of one GPT-2 (of ``cfg`` when given); otherwise ValueError names the file
    and the missing, unexpected or misshapen tensor.
    """
    where = os.fspath(path)
    found: dict[str, np.ndarray] = {}
    for name, a in safetensors_io.read(where).items():
        body = name[len(PREFIX):] if name.startswith(PREFIX) else name
        if _BUFFER.fullmatch(body):
            continue
        key = name if name.startswith("lm_head.") else PREFIX + body
        if key in found:
            raise ValueError(f"load_safetensors: {where} holds {key} twice (with and without '{PREFIX}')")
        found[key] = a
    expected = param_shapes(cfg if cfg is not None else _config_of(found, where))
    for k, shape in expected.items():
        a = found.get(k)
        if a is None:
            continue
        if a.shape != shape:
            raise ValueError(f"load_safetensors: {where}: tensor {k} has shape {a.shape}, expected {shape}")
        if a.dtype.kind != "f" and a.dtype.name != "bfloat16":
            raise ValueError(f"load_safetensors: {where}: tensor {k} has dtype {a.dtype}, expected floats")
    missing = [k for k in expected if k not in found]
    if missing:
        k = missing[0]
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"load_safetensors: {where} is missing tensor {k} of shape {expected[k]}{more}")
    head = found.pop("lm_head.weight", None)
    unexpected = [k for k in found if k not in expected]
    if unexpected:
        k = unexpected[0]
        raise ValueError(f"load_safetensors: {where} has unexpected tensor {k} of shape {found[k].shape} "
                         "for a GPT-2 checkpoint")
    wte = found[PREFIX + "wte.weight"]
    if head is not None:
        if head.shape != wte.shape:
            raise ValueError(f"load_safetensors: {where}: tensor lm_head.weight has shape {head.shape}, "
                             f"expected {wte.shape} (that of wte)")
        if not np.array_equal(head, wte):
            found["lm_head.weight"] = head  # untied: forward uses it
    return to_laneflow(found, dtype, device)


def _config_of(found: Mapping[str, np.ndarray], where: str) -> GPT2Config:
    """The shapes' config (n_head does not change a shape, so 1 stands in for it)."""
    for k in (PREFIX + "wte.weight", PREFIX + "wpe.weight"):
        if k not in found or len(found[k].shape) != 2:
            shape = found[k].shape if k in found else None
            raise ValueError(f"load_safetensors: {where} is missing tensor {k} (a 2-d embedding)"
                             if shape is None else f"load_safetensors: {where}: tensor {k} has shape {shape}, "
                             "expected 2-d")
    vocab, d = found[PREFIX + "wte.weight"].shape
    layers = [int(m.group(1)) for k in found if (m := re.match(re.escape(PREFIX) + r"h\.(\d+)\.", k))]
    return GPT2Config(n_layer=max(layers, default=0) + 1, n_embd=d, n_head=1, vocab_size=vocab,
                      n_positions=found[PREFIX + "wpe.weight"].shape[0])


def save_safetensors(params: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Write parameters (laneflow or numpy arrays, any float dtype, bfloat16 included) with their names,
    marked as PyTorch's format so transformers' loader takes the file too."""
    safetensors_io.write(params, path, metadata={"format": "pt"})


# -- the forward -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ops:
    """The pieces of a GPT-2 forward that a fused implementation may replace.

    - ``embed(wte, ids)``: rows of ``wte`` (V, d) at ``ids`` (b, t) -> (b, t, d)
    - ``layer_norm(x, weight, bias, eps)`` over the last axis (biased variance, eps inside the root)
    - ``causal_mask(t)``: what ``attention`` takes as ``mask``, made once per forward (True where a
      query may see a key); None for an attention that is causal by itself
    - ``attention(q, k, v, scale, mask)``: causal, (b, heads, t, head_dim) each -> (b, heads, t, head_dim)
    - ``gelu(x)``: the tanh approximation (Hugging Face's ``gelu_new``)
    """

    embed: Callable[[Any, Any], Any]
    layer_norm: Callable[[Any, Any, Any, float], Any]
    causal_mask: Callable[[int], Any]
    attention: Callable[[Any, Any, Any, float, Any], Any]
    gelu: Callable[[Any], Any]


def plain_ops(xp: Any, *, softmax: Callable | None = None, take: Callable | None = None) -> Ops:
    """:class:`Ops` from ``xp``'s numpy-style functions (``take where sqrt tanh arange``, and
    ``softmax(x, axis=-1)``, which numpy and ``jax.numpy`` lack: pass it). Scalars stay Python floats, so
    a bfloat16 graph stays bfloat16 (``1 / np.sqrt(d)`` would be a float64 scalar)."""
    softmax = softmax or xp.softmax
    take = take or xp.take
    c = math.sqrt(2.0 / math.pi)

    def embed(wte, ids):
        b, t = ids.shape
        return take(wte, ids.reshape(-1), axis=0).reshape(b, t, wte.shape[1])

    def layer_norm(x, w, b, eps):
        xc = x - x.mean(axis=-1, keepdims=True)
        var = (xc * xc).mean(axis=-1, keepdims=True)
        return xc / xp.sqrt(var + eps) * w + b

    def causal_mask(t):
        i = xp.arange(t)  # made on the device, not copied from the host at every call
        return i.reshape(t, 1) >= i.reshape(1, t)

    def attention(q, k, v, scale, mask):
        att = xp.where(mask, (q @ k.swapaxes(-1, -2)) * scale, -1e9)
        return softmax(att, axis=-1) @ v

    def gelu(x):
        return 0.5 * x * (1.0 + xp.tanh(c * (x + 0.044715 * x * x * x)))

    return Ops(embed, layer_norm, causal_mask, attention, gelu)


def nn_ops() -> Ops:
    """:class:`Ops` from ``lf.nn``: one kernel per layer norm, one fused attention (causal, reading the
    heads straight out of the QKV projection), the tanh GELU as a step that joins its projection's
    cuBLASLt epilogue (``graph/epilogue.py``)."""
    plain = plain_ops(lf)

    def attention(q, k, v, scale, mask):
        return lf.nn.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

    return Ops(plain.embed, lf.nn.layer_norm, lambda t: None, attention,
               lambda x: lf.nn.gelu(x, approximate="tanh"))


def numpy_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis`` in numpy (max subtracted), in the input's dtype."""
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


#: laneflow's plain ops (what :func:`forward` uses by default)
LANEFLOW_OPS = plain_ops(lf)
#: ``lf.nn``'s fused layers (:func:`nn_ops`)
NN_OPS = nn_ops()
#: numpy's (float32 in, float32 out): the numpy peer's forward
NUMPY_OPS = plain_ops(np, softmax=numpy_softmax)


@dataclass(frozen=True)
class Shard:
    """One rank's part of a tensor-parallel model (``models/gpt2_tp.py``): ``heads`` attention heads
    and the matching columns of QKV and of the MLP's first layer, the rows of both output projections;
    ``reduce`` sums the partial outputs of those projections over the ranks (before their bias)."""

    heads: int
    reduce: Callable[[Any], Any]


def forward(params: Mapping[str, Any], ids: Any, cfg: GPT2Config, ops: Ops | None = None,
            shard: Shard | None = None) -> Any:
    """Logits (b, t, vocab) of token ids (b, t): pre-LN blocks, causal attention scaled by
    1/sqrt(head_dim), tanh GELU, final layer norm, head tied to ``wte``. Arrays of one namespace,
    laneflow's by default (``ops``: see :func:`plain_ops`); works inside ``lf.compile`` with ``ids``
    (and ``params``, a dict) as arguments or ``params`` closed over. ``shard``: this rank's part of a
    tensor-parallel model (``params`` then holds the rank's slices: ``gpt2_tp.shard_params``)."""
    ops = LANEFLOW_OPS if ops is None else ops
    b, t = ids.shape
    if t > cfg.n_positions:
        raise ValueError(f"gpt2.forward: {t} tokens is more than the model's {cfg.n_positions} positions")
    scale = 1.0 / math.sqrt(cfg.head_dim)
    h = ops.embed(params[PREFIX + "wte.weight"], ids) + params[PREFIX + "wpe.weight"][:t]
    mask = ops.causal_mask(t)
    for i in range(cfg.n_layer):
        h = block(params, i, h, cfg, ops, lambda q, k, v, i: ops.attention(q, k, v, scale, mask), shard)
    return head(params, h, cfg, ops)


def block(params: Mapping[str, Any], i: int, h: Any, cfg: GPT2Config, ops: Ops, attend: Callable,
          shard: Shard | None = None) -> Any:
    """Transformer block ``i`` on ``h`` (b, t, d): ``attend(q, k, v, i)`` (heads (b, heads, t, head_dim))
    gives the attention output; the forward attends causally, a decode step to its KV cache
    (``models/gpt2_decode.py``). With a ``shard`` the block computes its heads and MLP columns and
    reduces the two output projections over the ranks."""
    P, n = params, _layer_names(i)
    b, t, d = h.shape
    nh, dh, eps = cfg.n_head, cfg.head_dim, cfg.layer_norm_epsilon
    reduce = None
    if shard is not None:
        nh, reduce = shard.heads, shard.reduce
    w = nh * dh  # this rank's width of q, k and v

    def heads(x):  # (b, t, w) -> (b, heads, t, head_dim)
        return x.reshape(b, t, nh, dh).transpose(0, 2, 1, 3)

    def project(x, weight, bias):  # x @ W + bias, the partial products summed over the ranks first
        y = x @ P[weight]
        return (y if reduce is None else reduce(y)) + P[bias]

    a = ops.layer_norm(h, P[n.ln_1_weight], P[n.ln_1_bias], eps)
    qkv = a @ P[n.attn_c_attn_weight] + P[n.attn_c_attn_bias]
    q, k, v = heads(qkv[..., :w]), heads(qkv[..., w:2 * w]), heads(qkv[..., 2 * w:])
    y = attend(q, k, v, i).transpose(0, 2, 1, 3).reshape(b, t, w)
    h = h + project(y, n.attn_c_proj_weight, n.attn_c_proj_bias)
    m = ops.layer_norm(h, P[n.ln_2_weight], P[n.ln_2_bias], eps)
    m = ops.gelu(m @ P[n.mlp_c_fc_weight] + P[n.mlp_c_fc_bias])
    return h + project(m, n.mlp_c_proj_weight, n.mlp_c_proj_bias)


#: a block's parameters, by their names after ``transformer.h.{i}.``
_BLOCK_PARAMS = ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                 "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                 "mlp.c_proj.weight", "mlp.c_proj.bias")
#: block i's full parameter names, each field named after its parameter (``ln_1.weight``: ``ln_1_weight``)
_LayerNames = NamedTuple("_LayerNames", [(k.replace(".", "_"), str) for k in _BLOCK_PARAMS])


@functools.lru_cache(maxsize=None)
def _layer_names(i: int) -> _LayerNames:
    """Block ``i``'s parameter names, made once: a forward looks up about 150 of them, and a name built
    anew (a fresh string) is hashed anew at each lookup."""
    return _LayerNames(*(f"{PREFIX}h.{i}.{k}" for k in _BLOCK_PARAMS))


def head(params: Mapping[str, Any], h: Any, cfg: GPT2Config, ops: Ops) -> Any:
    """Logits of the last hidden states: the final layer norm, then the head (tied to ``wte``)."""
    h = ops.layer_norm(h, params[PREFIX + "ln_f.weight"], params[PREFIX + "ln_f.bias"], cfg.layer_norm_epsilon)
    w = params["lm_head.weight"] if "lm_head.weight" in params else params[PREFIX + "wte.weight"]
    return h @ w.T


def reference_forward(np_params: Mapping[str, np.ndarray], ids: np.ndarray, cfg: GPT2Config,
                      dtype: Any = np.float64) -> np.ndarray:
    """GPT-2's logits in numpy, computed in ``dtype`` (float64 by default), written independently of
    :func:`forward` (einsum per head, a -inf mask) so each checks the other."""
    P = {k: np.asarray(v).astype(dtype) for k, v in np_params.items()}
    ids = np.asarray(ids)
    b, t = ids.shape
    d, nh, dh, eps = cfg.n_embd, cfg.n_head, cfg.head_dim, cfg.layer_norm_epsilon

    def norm(x, name):
        mu = x.mean(-1, keepdims=True)
        sd = np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
        return (x - mu) / sd * P[name + ".weight"] + P[name + ".bias"]

    def linear(x, name):
        return np.einsum("btk,kn->btn", x, P[name + ".weight"]) + P[name + ".bias"]

    future = np.triu(np.ones((t, t), bool), k=1)
    x = P[PREFIX + "wte.weight"][ids] + P[PREFIX + "wpe.weight"][None, :t]
    for i in range(cfg.n_layer):
        p = f"{PREFIX}h.{i}."
        qkv = linear(norm(x, p + "ln_1"), p + "attn.c_attn")
        out = np.empty((b, t, d), dtype)
        for j in range(nh):
            q, k, v = (qkv[:, :, s * d + j * dh: s * d + (j + 1) * dh] for s in range(3))
            s_ = np.einsum("bqc,bkc->bqk", q, k) / math.sqrt(dh)
            s_ = np.where(future, -np.inf, s_)
            w = np.exp(s_ - s_.max(-1, keepdims=True))
            out[:, :, j * dh:(j + 1) * dh] = np.einsum("bqk,bkc->bqc", w / w.sum(-1, keepdims=True), v)
        x = x + linear(out, p + "attn.c_proj")
        m = linear(norm(x, p + "ln_2"), p + "mlp.c_fc")
        m = 0.5 * m * (1 + np.tanh(math.sqrt(2 / math.pi) * (m + 0.044715 * m ** 3)))
        x = x + linear(m, p + "mlp.c_proj")
    x = norm(x, PREFIX + "ln_f")
    head = P.get("lm_head.weight", P[PREFIX + "wte.weight"])
    return np.einsum("btd,vd->btv", x, head)
