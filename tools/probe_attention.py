"""lf.nn.scaled_dot_product_attention on the GPU: the NVRTC kernel against cuDNN's fused SDPA, by shape.

    python tools/probe_attention.py            # a table last; with $OUT set, also $OUT/probe_attention.{txt,json}

For each shape (bf16; GPT-2 prefills, decode steps, longer causal prefills) and each implementation
(``LANEFLOW_ATTENTION=nvrtc`` / ``cudnn``, set per row), on a one-lane stream:

- ``eager``: wall microseconds per call, ``o = sdpa(q, k, v); lf.eval(o)`` with the same inputs (after
  the first call: cuDNN's graph is built, kernels are compiled), synchronised once at the end;
- ``compiled``: wall microseconds per call of ``lf.compile(sdpa)`` (a CUDA graph from the second call);
  ``graph`` says whether it became one (``mode`` of ``f.stats()``: whether cuDNN was captured);
- ``device``: GPU microseconds per attention, device events around replays of a compiled function
  holding R attentions (so launch gaps are spread over R);
- ``err``: max |o - ref| against a float32 numpy reference; ``ran``: which implementation the eager
  calls really used (``lf.cuda.attention_stats()``; a fallback prints its reason below the table).

cuDNN missing (no frontend, no library): its rows say so and the NVRTC rows still run. Every shape and
implementation is measured in its own ``try``: a failure prints its traceback's tail and the probe
goes on. The last lines suggest auto's threshold (``AUTO_CUDNN_MIN_SCORES``, attention_choice.py).
"""

from __future__ import annotations

import json
import math
import os
import time
import traceback

import numpy as np

import laneflow as lf

R = 10  # attentions per compiled replay for the device figure
SHAPES = [  # name, B, H, Tq, Tk, D, causal
    ("gpt2 prefill B1", 1, 12, 16, 16, 64, True),
    ("gpt2 prefill B8", 8, 12, 16, 16, 64, True),
    ("decode B1 Tk256", 1, 12, 1, 256, 64, True),
    ("decode B8 Tk256", 8, 12, 1, 256, 64, True),
    ("prefill T128", 1, 12, 128, 128, 64, True),
    ("prefill T512", 1, 12, 512, 512, 64, True),
    ("prefill T1024", 1, 12, 1024, 1024, 64, True),
    ("prefill T2048", 1, 12, 2048, 2048, 64, True),
]
IMPLS = ("nvrtc", "cudnn")
_lines: list[str] = []


def say(line: str = "") -> None:
    print(line, flush=True)
    _lines.append(line)


def _reference(q, k, v, causal: bool) -> np.ndarray:
    """float32 SDPA, bottom-right causal (laneflow's), all heads at once."""
    q, k, v = (a.astype(np.float32) for a in (q, k, v))
    Tq, Tk = q.shape[2], k.shape[2]
    s = (q @ k.transpose(0, 1, 3, 2)) / np.float32(math.sqrt(q.shape[3]))  # matmul: BLAS, einsum is slow here
    if causal:
        ok = np.arange(Tk)[None, :] <= np.arange(Tq)[:, None] + (Tk - Tq)
        s = np.where(ok, s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(-1, keepdims=True)) @ v


def _reps(once_s: float, budget_s: float = 0.3) -> int:
    return int(min(200, max(5, budget_s / max(once_s, 1e-6))))


def _wall(call, n: int) -> float:
    lf.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        y = call()
    lf.eval(y)
    lf.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def measure(stream, impl: str, name: str, B: int, H: int, Tq: int, Tk: int, D: int, causal: bool,
            inputs, ref) -> dict:
    os.environ["LANEFLOW_ATTENTION"] = impl
    q, k, v = inputs
    row: dict = {"shape": name, "impl": impl, "Tq*Tk": Tq * Tk}

    def sdpa(q, k, v):
        return lf.nn.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def one():
        o = sdpa(q, k, v)
        lf.eval(o)
        return o

    lf.cuda.reset_attention_stats()
    t0 = time.perf_counter()
    o = one()
    lf.synchronize()
    first = time.perf_counter() - t0
    row["err"] = float(np.abs(np.asarray(o).astype(np.float32) - ref).max())
    row["eager_us"] = _wall(one, _reps(first))
    st = lf.cuda.attention_stats()
    row["ran"] = "cudnn" if st["cudnn"] and not st["nvrtc"] else "nvrtc" if st["nvrtc"] and not st["cudnn"] else "mixed"
    row["fallbacks"] = st["fallbacks"]

    f = lf.compile(sdpa)
    for _ in range(3):
        lf.eval(f(q, k, v))
    row["compiled_us"] = _wall(lambda: f(q, k, v), _reps(first))
    (fs,) = f.stats()
    row["graph"] = fs["mode"] == "cuda graph"
    row["graph_note"] = fs.get("note")
    row["compiled_same_bits"] = bool(np.array_equal(np.asarray(f(q, k, v)), np.asarray(o)))

    many = lf.compile(lambda q, k, v: [sdpa(q, k, v) for _ in range(R)])
    for _ in range(3):
        lf.eval(*many(q, k, v))
    timer = stream.backend.event_timer(stream)
    n = max(3, _reps(first * R, 0.2))
    timer.start()
    for _ in range(n):
        ys = many(q, k, v)
    lf.eval(*ys)
    row["device_us"] = timer.stop() / n / R * 1e6
    return row


def _fmt(row: dict) -> str:
    if "error" in row:
        return f"{row['shape']:<17} {row['impl']:<6} {row['error']}"
    return (f"{row['shape']:<17} {row['impl']:<6} {row['ran']:<6} {row['eager_us']:>9.1f} {row['compiled_us']:>9.1f} "
            f"{'yes' if row['graph'] else 'NO':>5} {row['device_us']:>9.2f} {row['err']:>9.2e}")


def main() -> None:
    from laneflow.backends.cuda import cudnn_attention

    if not lf.gpu_available():
        say("probe_attention: no usable GPU; nothing to measure")
        return
    why = cudnn_attention.unavailable_reason()
    cudnn = cudnn_attention._frontend_or_none()
    say(f"probe_attention: laneflow on {lf.gpu}; cuDNN: "
        + (f"frontend {getattr(cudnn, '__version__', '?')}, backend {cudnn.backend_version()}" if why is None
           else f"UNAVAILABLE ({why}); only the NVRTC rows run"))
    rng = np.random.default_rng(0)
    rows: list[dict] = []
    stream = lf.new_stream(lf.gpu, lanes=1)
    with lf.stream(stream):
        for name, B, H, Tq, Tk, D, causal in SHAPES:
            qh, kh, vh = (rng.standard_normal(s).astype(lf.bfloat16)
                          for s in ((B, H, Tq, D), (B, H, Tk, D), (B, H, Tk, D)))
            ref = _reference(qh, kh, vh, causal)
            inputs = (lf.array(qh), lf.array(kh), lf.array(vh))
            for impl in IMPLS:
                if impl == "cudnn" and why is not None:
                    rows.append({"shape": name, "impl": impl, "error": "cuDNN unavailable"})
                    continue
                try:
                    rows.append(measure(stream, impl, name, B, H, Tq, Tk, D, causal, inputs, ref))
                except Exception as e:  # noqa: BLE001 - a probe reports and goes on
                    say(f"{name} {impl}: FAILED {type(e).__name__}: {e}")
                    say(traceback.format_exc()[-1500:])
                    rows.append({"shape": name, "impl": impl, "error": f"failed: {type(e).__name__}"})
                say(_fmt(rows[-1]))
    os.environ.pop("LANEFLOW_ATTENTION", None)
    _report(rows)


def _report(rows: list[dict]) -> None:
    say()
    for r in rows:
        for reason, count in (r.get("fallbacks") or {}).items():
            say(f"fallback ({r['shape']}, {r['impl']}, {count}x): {reason}")
        if "compiled_same_bits" in r and not r["compiled_same_bits"]:
            say(f"compiled result differs from eager ({r['shape']}, {r['impl']})")
        if r.get("graph_note"):
            say(f"not a graph ({r['shape']}, {r['impl']}): {r['graph_note']}")
    say()
    say("crossover (cuDNN faster than NVRTC?), per shape: eager wall / compiled wall / device")
    by = {(r["shape"], r["impl"]): r for r in rows if "error" not in r}
    wins = {"eager_us": [], "compiled_us": [], "device_us": []}
    for name, *_ in SHAPES:
        a, b = by.get((name, "nvrtc")), by.get((name, "cudnn"))
        if not a or not b or b["ran"] != "cudnn":
            continue
        marks = []
        for key in wins:
            win = b[key] < a[key]
            marks.append("cudnn" if win else "nvrtc")
            if win:
                wins[key].append(b["Tq*Tk"])
        say(f"  {name:<17} Tq*Tk={b['Tq*Tk']:<8} " + " / ".join(marks))
    for key, scores in wins.items():
        say(f"  smallest Tq*Tk where cuDNN wins on {key}: {min(scores) if scores else 'none measured'}")
    say()
    say(f"{'shape':<17} {'impl':<6} {'ran':<6} {'eager us':>9} {'compl us':>9} {'graph':>5} {'device us':>9} {'max err':>9}")
    for r in rows:
        say(_fmt(r))
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "probe_attention.txt"), "w") as fh:
            fh.write("\n".join(_lines) + "\n")
        with open(os.path.join(out, "probe_attention.json"), "w") as fh:
            json.dump(rows, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
