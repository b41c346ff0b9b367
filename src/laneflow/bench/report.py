"""Tables (rich when importable, plain text otherwise) and the JSON record of a run."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from typing import Any, Sequence

import numpy as np

import laneflow

from .harness import Result


# -- plain table helpers (also used by the demo) ------------------------------------------------

def fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-6:
        return f"{s * 1e9:.1f} ns"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1.0:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s"


def fmt_diff(d: float | None) -> str:
    return "-" if d is None else f"{d:.1e}"


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], footer: str | None = None,
                file: Any = None) -> None:
    """A table on stdout: rich when importable, aligned plain text otherwise."""
    file = file or sys.stdout
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        _plain_table(title, headers, rows, footer, file)
        return
    width = None if file.isatty() else 200  # logs and pipes: no wrapping
    console = Console(file=file, width=width, highlight=False, soft_wrap=False)
    table = Table(title=title, title_justify="left", header_style="bold")
    for k, h in enumerate(headers):
        table.add_column(h, justify="left" if k == 0 or h == "note" else "right", overflow="fold")
    for r in rows:
        table.add_row(*[str(c) for c in r])
    console.print(table)
    if footer:
        console.print(footer, style="dim")


def _plain_table(title, headers, rows, footer, file) -> None:
    cells = [list(map(str, headers))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[k]) for r in cells) for k in range(len(headers))]
    line = lambda r: "  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    print(title, file=file)
    print(line(cells[0]), file=file)
    print("  ".join("-" * w for w in widths), file=file)
    for r in cells[1:]:
        print(line(r), file=file)
    if footer:
        print(footer, file=file)


# -- suite results ------------------------------------------------------------------------------

def _baseline(rs: Sequence[Result]) -> Result | None:
    for r in rs:
        if r.impl == "laneflow eager" and r.lanes == 1 and r.times:
            return r
    return next((r for r in rs if r.times), None)


def print_results(suite: str, results: Sequence[Result], file: Any = None) -> None:
    """One table per workload: each impl's median and spread, speedup, agreement, and floor."""
    by_case: dict[str, list[Result]] = {}
    for r in results:
        by_case.setdefault(r.workload, []).append(r)
    for workload, rs in by_case.items():
        shown = [r for r in rs if r.skipped is None]
        base = _baseline(shown)
        items = next((r for r in rs if r.items > 1), None)
        headers = ["impl", "lanes", "median", "spread p25-p75"]
        if items is not None:
            headers.append(f"per {items.item_name or 'item'}")
        headers += [f"vs {base.impl} ({base.lanes})" if base else "speedup", "max |diff|", "floor", "note"]
        rows = []
        for r in shown:
            sp = r.spread
            row = [r.impl, "-" if r.lanes is None else str(r.lanes)]
            if sp is None:
                row += ["error" if r.error else "-", "-"]
            else:
                row += [fmt_time(sp.median), f"{fmt_time(sp.p25)} - {fmt_time(sp.p75)}"]
            if items is not None:
                row.append(fmt_time(sp.median / r.items) if sp else "-")
            probe = not r.checked
            same_work = base is not None and (base.bytes, base.flops, base.items) == (r.bytes, r.flops, r.items)
            row.append(f"{base.median / sp.median:.2f}x" if sp and same_work and not probe else "-")
            diff = fmt_diff(r.max_abs_diff)
            row.append(diff if r.ok else f"{diff} MISMATCH")
            fl = r.floor_s
            row.append(f"{fl / sp.median * 100:.1f} %" if sp and fl and not probe else "-")
            notes = [r.note] if r.note else []
            if r.error:
                notes.append(r.error)
            notes += [f"{k}={v}" for k, v in r.extra.items()]
            row.append("; ".join(notes))
            rows.append(row)
        first = next((r for r in rs if r.floor_bytes_s is not None or r.floor_flops_s is not None), None)
        floor = ""
        if first is not None and len({(r.floor_bytes_s, r.floor_flops_s) for r in shown if r.times}) <= 1:
            floor = (f" | floor: bytes {fmt_time(first.floor_bytes_s)}, FLOPs {fmt_time(first.floor_flops_s)}"
                     " (measured this run; 'floor' column = floor / median)")
        sampled = [r for r in shown if r.times and r.runs is not None]  # (not the one-sample first calls)
        runs = {r.runs for r in sampled}
        if len(runs) == 1 and runs != {1}:
            floor += f" | {runs.pop()} runs a sample, every timed row"
        elif len(runs) > 1:
            floor += " | runs a sample: " + ", ".join(f"{r.impl} {r.runs}" for r in sampled)
        skipped = list(dict.fromkeys(f"{r.impl} ({r.skipped})" for r in rs if r.skipped is not None))
        footer = ("skipped: " + "; ".join(skipped)) if skipped else None
        if not rows:
            print(f"{suite}: {workload}: nothing could run here; {footer}", file=file or sys.stdout)
            continue
        print_table(f"{suite}: {workload}{floor}", headers, rows, footer, file)


def environment(device: Any) -> dict[str, Any]:
    """Versions and machine facts for the JSON record (and the README table)."""
    env: dict[str, Any] = {
        "laneflow": laneflow.__version__, "python": platform.python_version(), "numpy": np.__version__,
        "platform": platform.platform(), "cpu_count": os.cpu_count(), "device": str(device),
    }
    for mod in ("torch", "jax", "cupy", "mlx.core"):
        m = sys.modules.get(mod)
        if m is not None:
            env[mod.split(".")[0]] = getattr(m, "__version__", "?")
    if device.type == "gpu":
        try:
            q = subprocess.run(["nvidia-smi", f"--id={device.index}", "--query-gpu=name,driver_version,memory.total",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            if q.returncode == 0:
                env["gpu"] = q.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
        torch = sys.modules.get("torch")
        if torch is not None:
            env["torch_cuda"] = getattr(torch.version, "cuda", None)
    return env


def write_json(path: str, *, suites: Sequence[str], not_run: dict[str, str], results: Sequence[Result],
               device: Any, args: dict[str, Any], floors: Any) -> None:
    doc = {
        "schema": "laneflow-bench/1",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "suites": list(suites),
        "not_run": dict(not_run),
        "device": str(device),
        "settings": args,
        "environment": environment(device),
        "floors": floors.to_json() if floors is not None else {},
        "results": [r.to_json() for r in results],
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, default=_json_default)
        f.write("\n")


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    return str(o)
