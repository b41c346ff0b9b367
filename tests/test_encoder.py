"""The command encoder's hazard rules, checked with recording lanes (no threads, no timing)."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf
from laneflow.runtime.buffer import Buffer
from laneflow.runtime.encoder import CommandEncoder, GreedyPolicy
from laneflow.runtime.fence import ThreadFence
from laneflow.runtime.lane import Lane
from laneflow.runtime.stats import STATS

pytestmark = pytest.mark.usefixtures("cpu_default_device")  # these tests are about CPU lanes


class RecordingLane(Lane):
    """A lane that records what the encoder asks of it and never runs anything."""

    def __init__(self, stream_id: int, index: int):
        super().__init__(lf.cpu, stream_id, index)
        self.fence = ThreadFence()
        self.log: list = []

    def _enqueue(self, cmd):
        self.log.append(("cmd", cmd.op))

    def _enqueue_wait(self, point):
        self.log.append(("wait", point.lane.index, point.seq))

    def waits(self):
        return [e for e in self.log if e[0] == "wait"]


def make(n=3, stream_id=1000):
    lanes = [RecordingLane(stream_id, i) for i in range(n)]
    return CommandEncoder(lanes), lanes


def buf():
    return Buffer(lf.cpu, 8, np.zeros(1))


def run(enc, lane, reads=(), writes=(), op="k"):
    return enc.encode(op, lambda lane: None, list(reads), list(writes), lane=lane)


@pytest.fixture(autouse=True)
def fresh_stats():
    STATS.reset()
    yield


def test_independent_commands_on_different_lanes_need_no_wait():
    enc, (l0, l1, l2) = make()
    a, b, c = buf(), buf(), buf()
    run(enc, l0, writes=[a])
    run(enc, l1, writes=[b])
    run(enc, l2, reads=[], writes=[c])
    assert STATS.waits_emitted == 0 and not (l0.waits() or l1.waits() or l2.waits())


def test_read_after_read_needs_no_wait():
    enc, (l0, l1, l2) = make()
    a = buf()
    run(enc, l0, reads=[a], writes=[buf()])
    run(enc, l1, reads=[a], writes=[buf()])
    assert STATS.waits_emitted == 0


def test_read_after_write_across_lanes_waits_once_on_the_writer():
    enc, (l0, l1, _) = make()
    a = buf()
    p = run(enc, l0, writes=[a])
    run(enc, l1, reads=[a], writes=[buf()])
    assert l1.waits() == [("wait", 0, p.seq)]
    assert STATS.waits_emitted == 1 and STATS.raw == 1


def test_write_after_write_across_lanes_waits_once():
    enc, (l0, l1, _) = make()
    a = buf()
    p = run(enc, l0, writes=[a])
    run(enc, l1, writes=[a])
    assert l1.waits() == [("wait", 0, p.seq)]
    assert STATS.waits_emitted == 1 and STATS.waw == 1


def test_write_after_read_waits_on_every_reader_since_the_last_write():
    enc, (l0, l1, l2) = make()
    a = buf()
    run(enc, l2, writes=[a])           # the writer, on the same lane as the later write
    r0 = run(enc, l0, reads=[a], writes=[buf()])
    r1 = run(enc, l1, reads=[a], writes=[buf()])
    before = STATS.waits_emitted
    run(enc, l2, writes=[a])
    assert sorted(l2.waits()) == [("wait", 0, r0.seq), ("wait", 1, r1.seq)]
    assert STATS.waits_emitted - before == 2


def test_write_after_read_on_one_other_lane_is_exactly_one_wait():
    enc, (l0, l1, _) = make()
    a = buf()
    r = run(enc, l0, reads=[a], writes=[buf()])
    run(enc, l1, writes=[a])
    assert l1.waits() == [("wait", 0, r.seq)] and STATS.war == 1 and STATS.waits_emitted == 1


def test_a_write_clears_the_reader_set():
    enc, (l0, l1, l2) = make()
    a = buf()
    run(enc, l0, reads=[a], writes=[buf()])
    w = run(enc, l1, writes=[a])          # waits for the reader on l0
    run(enc, l2, writes=[a])              # WAW on l1 only: the old reader is covered by that write
    assert l2.waits() == [("wait", 1, w.seq)]


def test_dependencies_on_one_lane_need_no_wait():
    enc, (l0, _, _) = make()
    a = buf()
    run(enc, l0, writes=[a])
    run(enc, l0, reads=[a], writes=[buf()])
    run(enc, l0, writes=[a])
    assert l0.waits() == [] and STATS.waits_emitted == 0 and STATS.same_lane_deps == 3 and STATS.waits_elided == 0


def test_a_wait_implied_by_an_earlier_wait_is_elided():
    enc, (l0, l1, _) = make()
    a, b = buf(), buf()
    run(enc, l0, writes=[a])
    run(enc, l0, writes=[b])
    run(enc, l1, reads=[b], writes=[buf()])  # waits for l0#2, which implies l0#1
    run(enc, l1, reads=[a], writes=[buf()])  # reads l0#1: already covered
    assert l1.waits() == [("wait", 0, 2)]
    assert STATS.waits_emitted == 1 and STATS.waits_elided == 1


def test_transitive_waits_are_elided_through_vector_clocks():
    enc, (l0, l1, l2) = make()
    a, b = buf(), buf()
    run(enc, l0, writes=[a])                    # l0#1 writes a
    run(enc, l1, reads=[a], writes=[b])         # l1 waits l0#1, then writes b
    run(enc, l2, reads=[b, a], writes=[buf()])  # needs l1#1 (and l0#1, implied by it)
    assert l2.waits() == [("wait", 1, 1)]
    assert STATS.waits_emitted == 2 and STATS.waits_elided == 1


def test_only_the_latest_point_per_lane_is_waited_for():
    enc, (l0, l1, _) = make()
    a, b = buf(), buf()
    run(enc, l0, writes=[a])
    run(enc, l0, writes=[b])
    run(enc, l1, reads=[a, b], writes=[buf()])
    assert l1.waits() == [("wait", 0, 2)] and STATS.waits_emitted == 1 and STATS.waits_elided == 1


def test_in_place_write_waits_for_readers_on_other_lanes_and_orders_after_them():
    enc, (l0, l1, _) = make()
    x = buf()
    run(enc, l0, writes=[x])
    r = run(enc, l1, reads=[x], writes=[buf()])   # y = f(x) on l1
    run(enc, l0, reads=[x], writes=[x])           # x[...] = v in place on l0: WAR on l1's read
    assert l0.waits() == [("wait", 1, r.seq)]


def test_greedy_policy_prefers_the_single_producers_lane():
    lanes = [RecordingLane(7, i) for i in range(4)]
    p = GreedyPolicy()
    assert p.choose(lanes, [lanes[2]]) is lanes[2]


def test_greedy_policy_spreads_independent_work_to_the_least_loaded_lane():
    lanes = [RecordingLane(8, i) for i in range(3)]
    lanes[0].submitted = 5   # 5 pending (fence still 0)
    lanes[1].submitted = 1
    lanes[2].submitted = 3
    assert GreedyPolicy().choose(lanes, []) is lanes[1]
    assert GreedyPolicy().choose(lanes, [lanes[0], lanes[2]]) is lanes[1]


def test_encoder_chooses_the_producer_lane_so_chains_stay_on_one_lane():
    enc, lanes = make(4)
    a = buf()
    p = enc.encode("k", lambda lane: None, [], [a])
    for _ in range(5):
        b = buf()
        q = enc.encode("k", lambda lane: None, [a], [b])
        assert q.lane is p.lane
        a = b
    assert STATS.waits_emitted == 0


@pytest.mark.parametrize("tail_first", [True, False])
def test_a_producer_counts_when_its_latest_read_is_its_lanes_last_command(tail_first):
    """c = a + b with a and b from one lane, b its last command: c continues there with no wait,
    whichever input is read first."""
    enc, lanes = make(3)
    a, b, c = buf(), buf(), buf()
    run(enc, lanes[1], writes=[a])
    run(enc, lanes[1], writes=[b])
    run(enc, lanes[2], writes=[buf()])             # another lane is busier than lane 0
    p = enc.encode("add", lambda lane: None, [b, a] if tail_first else [a, b], [c])
    assert p.lane is lanes[1] and STATS.waits_emitted == 0


def test_fan_out_of_one_producer_spreads_over_lanes():
    """Consumers of one value: the first continues the producer's lane, the others go elsewhere."""
    enc, lanes = make(4)
    x = buf()
    p = enc.encode("produce", lambda lane: None, [], [x])
    placed = [enc.encode("use", lambda lane: None, [x], [buf()]).lane for _ in range(4)]
    assert placed[0] is p.lane and len({id(lane) for lane in placed}) >= 3, [ln.index for ln in placed]


def test_stats_count_commands_per_lane():
    enc, (l0, l1, _) = make(stream_id=4242)
    run(enc, l0, writes=[buf()])
    run(enc, l0, writes=[buf()])
    run(enc, l1, writes=[buf()])
    s = lf.stats()
    assert s["commands"] == 3
    assert s["per_lane"][l0.name] == 2 and s["per_lane"][l1.name] == 1


def test_stats_keep_the_commands_of_lanes_that_died_and_count_from_a_reset():
    # the counts are read from each lane's sequence numbers (no counter per command): a lane that
    # dies leaves its count, and a reset starts every lane from zero
    import gc

    enc, (l0, l1, _) = make(stream_id=4343)
    run(enc, l0, writes=[buf()])
    STATS.reset()
    run(enc, l0, writes=[buf()])
    run(enc, l1, writes=[buf()])
    run(enc, l1, writes=[buf()])
    name1 = l1.name
    del enc, l1, _
    gc.collect()
    s = lf.stats()
    assert s["per_lane"] == {l0.name: 1, name1: 2} and s["commands"] == 3, s
    STATS.reset()
    assert lf.stats()["per_lane"] == {} and lf.stats()["commands"] == 0


# -- the same rules through the public API on real CPU lanes -------------------------------------

def test_public_api_independent_ops_emit_no_waits_and_a_join_emits_one(rng):
    s = lf.new_stream(lf.cpu, lanes=2)
    x = lf.array(rng.standard_normal((64, 64)))
    y = lf.array(rng.standard_normal((64, 64)))
    lf.eval(x, y)
    with lf.testing.inject_delays(fixed=0.01):
        a = lf.exp(x, stream=s)
        b = lf.sin(y, stream=s)
        lf.reset_stats()
        lf.async_eval(a, b)
        assert lf.stats()["waits_emitted"] == 0
        assert len(lf.stats()["per_lane"]) == 2          # the two ops went to different lanes
        c = lf.add(a, b, stream=s)
        lf.eval(c)
    st = lf.stats()
    assert st["waits_emitted"] == 1
    np.testing.assert_array_equal(np.asarray(c), np.exp(np.asarray(x)) + np.sin(np.asarray(y)))
    s.close()


def test_cross_stream_use_inserts_the_fence_itself(rng):
    s1, s2 = lf.new_stream(lf.cpu, lanes=1), lf.new_stream(lf.cpu, lanes=1)
    xn = rng.standard_normal(1000)
    x = lf.array(xn)
    with lf.testing.inject_delays(fixed=0.03):
        a = lf.exp(x, stream=s1)        # slow producer on stream 1
        b = lf.multiply(a, 2.0, stream=s2)
        lf.reset_stats()
        lf.eval(b)
    assert lf.stats()["waits_emitted"] == 1
    np.testing.assert_array_equal(np.asarray(b), np.exp(xn) * 2.0)
    s1.close(), s2.close()


def test_a_one_lane_stream_reports_no_waits_at_all(rng):
    s = lf.new_stream(lf.cpu, lanes=1)
    x = lf.array(rng.standard_normal((8, 8)))
    with lf.stream(s):
        lf.reset_stats()
        y = x
        for _ in range(5):
            y = lf.tanh(y @ x) + y
            y[0] = y[1]
        lf.eval(y)
    st = lf.stats()
    assert st["waits_emitted"] == 0 and st["waits_elided"] == 0 and st["same_lane_deps"] > 0
    s.close()


def test_sticky_policy_keeps_idle_work_on_one_lane_and_greedy_rotates(rng):
    x = rng.standard_normal(8)
    lanes_used = {}
    for policy in ("greedy", "sticky"):
        s = lf.new_stream(lf.cpu, lanes=4, policy=policy)
        a = lf.array(x, stream=s)
        lf.eval(a)
        outs = []
        for k in range(6):  # independent commands, each submitted when every lane is idle
            s.synchronize()
            y = lf.multiply(a, float(k), stream=s)
            lf.eval(y)
            outs.append(y)
        lanes_used[policy] = {o._data.buffer.writer.lane.index for o in outs}
        for k, o in enumerate(outs):
            np.testing.assert_array_equal(np.asarray(o), x * float(k))
        s.close()
    assert len(lanes_used["sticky"]) == 1
    assert len(lanes_used["greedy"]) > 1


def test_sticky_policy_still_spreads_work_that_keeps_lanes_busy():
    s = lf.new_stream(lf.cpu, lanes=2, policy="sticky")
    with lf.testing.inject_delays(fixed=0.02):  # every command keeps its lane busy for 20 ms
        a = lf.array(np.ones(4), stream=s)
        ys = [lf.multiply(a, float(k), stream=s) for k in range(4)]
        lf.eval(*ys)
    assert len({y._data.buffer.writer.lane.index for y in ys}) == 2
    s.close()


def test_unknown_lane_policy_is_refused():
    with pytest.raises(ValueError, match="unknown lane policy 'fastest'"):
        lf.new_stream(lf.cpu, lanes=2, policy="fastest")
