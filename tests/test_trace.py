"""lf.trace(): one event per command, the Chrome trace format Perfetto reads, lane overlap, the plot."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

import laneflow as lf
from laneflow.runtime import tracing


@pytest.fixture(autouse=True)
def _one_command_per_op(no_fusion):
    """These tests count trace events per op: fusion off."""

pytestmark = pytest.mark.usefixtures("cpu_default_device")  # these tests are about CPU lanes


@pytest.fixture
def stream4():
    s = lf.new_stream(lf.cpu, lanes=4)
    yield s
    s.close()


def _independent_work(s, n=4):
    x = lf.array(np.arange(64, dtype=np.float32).reshape(8, 8), stream=s)
    lf.eval(x)
    with lf.stream(s):
        return [lf.exp(x * float(i)) for i in range(n)]


def test_one_event_per_command(stream4):
    ys = _independent_work(stream4)
    lf.reset_stats()
    with lf.trace() as t:
        lf.eval(*ys)
    assert len(t.events) == lf.stats()["commands"] == 8  # 4 multiplies, 4 exps
    assert sorted(e.op for e in t.events) == ["exp"] * 4 + ["multiply"] * 4
    for e in t.events:
        assert e.enqueue <= e.start <= e.end
        assert e.lane.startswith("cpu:0/s")


def test_chrome_trace_has_the_fields_perfetto_expects(stream4, tmp_path):
    ys = _independent_work(stream4)
    with lf.trace() as t:
        lf.eval(*ys)
    path = tmp_path / "t.json"
    t.save(path)
    doc = json.loads(path.read_text())
    complete = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == len(t.events) == 8
    for e in complete:
        assert {"name", "ph", "ts", "dur", "pid", "tid"} <= e.keys()
        assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)) and e["dur"] >= 0
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
    names = {(m["pid"], m["tid"]): m["args"]["name"] for m in doc["traceEvents"]
             if m["ph"] == "M" and m["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in complete} <= names.keys()  # every lane row is labelled
    assert len(names) == len({e.lane for e in t.events})


def test_independent_commands_overlap_across_lanes(stream4):
    ys = _independent_work(stream4)
    with lf.testing.inject_delays(fixed=0.02):
        with lf.trace() as t:
            lf.eval(*ys)
    ev = t.events
    lanes = {e.lane for e in ev}
    assert len(lanes) >= 2
    overlapping = [(a, b) for a in ev for b in ev
                   if a.lane != b.lane and a.start < b.end and b.start < a.end]
    assert overlapping, "independent commands on different lanes should run at the same time"
    assert all(e.duration >= 0.019 for e in ev)  # the injected delay counts as the command's time
    summary = t.summary()
    busy = sum(v["busy"] for v in summary["lanes"].values())
    assert busy > 1.5 * summary["span"]  # more than one lane busy on average


def test_plot_writes_a_png(stream4, tmp_path):
    ys = _independent_work(stream4)
    with lf.trace() as t:
        lf.eval(*ys)
    path = tmp_path / "t.png"
    t.plot(path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_plot_without_matplotlib_says_how_to_get_it(stream4, tmp_path, monkeypatch):
    with lf.trace() as t:
        lf.eval(*_independent_work(stream4, 1))
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match="pip install"):
        t.plot(tmp_path / "t.png")
    t.save(tmp_path / "t.json")  # saving needs nothing extra


def test_nothing_is_recorded_outside_the_block(stream4):
    before = _independent_work(stream4)
    with lf.testing.inject_delays(fixed=0.01):
        lf.async_eval(*before)  # enqueued before the trace, may still run during it
        with lf.trace() as t:
            inside = lf.exp(before[0] + 1.0, stream=stream4)
            lf.eval(inside)
    assert tracing.active is None
    after = lf.exp(inside, stream=stream4)
    lf.eval(after)
    assert sorted(e.op for e in t.events) == ["add", "exp"]


def test_leaving_the_block_waits_for_recorded_commands(stream4):
    ys = _independent_work(stream4)
    with lf.testing.inject_delays(fixed=0.01):
        with lf.trace() as t:
            lf.async_eval(*ys)  # no wait inside the block
    assert len(t.events) == 8
    assert all(e.end >= e.start for e in t.events)


def test_hook_is_cleared_when_the_block_raises(stream4):
    with pytest.raises(ZeroDivisionError):
        with lf.trace():
            1 / 0
    assert tracing.active is None


def test_traces_do_not_nest():
    with lf.trace():
        with pytest.raises(RuntimeError, match="already recording"):
            with lf.trace():
                pass
    assert tracing.active is None


def test_no_tracing_by_default():
    assert tracing.active is None


def test_device_lanes_report_times_that_are_resolved_when_the_block_ends():
    """The protocol a CUDA lane follows: timing events recorded only while tracing, read afterwards."""

    class FakeDeviceLane:
        id, name, device, stream_id, index = 10**9, "gpu:0/s9.0", "gpu:0", 9, 0

        def host_wait(self, seq, timeout=None):
            return True

    class Cmd:
        op, seq = "matmul", 1

    lane, resolved = FakeDeviceLane(), []
    with lf.trace() as t:
        sink = tracing.active
        sink.enqueued(lane, Cmd)
        start = sink.start + 0.5
        sink.ran_on_device(lane, 1, lambda: resolved.append(1) or (start, start + 0.25))
        assert not resolved  # device times are read only after the block, once the work is done
    assert resolved == [1]
    (e,) = t.events
    assert (e.op, e.lane, e.device) == ("matmul", "gpu:0/s9.0", "gpu:0")
    assert e.start == pytest.approx(0.5) and e.duration == pytest.approx(0.25)


def test_every_command_on_a_device_stream_is_recorded_with_its_times(device, rng):
    s = lf.new_stream(device, lanes=2)
    a = lf.array(rng.standard_normal((64, 64)), stream=s)
    lf.eval(a)
    with lf.trace() as t:
        outs = [lf.exp(a, stream=s), lf.tanh(a, stream=s), lf.matmul(a, a, stream=s)]
        lf.eval(lf.add(outs[0], outs[1], stream=s), outs[2])
    ev = t.events
    assert sorted(e.op for e in ev) == ["add", "exp", "matmul", "tanh"]
    assert all(e.device == str(device) and 0 <= e.start <= e.end for e in ev)
    add = next(e for e in ev if e.op == "add")
    assert add.start >= max(e.end for e in ev if e.op in ("exp", "tanh")) - 1e-6  # ordered after its inputs
    s.close()
