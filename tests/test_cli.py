"""``python -m laneflow demo`` and ``python -m laneflow bench``, run as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def laneflow(*args: str, cwd, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "laneflow", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_demo_prints_a_table_and_writes_timeline_and_trace(tmp_path):
    out = tmp_path / "out"
    p = laneflow("demo", "--device", "cpu", "--out", str(out), cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "median ms" in p.stdout and "eager" in p.stdout and "speedup" in p.stdout
    assert "compiled" in p.stdout  # a row, or "compiled: not available yet"
    png, trace = out / "timeline.png", out / "trace.json"
    assert png.stat().st_size > 1000
    doc = json.loads(trace.read_text())
    assert any(e["ph"] == "X" for e in doc["traceEvents"])
    assert str(png) in p.stdout and str(trace) in p.stdout


def test_bench_dispatch_quick_writes_json(tmp_path):
    f = tmp_path / "r.json"
    p = laneflow("bench", "dispatch", "--quick", "--device", "cpu", "--peers", "numpy", "--json", str(f),
                 cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "laneflow eager" in p.stdout and "tracing on" in p.stdout
    doc = json.loads(f.read_text())
    assert doc["schema"] == "laneflow-bench/1" and doc["suites"] == ["dispatch"]
    assert {"environment", "floors", "settings", "date", "device"} <= doc.keys()
    rows = {r["impl"]: r for r in doc["results"]}
    assert {"laneflow eager", "laneflow eager, tracing on", "trace hook alone, tracing off", "numpy eager"} <= rows.keys()
    for r in doc["results"]:
        assert {"impl", "lanes", "status", "median_us", "spread_us", "repeats", "times_us", "per_item_us",
                "bytes", "flops", "floor_us", "max_abs_diff", "skipped", "error"} <= r.keys()
    lf1 = rows["laneflow eager"]
    assert lf1["status"] == "ok" and lf1["repeats"] == 5 and lf1["median_us"] > 0
    assert lf1["spread_us"]["min"] <= lf1["median_us"] <= lf1["spread_us"]["max"]


def test_unknown_suite_exits_2_with_a_clear_message(tmp_path):
    p = laneflow("bench", "nosuch", cwd=tmp_path)
    assert p.returncode == 2
    assert "nosuch" in p.stderr and "dispatch" in p.stderr


def test_unknown_peer_exits_2(tmp_path):
    p = laneflow("bench", "dispatch", "--quick", "--peers", "torch,numpyy", cwd=tmp_path)
    assert p.returncode == 2
    assert "numpyy" in p.stderr


@pytest.mark.parametrize("suite", ["handles", "fences", "kernels"])
def test_gpu_suites_say_they_need_a_gpu_on_the_cpu(tmp_path, suite):
    p = laneflow("bench", suite, "--device", "cpu", "--peers", "none", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "needs a GPU" in p.stdout


def test_info_reports_devices_and_settings(tmp_path):
    p = laneflow("info", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    for key in ("laneflow", "default device", "cpu default lanes", "handle policy", "mpi launcher", "gpu"):
        assert key in p.stdout
