"""``python -m laneflow demo``: one mixture-of-experts step, 1 lane vs several, checked and traced.

The step is ordinary sequential code: a softmax gate, then E expert branches (matmul, tanh,
matmul, scaled by the gate) summed. The branches are independent, so on a stream with several
lanes the encoder runs them at the same time, inserting waits only where the sum needs a branch.
The demo times it eager on 1 lane, eager on several lanes and compiled (once ``lf.compile``
exists), checks every output against numpy, prints a table, and writes a timeline picture and a
Perfetto trace of the multi-lane run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import laneflow as lf

from .bench.cli import _positive
from .bench.report import fmt_diff, print_table


@dataclass(frozen=True)
class MoE:
    batch: int
    d_model: int
    d_hidden: int
    experts: int

    def describe(self) -> str:
        return (f"{self.experts} experts, x {self.batch}x{self.d_model}, "
                f"hidden {self.d_hidden}, float32")


#: Sized so the whole CPU demo takes a few seconds on two cores.
SIZES = {"cpu": MoE(batch=128, d_model=256, d_hidden=1024, experts=8),
         "gpu": MoE(batch=64, d_model=1024, d_hidden=4096, experts=16)}


def make_inputs(m: MoE, seed: int = 0) -> list[np.ndarray]:
    """[x, w_gate, w_in_0..w_in_{E-1}, w_out_0..w_out_{E-1}] as float32 numpy arrays."""
    rng = np.random.default_rng(seed)
    f = np.float32
    x = rng.standard_normal((m.batch, m.d_model), dtype=f)
    wg = rng.standard_normal((m.d_model, m.experts), dtype=f) / f(np.sqrt(m.d_model))
    w_in = [rng.standard_normal((m.d_model, m.d_hidden), dtype=f) / f(np.sqrt(m.d_model)) for _ in range(m.experts)]
    w_out = [rng.standard_normal((m.d_hidden, m.d_model), dtype=f) / f(np.sqrt(m.d_hidden)) for _ in range(m.experts)]
    return [x, wg] + w_in + w_out


def moe_step(x: lf.Array, w_gate: lf.Array, *weights: lf.Array) -> lf.Array:
    """out = sum_e gate[:, e] * (tanh(x @ w_in_e) @ w_out_e), gate = softmax(x @ w_gate)."""
    n = len(weights) // 2
    gate = lf.softmax(x @ w_gate, axis=-1)
    out = None
    for e in range(n):
        y = (lf.tanh(x @ weights[e]) @ weights[n + e]) * gate[:, e:e + 1]
        out = y if out is None else out + y
    return out


def reference(inputs: list[np.ndarray]) -> np.ndarray:
    x, wg, *weights = (a.astype(np.float64) for a in inputs)
    n = len(weights) // 2
    z = x @ wg
    g = np.exp(z - z.max(axis=-1, keepdims=True))
    g /= g.sum(axis=-1, keepdims=True)
    return sum(np.tanh(x @ weights[e]) @ weights[n + e] * g[:, e:e + 1] for e in range(n))


@dataclass
class Mode:
    """One way to run the step; timed round-robin with the others so machine noise hits all alike."""

    name: str
    lanes: str
    step: Callable[[], Any]  # one step, finished when it returns; returns the output
    times: list[float] = field(default_factory=list)
    out: np.ndarray | None = None
    waits: list[int] = field(default_factory=lambda: [0, 0])  # emitted, elided (summed over steps)
    error: str | None = None


def _laneflow_mode(name: str, stream: Any, program: Callable, inputs: list[np.ndarray]) -> Mode:
    args = [lf.array(a, stream=stream) for a in inputs]
    lf.eval(*args)

    def step():
        with lf.stream(stream):
            y = program(*args)
        lf.eval(y)
        return y
    return Mode(name, str(stream.num_lanes), step)


def _numpy_mode(inputs: list[np.ndarray]) -> Mode:
    x, wg, *weights = inputs
    n = len(weights) // 2

    def step():
        z = x @ wg
        g = np.exp(z - z.max(axis=-1, keepdims=True))
        g /= g.sum(axis=-1, keepdims=True)
        out = None
        for e in range(n):
            y = np.tanh(x @ weights[e]) @ weights[n + e] * g[:, e:e + 1]
            out = y if out is None else out + y
        return out
    return Mode("numpy (reference)", "-", step)


def _time_modes(modes: list[Mode], repeat: int, warmup: int = 2) -> None:
    for m in modes:
        try:
            for _ in range(warmup):  # warm-up (and, for compile, the trace)
                m.step()
        except Exception as e:  # noqa: BLE001 - a failing mode is reported in the table
            m.error = f"{type(e).__name__}: {e}"
    live = [m for m in modes if m.error is None]
    for _ in range(repeat):
        for m in live:
            lf.reset_stats()
            t = time.perf_counter()
            y = m.step()
            m.times.append(time.perf_counter() - t)
            st = lf.stats()
            m.waits[0] += st["waits_emitted"]
            m.waits[1] += st["waits_elided"]
            m.out = np.array(y, dtype=np.float64)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="run a multi-branch step on 1 lane vs several; table, timeline, trace",
                       description="Run a mixture-of-experts step eager on 1 lane, eager on several lanes and "
                                   "compiled; check outputs agree with numpy; print a table; write a timeline "
                                   "PNG and a Perfetto trace of the multi-lane run.")
    p.add_argument("--device", choices=("cpu", "gpu"), default=None,
                   help="default: the GPU when laneflow can use one, else the CPU")
    p.add_argument("--out", default="laneflow-out", metavar="DIR",
                   help="where the timeline and trace go (default: ./laneflow-out)")
    p.add_argument("--lanes", type=_positive, default=None, help="lanes of the multi-lane stream (default 4)")
    p.add_argument("--repeat", type=_positive, default=None, help="timed steps per mode (default 10 CPU, 20 GPU)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.device == "gpu" and not lf.gpu_available():
        print("demo: --device gpu, but laneflow cannot use a GPU here (no CUDA backend or driver); "
              "use --device cpu")
        return 2
    device = lf.Device(args.device) if args.device else (lf.gpu if lf.gpu_available() else lf.cpu)
    lanes = args.lanes or 4
    if lanes < 2:
        print("demo: --lanes must be at least 2 (the point is 1 lane vs several)")
        return 2
    repeat = args.repeat or (10 if device.type == "cpu" else 20)
    m = SIZES[device.type]
    inputs = make_inputs(m)
    ref = reference(inputs)
    print(f"laneflow {lf.__version__} demo on {device}: one MoE step ({m.describe()}), {repeat} timed steps per mode")

    one = lf.new_stream(device, lanes=1)
    multi = lf.new_stream(device, lanes=lanes)
    modes = [_laneflow_mode("eager", one, moe_step, inputs), _laneflow_mode("eager", multi, moe_step, inputs)]
    if hasattr(lf, "compile"):
        modes.append(_laneflow_mode("compiled", multi, lf.compile(moe_step), inputs))
    else:
        print("compiled: not available yet")
    if device.type == "cpu":
        modes.append(_numpy_mode(inputs))
    _time_modes(modes, repeat)

    scale = float(np.max(np.abs(ref)))
    tol = (1e-3 if device.type == "cpu" else 1e-2) * scale  # GPU matmuls may use TF32
    base = statistics.median(modes[0].times) if modes[0].times else None
    table, ok = [], True
    for m in modes:
        if m.error is not None:
            table.append([m.name, m.lanes, "failed", "-", "-", m.error[:60], "-"])
            ok = False
            continue
        med = statistics.median(m.times)
        diff = float(np.max(np.abs(m.out - ref)))
        ok &= diff <= tol
        waits = "-" if m.lanes == "-" else f"{m.waits[0] / repeat:g} / {m.waits[1] / repeat:g}"
        table.append([m.name, m.lanes, f"{med * 1e3:.2f}", f"{min(m.times) * 1e3:.2f} - {max(m.times) * 1e3:.2f}",
                      f"{base / med:.2f}x" if base else "-", fmt_diff(diff) + ("" if diff <= tol else " MISMATCH"),
                      waits])
    print_table(f"MoE step on {device}", ["mode", "lanes", "median ms", "min - max ms", "speedup",
                                          "max |diff| vs numpy", "waits/step emitted / elided"], table,
                footer=f"speedup vs eager on 1 lane; modes timed round-robin; outputs checked against a float64 "
                       f"numpy reference (tolerance {tol:.1e}); waits from lf.stats()")

    os.makedirs(args.out, exist_ok=True)
    with lf.trace() as t:
        modes[1].step()  # eager on the multi-lane stream, already warm
    trace_path = os.path.join(args.out, "trace.json")
    png_path = os.path.join(args.out, "timeline.png")
    t.save(trace_path)
    s = t.summary()
    busy = sum(v["busy"] for v in s["lanes"].values())
    print(f"trace of one {lanes}-lane step: {s['commands']} commands on {len(s['lanes'])} lanes; "
          f"lanes busy {busy * 1e3:.2f} ms within a {s['span'] * 1e3:.2f} ms span "
          f"(average concurrency {busy / s['span'] if s['span'] > 0 else 0:.2f})")
    print(f"wrote {trace_path} (open in https://ui.perfetto.dev)")
    try:
        t.plot(png_path, title=f"laneflow demo: one MoE step on {lanes} lanes ({device})")
        print(f"wrote {png_path}")
    except ImportError as e:
        print(f"timeline.png skipped: {e}")
    if not ok:
        print("demo: outputs did not agree (see MISMATCH above)")
    return 0 if ok else 1
