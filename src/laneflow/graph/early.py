"""Early launch: an eager forward's work starts on the GPU while its Python still builds the rest.

laneflow is lazy: an op makes a node, and nothing runs before ``lf.eval``, ``lf.async_eval`` or a host
read. A model written in plain ops makes hundreds of nodes before its one eval, so without this the
GPU idles while Python builds the graph, and all of the GPU's time comes after it (GPT-2 small on a
cache hit: about 1 ms of graph building, then 0.46 ms of GPU work).

Early launch: once :data:`EVERY` matrix products have been made on GPU streams since the last
scheduling, the next one first schedules its pending operands, as ``lf.async_eval`` would, and the
program goes on while they run. Each piece is a graph of its own in the plan cache, so a repeated
forward hits a plan per piece (its templates are told apart by ``eval_templates``). A matrix product's
operands are where a model's work naturally splits (a layer norm's or an activation's output), and
an operand that is a layout change (reshape, transpose, slice, broadcast) is left pending: evaluating
it would make it a copy that the whole graph does as a view.

What it changes for a program: values are computed in pieces rather than in one graph. The values are
the same up to rounding: a piece is planned on its own, so products that one graph would group into one
GEMM, or matmul epilogues (a bias add still held by a variable when the piece launches is not folded
in), may be done otherwise, and float32 results may differ in the last bits (bfloat16 GPT-2 matched bit
for bit on the H200). Errors of the work raise where the values are needed, as after ``lf.async_eval``;
an error while launching (a closed stream, no memory) leaves the operands pending, and the evaluation
that needs them raises it. CPU streams never launch early (their commands run on the host, which gains
nothing from starting sooner), nor does anything inside ``lf.compile``'s tracing, and only products on
launching streams count.

``EVERY`` is set by :func:`laneflow.set_early_launch` or ``LANEFLOW_EARLY_LAUNCH=n`` at start-up. It is
**off by default** (0): each launch costs the host a plan-cache hit of its own (a template match, an
executor launch, the piece's outputs made), measured at about 200 us on the H200's host and 60-80 us on
the fake driver, more than the GPU time a piece of GPT-2 small hides (454 us for the whole forward).
On GPT-2 small (lf.nn, B=1, 16 tokens, bf16, a cache hit; ``tools/probe_hit_gpu.py --every 0,4,8,12``,
H200, 2026-12-04) one forward timed as ``bench gpt2`` does took 2139 us off, 3991 us at 4, 2972 us at 8
and 2291 us at 12. It can only pay where a piece's GPU time is larger than that cost (large batches, large
models, long sequences), which no bench has measured yet.
"""

from __future__ import annotations

import os

from . import eval_cache
from . import schedule as _sched
from . import tracer as _tracer

#: matrix products made on GPU streams between launches (0, the default: early launch off)
EVERY = max(0, int(os.environ.get("LANEFLOW_EARLY_LAUNCH", "0")))
#: device types whose streams launch early (the tests add "cpu", to check the pieces against numpy on
#: every machine)
DEVICES = frozenset({"gpu"})
#: primitives that are layout changes: never scheduled on their own here (see the module docstring)
_LAYOUT = frozenset({"reshape", "transpose", "broadcast_to", "getitem"})
#: the counter: matrix products made since the last scheduling (``eval_cache.schedule`` resets it)
MADE = eval_cache.PRODUCTS


def set_every(n: int) -> None:
    """Launch after every ``n`` matrix products (0: never)."""
    global EVERY
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"set_early_launch: expected a count >= 0 (0 turns early launch off), got {n!r}")
    EVERY = n


def matmul_made(st, operands: tuple) -> None:
    """A matrix product is about to be made on ``st`` from ``operands`` (their ArrayData): count it,
    and when the count reaches ``EVERY``, schedule the operands' pending work first."""
    if st.device.type not in DEVICES or _tracer.ACTIVE[0] or eval_cache.building():
        return
    n = MADE[0] = MADE[0] + 1
    if n < EVERY or not EVERY:
        return
    roots = []
    for d in operands:
        p = d.prim  # (read once: another thread's evaluation may finish d meanwhile)
        if p is not None and p.kind not in _LAYOUT:
            roots.append(d)
    if not roots:
        return  # counted still: the next product launches
    with _sched.LOCK:
        eval_cache.STATS["early_launches"] += 1
        eval_cache.EARLY[0] = True
        try:
            eval_cache.start(roots)  # as lf.async_eval
        except Exception:  # noqa: BLE001 - optional work: what failed stays pending, and its eval raises it
            pass
        finally:
            eval_cache.EARLY[0] = False
