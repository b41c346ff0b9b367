"""gpt2: one GPT-2 forward (the logits of B x T token ids), laneflow's plain-op model against the peers.

Sizes: on the GPU GPT-2 small (12 layers, 768 wide, 12 heads, vocabulary 50257) in bfloat16, 16 tokens
at B=1 and B=8, as ``anchors/probe_gpt2.py`` measured the peers; on the CPU a small GPT-2-like model
(4 layers, 64 wide, 4 heads, vocabulary 1024) in float32 with 8 tokens; ``--quick`` the tiny test model.
Every row gets the same seeded weights (:func:`laneflow.models.gpt2.numpy_params`, rounded once to the
case's dtype) and the same ids.

Rows, for the model written with ``lf.nn`` (fused layer norms and attention, "laneflow lf.nn ...")
and with plain numpy-style ops ("laneflow ..."): ``laneflow eager, first call`` (one sample: the first forward of these shapes in this process,
graph building and any kernel compile included; what a plan cache's miss will cost), ``laneflow
eager`` on 1 and on several lanes (later calls, one ``lf.eval`` each; a cache hit), ``laneflow
compiled`` (``lf.compile`` with the weights as arguments), ``... weights captured`` (closed over) and
``... ids from a device op`` (see :func:`_device_ids`);
then torch (transformers' ``GPT2LMHeadModel``, sdpa attention, eager and a CUDA graph), jax (``jax.jit``
of the same numpy-style forward), mlx (eager and ``mx.compile``) and numpy (CPU), where importable;
torch and jax also show their first call (``harness.first_call``: the first forward of these shapes,
jax's trace and compile included), the peer of laneflow's.

Checks: every row's logits against a float32 numpy reference written independently of the model
(:func:`laneflow.models.gpt2.reference_forward`), within 5e-2 x max |logit| for bfloat16 (8 mantissa
bits, rounded at every op of 12 blocks; the harness's default for 2-byte floats) and 5e-3 for float32
(allows TF32 matmuls, which JAX uses on GPUs by default). With the torch peer and transformers
importable, a row ``check: laneflow float32 = transformers float32`` runs one forward of the case
through both in float32 on the same weights (the bfloat16-rounded ones on the GPU), for the plain-op
model and for the lf.nn model ("check: laneflow lf.nn float32 = ..."), and requires
1e-4 x max |logit|; its ``max |diff|`` column is the figure.

Floor: ``bytes`` is what one forward must move: every weight read once (249 MB in bfloat16 for GPT-2
small), the ids read and the logits written; ``flops`` its matrix products.
"""

from __future__ import annotations


import numpy as np

import laneflow as lf

from ...graph import speculate
from ...models import gpt2 as model
from .. import laneflow_impls as lfi
from ..harness import FIRST_CALL_NOTE, Case, Impl, Result, compare, first_call, skipped, suite
from ..peers import PeerUnavailable
from .common import SEED, dtype

#: The CPU size: a small GPT-2-like model the project's CPU target compares with the same code in numpy.
CPU_CONFIG = model.GPT2Config(n_layer=4, n_embd=64, n_head=4, vocab_size=1024, n_positions=64)
#: laneflow float32 against transformers float32: two float32 implementations of the same math.
HF_RTOL = 1e-4
HF_CHECK = "check: laneflow float32 = transformers float32"
DEVICE_IDS = "laneflow compiled, weights captured, ids from a device op"
#: The rows of the model written with lf.nn (``models.gpt2.NN_OPS``) read "laneflow lf.nn ..."
NN_TAG = "lf.nn"


@suite("gpt2", "GPT-2 forward (logits of B x T tokens): GPT-2 small in bf16 on a GPU, a small model on the CPU", interleave=True)
def run(ctx):
    p = ctx.size(quick=dict(config=model.GPT2Config.tiny(), T=8, B=(1, 2), dtype="float32"),
                 cpu=dict(config=CPU_CONFIG, T=8, B=(1, 8), dtype="float32"),
                 gpu=dict(config=model.GPT2Config(), T=16, B=(1, 8), dtype="bfloat16"))
    cfg, dt = p["config"], dtype(p["dtype"])
    weights = {k: v.astype(dt) for k, v in model.numpy_params(cfg, seed=SEED).items()}
    results = []
    for B in p["B"]:
        results.extend(_case(ctx, cfg, weights, B, p["T"], dt))
    return results


def _case(ctx, cfg: model.GPT2Config, weights: dict, B: int, T: int, dt: np.dtype) -> list[Result]:
    ids = np.random.default_rng(SEED + B).integers(0, cfg.vocab_size, (B, T)).astype(np.int32)
    ref = model.reference_forward(weights, ids, cfg, dtype=np.float32)
    weight_bytes = sum(w.nbytes for w in weights.values())
    what = "GPT-2 small" if cfg == model.GPT2Config() else f"GPT-2-like {cfg.n_layer} layers x {cfg.n_embd}"
    case = Case("gpt2", f"{what} ({cfg.n_head} heads, vocab {cfg.vocab_size}) forward, {B} x {T} tokens, {dt.name}",
                {"ids": ids}, ref, bytes=weight_bytes + ids.nbytes + ref.size * dt.itemsize,
                flops=cfg.matmul_flops(B, T), dtype=dt,
                params={"config": cfg, "weights": weights, "B": B, "T": T})
    names = list(weights)
    inputs = [ids] + [weights[k] for k in names]

    rows = []
    for ops, tag in ((model.NN_OPS, NN_TAG), (model.LANEFLOW_OPS, "")):
        rows += _laneflow_rows(ctx, case, cfg, names, inputs, ids, ops, tag)
    results = ctx.run_case(case, "gpt2", rows)
    if "torch" in ctx.peers and lfi.unavailable(ctx.device) is None:
        for ops, tag in ((model.LANEFLOW_OPS, ""), (model.NN_OPS, NN_TAG)):
            results.append(_transformers_check(case, ctx.device, cfg, weights, ids, ops, tag))
    return results


def _laneflow_rows(ctx, case: Case, cfg, names: list, inputs: list, ids: np.ndarray, ops, tag: str) -> list:
    """laneflow's rows for the model written with ``ops`` (``tag`` marks the row names: the lf.nn
    model's rows read ``laneflow lf.nn ...``, the plain-op model's ``laneflow ...``)."""
    def program(ids, *ws):
        return model.forward(dict(zip(names, ws)), ids, cfg, ops)

    def make(ws):
        params = dict(zip(names, ws))
        return lambda ids: model.forward(params, ids, cfg, ops)

    why = lfi.unavailable(ctx.device)
    rows = [] if why is not None else [_first_call(case, ctx.device, ctx.floors, program, inputs)]
    rows += lfi.modes(case, ctx.device, ctx.lanes, program, inputs)
    if why is None and ctx.device.type in speculate.DEVICES:
        rows.append(lfi.guard(case, "laneflow eager, not speculated", 1, lambda: lfi.unspeculated(
            lfi.eager(case, ctx.device, program, inputs, 1, note="the plan cache's hits; the GPU starts at lf.eval"))))
    if why is None:
        rows.append(lfi.guard(case, "laneflow eager, not taped", 1, lambda: lfi.untaped(
            lfi.eager(case, ctx.device, program, inputs, 1, note="the plan cache's hits; every op builds its node"))))
    if why is None:
        rows.append(lfi.guard(case, "laneflow compiled, weights captured", ctx.lanes,
                              lambda: lfi.compiled_captured(case, ctx.device, make, [ids], inputs[1:], ctx.lanes)))
        if not tag:
            rows.append(lfi.guard(case, DEVICE_IDS, ctx.lanes, lambda: _device_ids(case, ctx, make, ids, inputs[1:])))
    if tag:
        for r in rows:
            if isinstance(r, Result):
                r.impl = r.impl.replace("laneflow", "laneflow " + tag, 1)
            else:
                r.name = r.name.replace("laneflow", "laneflow " + tag, 1)
    return rows


def _device_ids(case: Case, ctx, make, ids: np.ndarray, weights: list):
    """The captured-weights row, called with ids that a device op made. On the GPU small arrays
    uploaded from the host keep a host copy, and a compiled call whose index argument has one runs as
    commands, not as the CUDA graph (the bounds are checked on the host, as eager does). Ids computed on
    the device have no host copy; today an index kernel with device indices also keeps a compiled
    function on commands (docs/cuda-notes.md, open work), and once that is mended this row is the one
    that replays the graph."""
    made = lf.array(ids, device=ctx.device) + 0
    lf.eval(made)
    impl = lfi.compiled_captured(case, ctx.device, make, [made], weights, ctx.lanes)
    impl.name, impl.note = DEVICE_IDS, "ids = lf.array(ids) + 0: no host copy"
    return impl


def _first_call(case: Case, device, floors, program, inputs) -> Result:
    """The first forward of these shapes on a fresh stream, timed alone (one sample), and checked."""
    label = "laneflow eager, first call"

    def make() -> Impl:
        s = lf.new_stream(device, lanes=1)
        args = [lf.array(a, stream=s) for a in inputs]
        lf.eval(*args)
        s.synchronize()

        def run():
            with lf.stream(s):
                y = program(*args)
            lf.eval(y)
            return y

        return Impl(label, run, lanes=1, sync=s.synchronize, close=s.close, note=FIRST_CALL_NOTE)

    impl = lfi.guard(case, label, 1, make)
    return impl if isinstance(impl, Result) else first_call(case, impl, floors)


def _transformers_check(case: Case, device, cfg: model.GPT2Config, weights: dict, ids: np.ndarray,
                        ops=None, tag: str = "") -> Result:
    """laneflow's float32 logits (the model written with ``ops``) against transformers' float32 logits
    (on the CPU), same weights."""
    from ..peers.torch_peer import hf_gpt2_logits  # (here: torch_peer imports the suites)

    label = HF_CHECK.replace("laneflow", "laneflow " + tag, 1) if tag else HF_CHECK
    w32 = {k: v.astype(np.float32) for k, v in weights.items()}
    try:
        theirs = hf_gpt2_logits(cfg, w32, ids)
    except PeerUnavailable as e:
        return skipped(case, label, str(e))
    res = Result(case.suite, case.name, label, lanes=1, checked=True,
                 note="one float32 forward of these ids through both; transformers on the CPU")
    try:
        s = lf.new_stream(device, lanes=1)
        with lf.stream(s):
            ours = np.asarray(model.forward(model.to_laneflow(w32, lf.float32), ids, cfg, ops))
        s.close()
        _judge(res, compare(ours, theirs), HF_RTOL)
        res.extra["max_abs_logit"] = round(float(np.max(np.abs(theirs))), 4)
    except Exception as e:  # noqa: BLE001
        res.error = f"{type(e).__name__}: {e}"[:300]
    return res


def _judge(res: Result, pairs: list[tuple[float, float]], rtol: float) -> None:
    res.rtol = rtol
    res.max_abs_diff = max(d for d, _ in pairs)
    res.matches = all(d <= rtol * s for d, s in pairs)
