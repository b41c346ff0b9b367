"""The benchmark harness on tiny workloads: medians, spread, checking, errors, the JSON record."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

import laneflow as lf
from laneflow.bench.floors import Floors
from laneflow.bench.harness import Case, Impl, Spread, first_call, measure, run_impl, run_interleaved
from laneflow.bench.report import print_results, write_json
from laneflow.bench.runner import Context


def tiny_case(**kw) -> Case:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    return Case("tiny", "x + 1 (2x3 float32)", {"x": x}, x + 1, bytes=2 * x.nbytes, flops=x.size, **kw)


def test_spread_median_and_quartiles():
    sp = Spread.of([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (sp.median, sp.min, sp.max, sp.n) == (3.0, 1.0, 5.0, 5)
    assert (sp.p25, sp.p75) == (2.0, 4.0)
    assert sp.rel_iqr == pytest.approx(2.0 / 3.0)
    assert Spread.of([7.0]).median == 7.0
    with pytest.raises(ValueError):
        Spread.of([])


def test_measure_runs_warmup_then_repeats():
    calls = []
    impl = Impl("count", lambda: calls.append(1) or len(calls))
    times, out = measure(impl, repeat=4, warmup=2)
    assert len(times) == 4 and all(t >= 0 for t in times)
    assert len(calls) == 6 and out == 6


def test_measure_uses_the_device_timer_when_given():
    class FixedTimer:
        def start(self):
            pass

        def stop(self):
            return 0.25
    impl = Impl("timed", lambda: None, timer=FixedTimer())
    times, _ = measure(impl, repeat=3)
    assert times == [0.25, 0.25, 0.25]


def test_measure_batches_tiny_runs_into_samples():
    calls = []
    impl = Impl("tiny", lambda: calls.append(1))
    times, _ = measure(impl, repeat=2, warmup=1, min_sample_s=0.001)
    assert len(times) == 2
    assert len(calls) > 2 + 2  # each sample ran the workload several times


def test_run_impl_checks_against_the_reference():
    case = tiny_case()
    x = case.inputs["x"]
    ok = run_impl(case, Impl("numpy", lambda: x + 1), repeat=3)
    assert ok.status == "ok" and ok.max_abs_diff == 0.0 and len(ok.times) == 3
    bad = run_impl(case, Impl("off by one", lambda: x + 2), repeat=3)
    assert bad.status == "mismatch" and not bad.ok and bad.max_abs_diff == 1.0


def test_run_impl_records_errors_and_keeps_going():
    def boom():
        raise RuntimeError("kernel exploded")
    r = run_impl(tiny_case(), Impl("broken", boom), repeat=3)
    assert r.status == "error" and "kernel exploded" in r.error and r.times == []


def test_a_first_call_row_is_one_checked_sample_of_the_first_run():
    # laneflow's and each peer's "..., first call" rows: the very first run, alone, with its sync;
    # checked like any row; an error is the row's, and the impl is closed either way
    case = tiny_case()
    calls, synced, closed = [], [], []
    x = case.inputs["x"]
    impl = Impl("first", lambda: calls.append(1) or x + len(calls), sync=lambda: synced.append(1),
                close=lambda: closed.append(1))
    res = first_call(case, impl)
    assert len(calls) == 1 and len(res.times) == 1 and res.times[0] >= 0 and res.matches
    assert len(synced) == 2 and closed == [1] and res.timer == "host"
    wrong = first_call(case, Impl("wrong", lambda: x + 2))
    assert wrong.matches is False
    bad = first_call(case, Impl("bad", lambda: 1 / 0, close=lambda: closed.append(1)))
    assert "ZeroDivisionError" in bad.error and closed == [1, 1]


def test_interleaved_rows_take_turns_and_one_failing_row_leaves_the_others_running():
    case = tiny_case()
    x = case.inputs["x"]
    order, closed = [], []
    state = {"b": 0}

    def b_run():
        order.append("b")
        state["b"] += 1
        if state["b"] == 4:  # warm-up 2, then fails at its second sample
            raise RuntimeError("b broke")
        return x + 1

    impls = [Impl("a", lambda: order.append("a") or x + 1, close=lambda: closed.append("a")),
             Impl("b", b_run, close=lambda: closed.append("b")),
             Impl("c", lambda: order.append("c") or x + 2, close=lambda: closed.append("c"))]
    a, b, c = run_interleaved(case, impls, repeat=3, warmup=2)
    # warm-ups, then one sample of each per repeat, each repeat starting one row later (b fails in the second)
    assert order == ["a", "a", "b", "b", "c", "c"] + ["a", "b", "c"] + ["b", "c", "a"] + ["c", "a"]
    assert a.status == "ok" and len(a.times) == 3
    assert b.status == "error" and "b broke" in b.error
    assert c.status == "mismatch" and len(c.times) == 3   # still checked against the reference
    assert sorted(closed) == ["a", "b", "c"]


def test_rows_taking_turns_all_run_as_often_in_a_sample(monkeypatch):
    # A fast row would otherwise run many times in a sample (warm after its first run) and a slow one
    # once (always after another row's): unlike with unlike. A fake clock (each run advances it by the
    # row's cost) keeps the counts exact on a loaded machine.
    import types
    from laneflow.bench import harness

    clock = [0.0]
    monkeypatch.setattr(harness, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    case = tiny_case()
    x = case.inputs["x"]
    calls = {"fast": 0, "slow": 0, "middle": 0, "slower": 0, "broken": 0}

    def row(name, seconds):
        def run():
            calls[name] += 1
            clock[0] += seconds
            if name == "broken" and calls[name] > 2:
                raise RuntimeError("broken")
            return x + 1
        return Impl(name, run)

    fast, slow, middle, slower, broken = run_interleaved(
        case, [row("fast", 0.0005), row("slow", 0.004), row("middle", 0.01), row("slower", 0.2),
               row("broken", 0.001)], repeat=2, min_sample_s=0.004)
    # fast needs 8 runs for a sample of 4 ms, slow 1: both run 8; middle and slower at 8 runs would take
    # more than MAX_SAMPLE_FACTOR x 4 ms, so they keep their own count (not as many as would fit)
    assert (fast.runs, slow.runs, middle.runs, slower.runs) == (8, 8, 1, 1)
    assert 8 * 0.01 > harness.MAX_SAMPLE_FACTOR * 0.004 > 2 * 0.01
    timed = harness.Sampler.TIMED
    assert calls["fast"] == calls["slow"] == 1 + timed + 2 * 8 and calls["slower"] == 1 + timed + 2  # (warm-up, timed, samples)
    assert slow.to_json()["runs_per_sample"] == 8 and broken.status == "error"
    out = io.StringIO()
    print_results("tiny", [fast, slow, middle, slower, broken], file=out)
    assert "runs a sample: fast 8, slow 8, middle 1, slower 1 " in out.getvalue().replace("\n", " ")
    # rows of one count: said once; a one-sample row (a first call) is not counted
    first = first_call(case, row("fast", 0.003))
    assert first.runs is None and first.to_json()["runs_per_sample"] is None
    out = io.StringIO()
    print_results("tiny", [fast, slow, first], file=out)
    assert "8 runs a sample, every timed row" in out.getvalue()
    # one row alone keeps its own count
    assert run_impl(case, row("slow", 0.004), repeat=1, min_sample_s=0.004).runs == 1
    # a row whose first runs are slow (an eager row building its plan) is counted by its fastest timed run
    clock[0] = 0.0
    costs = iter([2.0 ** -5] * harness.Sampler.TIMED)  # (powers of two: the fake clock's sums are exact)

    def warming():
        clock[0] += next(costs, 2.0 ** -11)
        return x + 1
    warm, = run_interleaved(case, [Impl("warming", warming)], repeat=1, min_sample_s=2.0 ** -8)
    assert warm.runs == 8


@pytest.mark.parametrize("order, turns", [("auto", True), ("sequential", False), ("interleaved", True)])
def test_the_gpt2_suite_times_its_rows_in_turns_unless_told_otherwise(monkeypatch, order, turns):
    from laneflow.bench import runner
    from laneflow.bench.harness import SUITES

    seen = []
    monkeypatch.setattr(runner, "run_interleaved", lambda case, impls, *a, **k: seen.append("turns") or
                        [run_impl(case, i, 1) for i in impls])
    monkeypatch.setattr(runner, "run_impl", lambda case, impl, *a, **k: seen.append("one") or run_impl(case, impl, 1))
    ctx = Context(device=lf.cpu, peers=[], repeat=1, quick=True, lanes=2, order=order)
    (name, results, why), = runner.run_suites(["gpt2"], ctx)
    assert why is None and results and all(r.ok for r in results), [(r.impl, r.error) for r in results]
    assert SUITES["gpt2"].interleave and ("turns" in seen) == turns and ("one" in seen) == (not turns)


def test_laneflow_on_a_tiny_workload_through_the_context():
    ctx = Context(device=lf.cpu, peers=["numpy"], repeat=3, quick=True, lanes=2)
    case = tiny_case(items=1)
    from laneflow.bench import laneflow_impls as lfi

    rows = lfi.modes(case, lf.cpu, 2, lambda x: x + 1.0, [case.inputs["x"]])
    results = ctx.run_case(case, "tiny", rows)
    by = {(r.impl, r.lanes): r for r in results}
    assert by[("laneflow eager", 1)].status == "ok"
    assert by[("laneflow eager", 2)].status == "ok"
    assert by[("numpy", None)].skipped  # the numpy peer has no "tiny" workload
    assert all(r.floor_s is not None for r in results if r.times)  # floors measured on this device


def test_json_record_schema(tmp_path):
    case = tiny_case()
    x = case.inputs["x"]
    floors = Floors(lf.cpu, quick=True)
    r = run_impl(case, Impl("numpy", lambda: x + 1, lanes=1), repeat=5, floors=floors)
    path = tmp_path / "r.json"
    write_json(str(path), suites=["tiny"], not_run={"handles": "needs a GPU"}, results=[r], device=lf.cpu,
               args={"repeat": 5}, floors=floors)
    doc = json.loads(path.read_text())
    assert doc["schema"] == "laneflow-bench/1" and doc["not_run"] == {"handles": "needs a GPU"}
    assert doc["environment"]["numpy"] == np.__version__
    assert doc["floors"]["bandwidth_GBps"] > 0
    (row,) = doc["results"]
    assert row["repeats"] == 5 and len(row["times_us"]) == 5
    assert row["spread_us"]["p25"] <= row["median_us"] <= row["spread_us"]["p75"]
    # (48 bytes take under a nanosecond at this machine's copy bandwidth: floor_us may round to 0.0)
    assert row["floor_us"] >= 0 and 0 < row["fraction_of_floor"]
    assert row["status"] == "ok" and row["matches"] is True


def test_table_lists_every_row_and_skips_in_a_footnote():
    case = tiny_case()
    x = case.inputs["x"]
    rs = [run_impl(case, Impl("laneflow eager", lambda: x + 1, lanes=1), repeat=3),
          run_impl(case, Impl("other", lambda: x + 1, lanes=2), repeat=3)]
    from laneflow.bench.harness import skipped

    rs.append(skipped(case, "torch", "PyTorch not installed"))
    buf = io.StringIO()
    buf.isatty = lambda: False  # type: ignore[method-assign]
    print_results("tiny", rs, file=buf)
    text = buf.getvalue()
    assert "laneflow eager" in text and "other" in text
    assert "skipped: torch (PyTorch not installed)" in text


def test_replay_suite_times_host_cost_per_compiled_call_and_checks_results():
    import laneflow.bench.suites  # noqa: F401 - registers the suites
    from laneflow.bench.harness import SUITES

    ctx = Context(device=lf.cpu, peers=[], repeat=3, quick=True, lanes=2)
    results = SUITES["replay"].run(ctx)
    assert len(results) == 3 and all(r.status == "ok" and r.matches for r in results), results
    chains, many = results[:2], results[2]
    # (on the CPU a compiled plan runs as one command: backends/cpu/executor.py)
    assert all(r.extra["host_us_per_node"] > 0 and r.extra["mode"] == "one command" for r in chains)
    assert "64 arguments" in many.workload and many.extra["mode"] == "one command"


def test_decode_suite_checks_every_row_against_the_full_forward():
    """bench decode (quick, CPU): the per-token rows and the many-requests rows all run and match the
    float32 forward over the whole sequence; the compiled rows run as one command per token."""
    import laneflow.bench.suites  # noqa: F401 - registers the suites
    from laneflow.bench.harness import SUITES

    ctx = Context(device=lf.cpu, peers=[], repeat=2, quick=True, lanes=2)
    results = SUITES["decode"].run(ctx)
    names = [r.impl for r in results]
    assert names.count("laneflow compiled, caches donated") == 4 and "laneflow compiled, one padded batch" in names  # 1 lane and 2, B=1 and 8
    assert names.count("laneflow compiled, each step waited for") == 2  # the latency row, B=1 and 8
    assert names.count("laneflow compiled, weights captured") == 2
    case = next(r for r in results if r.impl == "laneflow compiled, each step waited for")
    assert case.times, case  # timed like every row (a loop of steps; each waits for the device here)
    assert all(r.status == "ok" and r.matches for r in results), [(r.impl, r.status, r.error) for r in results]
    assert all(r.extra["compiled"]["mode"] == "one command" for r in results
               if "caches donated" in r.impl or "waited for" in r.impl or "captured" in r.impl)
