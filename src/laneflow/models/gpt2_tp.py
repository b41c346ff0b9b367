"""GPT-2 split over the ranks of a group (tensor parallelism, as Megatron-LM splits a transformer).

Rank r of n holds heads ``[r * H/n, (r+1) * H/n)``: those columns of the QKV projection (of q, k and v
each), the r-th n-th of the MLP's first layer's 4d columns, and the matching rows of the attention's
and the MLP's output projections. Each block then needs two all-reduces (the output
projections' partial sums, before their bias); embeddings, layer norms and the head are replicated.
The all-reduces are ``lf.distributed`` collectives: issued when made, on the communication lane,
captured into ``lf.compile``'s CUDA graph on GPUs (NCCL).

>>> g = lf.distributed.init()
>>> local = shard_params(gpt2.numpy_params(cfg), cfg, g.rank, g.size)        # numpy slices
>>> logits = forward(gpt2.to_laneflow(local), ids, cfg, group=g)            # every rank: all logits
"""

from __future__ import annotations

from typing import Any, Mapping

from . import gpt2
from .gpt2 import PREFIX, GPT2Config, Ops, Shard


def _parts(cfg: GPT2Config, rank: int, size: int, op: str = "gpt2_tp") -> tuple[slice, slice]:
    """(this rank's slice of the d attention columns, of the 4d MLP columns)."""
    if not 0 <= rank < size:
        raise ValueError(f"{op}: rank {rank} is not in 0..{size - 1}")
    if cfg.n_head % size:
        raise ValueError(f"{op}: {cfg.n_head} heads do not split over {size} ranks; use a rank count that "
                         "divides the head count")
    d = cfg.n_embd
    w, f = d // size, 4 * d // size
    return slice(rank * w, (rank + 1) * w), slice(rank * f, (rank + 1) * f)


def shard_params(params: Mapping[str, Any], cfg: GPT2Config, rank: int, size: int) -> dict[str, Any]:
    """Rank ``rank``'s parameters of a model split over ``size`` ranks, from the whole model's
    (numpy arrays or lf.Arrays; Hugging Face's names and Conv1D layout, as :mod:`gpt2` reads them)."""
    cols, fcols = _parts(cfg, rank, size)
    d = cfg.n_embd
    thirds = [slice(k * d + cols.start, k * d + cols.stop) for k in range(3)]  # q, k and v's columns
    out = dict(params)
    for i in range(cfg.n_layer):
        p = f"{PREFIX}h.{i}."
        for name in ("attn.c_attn.weight", "attn.c_attn.bias"):
            a = params[p + name]
            out[p + name] = a.__array_namespace__().concatenate([a[..., c] for c in thirds], axis=-1)
        out[p + "attn.c_proj.weight"] = params[p + "attn.c_proj.weight"][cols]
        out[p + "mlp.c_fc.weight"] = params[p + "mlp.c_fc.weight"][:, fcols]
        out[p + "mlp.c_fc.bias"] = params[p + "mlp.c_fc.bias"][fcols]
        out[p + "mlp.c_proj.weight"] = params[p + "mlp.c_proj.weight"][fcols]
    return out


def shard(cfg: GPT2Config, group: Any) -> Shard:
    """The :class:`gpt2.Shard` of this rank of ``group``: its head count, and the sum over the group."""
    from .. import distributed as dist
    _parts(cfg, group.rank, group.size)
    return Shard(cfg.n_head // group.size, lambda y: dist.all_reduce(y, "sum", group=group))


def forward(params: Mapping[str, Any], ids: Any, cfg: GPT2Config, ops: Ops | None = None, *,
            group: Any = None) -> Any:
    """The logits (b, t, vocab) of the whole model on every rank, each computing its shard
    (``params``: :func:`shard_params` of this rank); ``group``: the world group by default."""
    from .. import distributed as dist
    return gpt2.forward(params, ids, cfg, ops, shard(cfg, group or dist.world()))
