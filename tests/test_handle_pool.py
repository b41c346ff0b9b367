"""HandlePool policies, set-stream elision and per-lane workspaces, with a recording fake library."""

from __future__ import annotations

import threading

import pytest

import laneflow as lf
from conftest import run_threads
from laneflow.runtime import handle_pool as hp


class FakeLibrary:
    name = "fakeblas"
    binds_stream = True

    def __init__(self, ws_bytes=1024):
        self.ws_bytes = ws_bytes
        self.created = 0
        self.log = []
        self.in_use = {}          # workspace id -> lane using it right now
        self.bound = {}           # handle -> (lane, workspace)
        self.lock = threading.Lock()

    def create(self, device):
        self.created += 1
        return {"id": self.created}

    def destroy(self, handle):
        self.log.append(("destroy", handle["id"]))

    def set_stream(self, handle, lane):
        self.log.append(("set_stream", handle["id"], lane.name))
        self.bound[handle["id"]] = (lane, None)   # like cublasSetStream: the workspace is reset

    def workspace_bytes(self, device):
        return self.ws_bytes

    def allocate_workspace(self, lane, nbytes):
        return {"lane": lane.name, "bytes": nbytes}

    def set_workspace(self, handle, ws, nbytes):
        self.log.append(("set_workspace", handle["id"], ws["lane"]))
        lane, _ = self.bound.get(handle["id"], (None, None))
        self.bound[handle["id"]] = (lane, ws)

    def handle_bytes(self, device):
        return 64 << 20

    def call(self, handle, ws, lane):
        """What a library call checks: the handle is bound to this lane and this lane's workspace."""
        b_lane, b_ws = self.bound[handle["id"]]
        assert b_lane is lane and b_ws is ws and ws["lane"] == lane.name
        with self.lock:
            other = self.in_use.get(id(ws))
            assert other is None or other is lane, "one workspace used by two lanes at once"
            self.in_use[id(ws)] = lane
        with self.lock:
            del self.in_use[id(ws)]


@pytest.fixture(autouse=True)
def default_policy():
    hp.set_handle_policy(None)
    yield
    hp.set_handle_policy(None)


def lanes(n, streams=2):
    ss = [lf.new_stream(lf.cpu, lanes=n) for _ in range(streams)]
    return ss, [lane for s in ss for lane in s.lanes]


def test_device_policy_shares_one_handle_across_lanes_and_streams():
    lib = FakeLibrary()
    pool = hp.HandlePool(lib)
    ss, ls = lanes(4)
    for lane in ls * 3:
        with pool.use(lane) as (h, ws):
            lib.call(h, ws, lane)
    assert lib.created == 1 and pool.handles() == 1
    for s in ss:
        s.close()


def test_stream_policy_creates_one_handle_per_lane():
    hp.set_handle_policy("stream")
    lib = FakeLibrary()
    pool = hp.HandlePool(lib)
    ss, ls = lanes(4)
    for lane in ls * 2:
        with pool.use(lane) as (h, ws):
            lib.call(h, ws, lane)
    assert lib.created == len(ls) == 8
    for s in ss:
        s.close()


def test_thread_policy_creates_one_handle_per_host_thread():
    hp.set_handle_policy("thread")
    lib = FakeLibrary()
    pool = hp.HandlePool(lib)
    ss, ls = lanes(2, streams=1)
    together = threading.Barrier(3)  # alive at once, so no thread id is reused

    def work(_):
        together.wait()
        for lane in ls:
            with pool.use(lane) as (h, ws):
                lib.call(h, ws, lane)
        together.wait()

    run_threads(work, 3)
    assert lib.created == 3
    ss[0].close()


def test_set_stream_is_elided_when_the_lane_is_already_bound():
    lib = FakeLibrary()
    pool = hp.HandlePool(lib)
    ss, ls = lanes(2, streams=1)
    hp.reset_handle_stats()
    for lane in [ls[0], ls[0], ls[0], ls[1], ls[1], ls[0]]:
        with pool.use(lane) as (h, ws):
            lib.call(h, ws, lane)
    st = hp.handle_stats()
    assert st["set_stream_issued"] == 3 and st["set_stream_elided"] == 3
    assert [e[0] for e in lib.log].count("set_stream") == 3
    ss[0].close()


def test_workspace_is_bound_again_after_every_set_stream():
    lib = FakeLibrary()
    pool = hp.HandlePool(lib)
    ss, ls = lanes(2, streams=1)
    for lane in [ls[0], ls[1], ls[0]]:
        with pool.use(lane) as (h, ws):
            lib.call(h, ws, lane)   # asserts the bound workspace is this lane's
    kinds = [e[0] for e in lib.log]
    assert kinds == ["set_stream", "set_workspace"] * 3
    ss[0].close()


def test_each_lane_gets_its_own_workspace_and_bytes_are_counted():
    before = hp.handle_stats()["workspace_bytes"].get("fakeblas", 0)
    lib = FakeLibrary(ws_bytes=4096)
    pool = hp.HandlePool(lib)
    ss, ls = lanes(3, streams=1)
    seen = set()
    for lane in ls:
        with pool.use(lane) as (h, ws):
            seen.add(id(ws))
    assert len(seen) == 3
    assert hp.handle_stats()["workspace_bytes"]["fakeblas"] - before == 3 * 4096
    ss[0].close()


def test_many_threads_and_lanes_never_share_a_workspace_under_the_device_policy():
    lib = FakeLibrary()
    pool = hp.HandlePool(lib)
    ss, ls = lanes(8, streams=1)
    errors = []

    def work(k):
        try:
            for i in range(300):
                lane = ls[(i * 7 + k) % len(ls)]
                with pool.use(lane) as (h, ws):
                    lib.call(h, ws, lane)
        except AssertionError as e:
            errors.append(e)

    run_threads(work, 4)
    assert not errors and lib.created == 1
    ss[0].close()


def test_policy_from_environment_and_bad_values(monkeypatch):
    monkeypatch.setenv("LANEFLOW_HANDLE_POLICY", "stream")
    assert hp.handle_policy() == "stream"
    monkeypatch.setenv("LANEFLOW_HANDLE_POLICY", "per-kernel")
    with pytest.raises(ValueError, match="LANEFLOW_HANDLE_POLICY"):
        hp.handle_policy()
    with pytest.raises(ValueError, match="set_handle_policy"):
        hp.set_handle_policy("global")


def test_library_without_stream_binding_never_calls_set_stream():
    lib = FakeLibrary()
    lib.binds_stream = False
    pool = hp.HandlePool(lib)
    ss, ls = lanes(2, streams=1)
    for lane in ls * 2:
        with pool.use(lane) as (h, ws):
            assert ws["lane"] == lane.name
    assert not any(e[0] == "set_stream" for e in lib.log)
    ss[0].close()


@pytest.mark.parametrize("policy", ["device", "stream"])
def test_a_lane_going_away_frees_its_workspace_and_its_own_handle(policy):
    hp.set_handle_policy(policy)
    lib = FakeLibrary(ws_bytes=1000)
    pool = hp.HandlePool(lib)
    ss, ls = lanes(2, streams=1)
    before = hp.handle_stats()
    for lane in ls:
        with pool.use(lane) as (h, ws):
            lib.call(h, ws, lane)
    freed = []
    pool.forget_lane(ls[0], freed.append)
    after = hp.handle_stats()
    assert [w["lane"] for w in freed] == [ls[0].name]
    assert after["workspace_bytes"]["fakeblas"] - before["workspace_bytes"].get("fakeblas", 0) == 1000
    assert pool.handles() == (1 if policy == "device" else 1)
    assert ("destroy", 1) in lib.log if policy == "stream" else not any(e[0] == "destroy" for e in lib.log)
    with pool.use(ls[1]) as (h, ws):   # the other lane still works
        lib.call(h, ws, ls[1])
    ss[0].close()
