"""Library handles through the HandlePool: per-policy handle counts, workspaces per lane, identical results
under sharing. The pool-logic tests at the top run everywhere (a recording fake library); the cuBLASLt,
cuBLAS and cuSOLVER tests below need a GPU."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import repeat_in_threads, run_threads

import laneflow as lf
from laneflow.graph import grouping
from laneflow.runtime import handle_pool as hp

gpu = pytest.mark.skipif(not lf.gpu_available(), reason="no usable GPU: laneflow's CUDA backend or an NVIDIA driver is missing")


@pytest.fixture(autouse=True)
def policy_reset():
    lf.cuda.set_handle_policy(None)
    yield
    lf.cuda.set_handle_policy(None)


# -- pool logic, everywhere ------------------------------------------------------------------------

class GrowingLibrary:
    """Like cuSOLVER: stream in the handle, workspace sized per call (``use(lane, need=...)``)."""

    binds_stream = True

    def __init__(self, name="fakesolver"):
        self.name = name
        self.log: list = []
        self.live: dict = {}  # workspace id -> (lane name, bytes)
        self.fail_set_stream = False
        self.handle_bytes_how = "measured"

    def create(self, device):
        return {"id": len([e for e in self.log if e[0] == "create"]) + 1}

    def destroy(self, handle):
        self.log.append(("destroy", handle["id"]))

    def set_stream(self, handle, lane):
        if self.fail_set_stream:
            raise RuntimeError("set_stream failed")
        self.log.append(("set_stream", lane.name))

    def workspace_bytes(self, device):
        return 0

    def allocate_workspace(self, lane, nbytes):
        ws = (object(), nbytes)
        self.live[id(ws)] = (lane.name, nbytes)
        self.log.append(("alloc", lane.name, nbytes))
        return ws

    def free_workspace(self, lane, ws):
        self.log.append(("free", lane.name, ws[1]))
        del self.live[id(ws)]

    def set_workspace(self, handle, ws, nbytes):
        pass

    def handle_bytes(self, device):
        return 96 << 20


def cpu_lanes(n):
    s = lf.new_stream(lf.cpu, lanes=n)
    return s, s.lanes


def test_a_larger_need_replaces_the_lanes_workspace_in_its_stream_order_and_is_counted():
    lib = GrowingLibrary("grow1")
    pool = hp.HandlePool(lib)
    s, (l0, l1) = cpu_lanes(2)
    with pool.use(l0) as (_h, ws):
        assert ws is None  # nothing asked, nothing allocated
    with pool.use(l0, need=1000) as (_h, ws):
        assert ws[1] >= 1000
    with pool.use(l0, need=500) as (_h, ws2):
        assert ws2 is ws  # big enough: kept
    with pool.use(l0, need=3000) as (_h, ws3):
        assert ws3[1] >= 3000 and ws3 is not ws
    with pool.use(l1, need=10) as (_h, ws4):
        assert ws4 is not ws3
    assert ("free", l0.name, ws[1]) in lib.log and len(lib.live) == 2
    st = hp.handle_stats()
    assert st["workspace_bytes"]["grow1"] == ws3[1] + ws4[1] == pool.workspace_bytes()
    assert st["workspaces"]["grow1"] == 2
    assert st["handle_bytes"]["grow1"] == 96 << 20 and st["handle_bytes_how"]["grow1"] == "measured"
    pool.close(free_workspaces=True)
    st = hp.handle_stats()
    assert not lib.live and st["workspace_bytes"]["grow1"] == 0 and st["handle_bytes"]["grow1"] == 0
    assert st["handles_live"]["grow1"] == 0
    s.close()


class ExclusiveLibrary(GrowingLibrary):
    """Like cuSOLVER: calls of one handle must not overlap, so a handle moving lanes is handed over."""

    exclusive = True

    def hand_over(self, order, prev, lane):
        order = order if order is not None else {"id": len([e for e in self.log if e[0] == "order"]) + 1}
        self.log.append(("hand_over", prev.name if prev is not None else None, lane.name if lane else None))
        return order

    def end_order(self, order):
        self.log.append(("end_order", order["id"]))


@pytest.mark.parametrize("policy", ["device", "stream"])
def test_an_exclusive_handle_is_handed_over_only_when_it_moves_to_another_lane(policy):
    """Shared (device policy): each move to another lane makes that lane wait for the previous one, also
    after the previous lane went away; a handle of its own (stream policy) never waits."""
    lib = ExclusiveLibrary(f"excl-{policy}")
    hp.set_handle_policy(policy)
    pool = hp.HandlePool(lib)
    s, (l0, l1, l2) = cpu_lanes(3)
    for lane in (l0, l0, l1, l1, l0, l2):
        with pool.use(lane):
            pass
    moves = [e for e in lib.log if e[0] == "hand_over"]
    if policy == "device":
        assert moves == [("hand_over", l0.name, l1.name), ("hand_over", l1.name, l0.name),
                         ("hand_over", l0.name, l2.name)]
    else:
        assert moves == []
    lib.log.clear()
    pool.forget_lane(l2, lambda ws: None)   # l2 goes away holding the handle: its queued calls still run
    with pool.use(l0):
        pass
    if policy == "device":
        assert lib.log == [("hand_over", l2.name, None), ("hand_over", None, l0.name), ("set_stream", l0.name)]
    else:
        assert [e for e in lib.log if e[0] == "hand_over"] == []
    pool.close()
    ends = [e for e in lib.log if e[0] == "end_order"]
    assert len(ends) == (1 if policy == "device" else 0)
    s.close()


def test_handles_per_device_splits_the_lanes_over_that_many_shared_handles(monkeypatch):
    """Under the device policy with 2 handles per device, lane i uses handle i % 2: two handles for four
    lanes, each handed over only among its own lanes; back to one handle when the setting is cleared."""
    lib = ExclusiveLibrary("perdev")
    pool = hp.HandlePool(lib)
    s, lanes = cpu_lanes(4)
    try:
        hp.set_handles_per_device("perdev", 2)
        assert pool.per_device == 2 and hp.handles_per_device("perdev") == 2
        got = {}
        for lane in lanes + lanes:
            with pool.use(lane) as (h, _ws):
                assert got.setdefault(lane.index, h) is h
        assert got[0] is got[2] and got[1] is got[3] and got[0] is not got[1]
        assert pool.handles() == 2
        slot = {ln.name: ln.index % 2 for ln in lanes}
        moves = [e[1:] for e in lib.log if e[0] == "hand_over"]
        assert len(moves) == 6 and all(slot[a] == slot[b] for a, b in moves)  # 0<->2 and 1<->3 only
        hp.set_handles_per_device("perdev", None)
        monkeypatch.setenv("LANEFLOW_PERDEV_HANDLES", "1")
        assert hp.handles_per_device("perdev") == 1
        with pool.use(lanes[3]) as (h, _ws):
            assert h is not got[1] and pool.handles() == 3  # the one-per-device key: a handle of its own
    finally:
        hp.set_handles_per_device("perdev", None)
        s.close()


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_handles_per_device_rejects_what_is_not_a_count(bad, monkeypatch):
    with pytest.raises(ValueError, match="count must be"):
        hp.set_handles_per_device("cusolverDn", bad)
    monkeypatch.setenv("LANEFLOW_CUSOLVERDN_HANDLES", "two")
    with pytest.raises(ValueError, match="LANEFLOW_CUSOLVERDN_HANDLES"):
        hp.handles_per_device("cusolverDn")


def test_set_stream_counts_per_library_and_the_reset():
    lib = GrowingLibrary("grow2")
    pool = hp.HandlePool(lib)
    s, (l0, l1) = cpu_lanes(2)
    hp.reset_handle_stats()
    for lane in (l0, l0, l1, l0):
        with pool.use(lane):
            pass
    by = hp.handle_stats()["by_library"]["grow2"]
    assert by["set_stream_issued"] == 3 and by["set_stream_elided"] == 1
    hp.reset_handle_stats()
    assert hp.handle_stats()["by_library"]["grow2"]["set_stream_issued"] == 0
    s.close()


def test_a_failing_bind_releases_the_handle_and_the_pool_keeps_working():
    lib = GrowingLibrary("grow3")
    pool = hp.HandlePool(lib)
    s, (l0, l1) = cpu_lanes(2)
    with pool.use(l0):
        pass
    lib.fail_set_stream = True
    with pytest.raises(RuntimeError, match="set_stream failed"):
        pool.use(l1)
    lib.fail_set_stream = False
    done = []

    def grab():
        with pool.use(l1):
            done.append(1)

    t = threading.Thread(target=grab)
    t.start()
    t.join(5)
    assert done == [1], "the handle stayed locked after a failed bind"
    s.close()


def test_an_error_inside_the_with_block_releases_the_handle():
    lib = GrowingLibrary("grow4")
    pool = hp.HandlePool(lib)
    s, (l0,) = cpu_lanes(1)
    with pytest.raises(ZeroDivisionError), pool.use(l0):
        1 / 0  # noqa: B018
    with pool.use(l0):  # would deadlock if the lock were still held
        pass
    s.close()


def test_policy_set_by_the_environment_is_seen_after_set_handle_policy_none(monkeypatch):
    lib = GrowingLibrary("grow5")
    pool = hp.HandlePool(lib)
    s, lanes = cpu_lanes(3)
    monkeypatch.setenv("LANEFLOW_HANDLE_POLICY", "stream")
    hp.set_handle_policy(None)
    for lane in lanes:
        with pool.use(lane):
            pass
    assert pool.handles() == 3
    s.close()


def test_the_fast_path_costs_little_host_time():
    """The pool's own cost per use (set-stream elided) stays far below a library call (a few us)."""
    import time

    lib = GrowingLibrary("grow6")
    pool = hp.HandlePool(lib)
    s, (l0,) = cpu_lanes(1)
    with pool.use(l0):
        pass
    best = 1.0
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(2000):
            with pool.use(l0) as (_h, _ws):
                pass
        best = min(best, (time.perf_counter() - t) / 2000)
    assert best < 5e-6, f"{best * 1e6:.2f} us per use"
    s.close()


# -- the GPU -----------------------------------------------------------------------------------------

def _gemms(rng, n=8):
    a = [lf.array(rng.standard_normal((64, 64)).astype(np.float32), device=lf.gpu) for _ in range(n)]
    lf.eval(*a)
    return a


def _created(lib="cublasLt"):
    return lf.cuda.handle_stats()["handles_created"].get(lib, 0)



@pytest.fixture(autouse=True)
def _no_grouping(monkeypatch):
    """These tests spread single GEMMs over lanes to exercise the handle pool; grouping would make
    each batch of independent GEMMs one call (tests/test_grouping.py covers that path)."""
    monkeypatch.setattr(grouping, "_enabled", False)

@gpu
def test_device_policy_uses_one_handle_whatever_the_lanes_and_streams(rng):
    a = _gemms(rng)
    lf.eval(lf.matmul(a[0], a[1], stream=lf.gpu))   # the device's handle exists now
    before = _created()
    streams = [lf.new_stream(lf.gpu, lanes=4) for _ in range(2)]
    outs = [lf.matmul(a[i % 8], a[(i + 1) % 8], stream=streams[i % 2]) for i in range(32)]
    lf.eval(*outs)
    assert _created() == before
    for s in streams:
        s.close()


@gpu
def test_stream_policy_creates_a_handle_per_lane(rng):
    lf.cuda.set_handle_policy("stream")
    a = _gemms(rng)
    before = _created()
    s = lf.new_stream(lf.gpu, lanes=4)
    outs = [lf.matmul(a[i], a[(i + 1) % 8], stream=s) for i in range(8)]
    lf.eval(*outs)
    used = len({o._data.buffer.writer.lane.id for o in outs})
    assert _created() - before == used >= 2
    s.close()


@gpu
def test_eight_lanes_by_500_gemms_sharing_one_handle_equal_one_lane(rng):
    a = _gemms(rng)
    one = lf.new_stream(lf.gpu, lanes=1)
    many = lf.new_stream(lf.gpu, lanes=8)
    pairs = [(i % 8, (i * 3 + 1) % 8) for i in range(4000)]
    ref = [lf.matmul(a[i], a[j], stream=one) for i, j in pairs]
    got = [lf.matmul(a[i], a[j], stream=many) for i, j in pairs]
    lf.eval(*ref, *got)
    assert len({o._data.buffer.writer.lane.id for o in got}) == 8
    for r, g in zip(ref[::97], got[::97]):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(r))
    one.close(), many.close()


@gpu
def test_four_host_threads_sharing_the_device_handle_get_identical_results(rng):
    a = _gemms(rng)
    ref = [np.asarray(lf.matmul(a[k], a[(k + 1) % 8], stream=lf.gpu)) for k in range(8)]
    repeat_in_threads(lf.gpu, lambda s: lambda: [lf.matmul(a[k], a[(k + 1) % 8], stream=s) for k in range(8)],
                      ref, reps=50, check_every=10)


# -- cuBLAS (legacy API) through its pool: bare sgemm calls on laneflow's lanes ---------------------

class _Blas:
    """Bare cublasSgemm on lanes through the device's cuBLAS pool, on raw device buffers."""

    def __init__(self, rng, n=8, g=32):
        from cuda.bindings import driver as cu
        from nvmath.bindings import cublas

        from laneflow.backends.cuda.handles import device_handles
        from laneflow.defaults import backend_for

        self.cu, self.cublas, self.g, self.n = cu, cublas, g, n
        self.ctx = backend_for(lf.gpu).context(0)
        self.pool = device_handles(self.ctx).pool("cublas")
        self.mats = [rng.standard_normal((g, g)).astype(np.float32) for _ in range(n)]
        self.ptrs = [self._put(m) for m in self.mats]
        self.one, self.zero = np.ones(1, np.float32), np.zeros(1, np.float32)
        self.outs: list[int] = []

    def _put(self, a):
        ptr = self._alloc(a.nbytes)
        assert self.cu.cuMemcpyHtoD(ptr, a.ctypes.data, a.nbytes)[0] == 0
        return ptr

    def _alloc(self, nbytes):
        self.ctx.ensure_current()
        err, ptr = self.cu.cuMemAlloc(nbytes)
        assert err == 0
        return int(ptr)

    def run(self, lanes, pairs):
        """One GEMM per pair on lanes round-robin; returns the output pointers."""
        g = self.g
        outs = [self._alloc(g * g * 4) for _ in pairs]
        self.outs += outs
        for k, (i, j) in enumerate(pairs):
            lane = lanes[k % len(lanes)]
            with self.pool.use(lane) as (h, _ws):
                self.cublas.sgemm(h, 0, 0, g, g, g, self.one.ctypes.data, self.ptrs[i], g, self.ptrs[j], g,
                                  self.zero.ctypes.data, outs[k], g)
        self.ctx.synchronize()
        return outs

    def get(self, ptr):
        out = np.empty((self.g, self.g), np.float32)
        assert self.cu.cuMemcpyDtoH(out.ctypes.data, ptr, out.nbytes)[0] == 0
        return out

    def close(self):
        self.ctx.synchronize()
        for p in self.ptrs + self.outs:
            self.cu.cuMemFree(p)


@gpu
def test_cublas_eight_lanes_by_500_gemms_sharing_one_handle_equal_one_lane(rng):
    blas = _Blas(rng)
    one, many = lf.new_stream(lf.gpu, lanes=1), lf.new_stream(lf.gpu, lanes=8)
    pairs = [(i % 8, (i * 3 + 1) % 8) for i in range(4000)]
    hp.reset_handle_stats()
    ref = blas.run(one.lanes, pairs)
    before = _created("cublas")
    got = blas.run(many.lanes, pairs)
    assert _created("cublas") == before  # device policy: the one handle served all eight lanes
    by = lf.cuda.handle_stats()["by_library"]["cublas"]
    # every set-stream is followed by binding that lane's workspace again (cublasSetStream resets it)
    assert by["set_stream_issued"] >= 4000 and by["workspace_binds"] >= by["set_stream_issued"]
    for k in range(0, 4000, 97):
        np.testing.assert_array_equal(blas.get(got[k]), blas.get(ref[k]))
    i, j = pairs[5]
    np.testing.assert_allclose(blas.get(got[5]), blas.mats[j] @ blas.mats[i], rtol=1e-4, atol=1e-4)
    blas.close()
    one.close(), many.close()


@gpu
def test_cublas_four_host_threads_sharing_the_device_handle_get_identical_results(rng):
    blas = _Blas(rng)
    pairs = [(k % 8, (k + 1) % 8) for k in range(64)]
    s0 = lf.new_stream(lf.gpu, lanes=1)
    ref = [blas.get(p) for p in blas.run(s0.lanes, pairs)]
    errors = []

    def work(t):
        try:
            s = lf.new_stream(lf.gpu, lanes=2)
            for _ in range(5):
                outs = blas.run(s.lanes, pairs)
                for k in range(0, 64, 7):
                    np.testing.assert_array_equal(blas.get(outs[k]), ref[k])
            s.close()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    run_threads(work, 4)
    assert not errors, errors[0]
    blas.close()
    s0.close()


_SPIN = r"""
extern "C" __global__ void spin(long long* out, long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) { }
  out[0] = clock64() - t0;
}
"""


@gpu
@pytest.mark.parametrize("policy", ["device", "stream"])
@pytest.mark.alone
def test_gpu_a_shared_cusolver_handle_moving_lanes_waits_on_the_device_for_the_previous_lane(policy):
    """Lane 0 is busy (a kernel spinning ~0.2 s) after it used the cuSOLVER handle. Under the device
    policy lane 1 takes the same handle over, so its work waits for lane 0 on the GPU (the host does not
    wait); under the stream policy lane 1 has a handle of its own and runs at once."""
    import time

    from cuda.bindings import driver as cu
    from nvmath.bindings import cusolverDn

    from laneflow.backends.cuda.handles import CusolverDnLibrary

    lf.cuda.set_handle_policy(policy)
    s = lf.new_stream(lf.gpu, lanes=2)
    l0, l1 = s.lanes
    ctx = l0.ctx
    pool = hp.HandlePool(CusolverDnLibrary(ctx, cusolverDn))
    spin = ctx.modules.source(_SPIN, "spin", "pq")
    out = ctx.memory.raw_alloc(8, l0.stream, "test")
    ev = cu.cuEventCreate(2)[1]  # CU_EVENT_DISABLE_TIMING
    try:
        with pool.use(l0):
            pass
        spin.launch(l0.stream, (1, 1, 1), (1, 1, 1), (out, 400_000_000))   # ~0.2 s at 2 GHz
        t = time.perf_counter()
        with pool.use(l1):
            pass
        assert time.perf_counter() - t < 0.05, "the host waited"
        cu.cuEventRecord(ev, l1.stream)
        ready = False
        while time.perf_counter() - t < 0.08 and not ready:
            ready = cu.cuEventQuery(ev)[0] == cu.CUresult.CUDA_SUCCESS
        assert ready == (policy == "stream"), f"lane 1 ready after {time.perf_counter() - t:.3f} s"
        assert pool.handles() == (1 if policy == "device" else 2)
    finally:
        ctx.synchronize()
        cu.cuEventDestroy(ev)
        ctx.memory.raw_free(out, l0.stream)
        pool.close(free_workspaces=True)
        s.close()


@gpu
@pytest.mark.parametrize("policy", ["device", "stream"])
def test_cublas_and_cusolver_handles_per_policy(rng, policy):
    lf.cuda.set_handle_policy(policy)
    blas = _Blas(rng)
    streams = [lf.new_stream(lf.gpu, lanes=4) for _ in range(2)]
    lanes = [lane for s in streams for lane in s.lanes]
    b0, s0 = _created("cublas"), _created("cusolverDn")
    blas.run(lanes, [(k % 8, (k + 1) % 8) for k in range(16)])
    a = rng.standard_normal((16, 6, 6)) + 6 * np.eye(6)
    xs = [lf.linalg.inv(lf.array(a[k], stream=streams[k % 2]), stream=streams[k % 2]) for k in range(16)]
    lf.eval(*xs)
    solver_lanes = len({x._data.buffer.writer.lane.id for x in xs})
    if policy == "device":
        assert _created("cublas") - b0 <= 1 and _created("cusolverDn") - s0 <= 1
    else:
        assert _created("cublas") - b0 == len(lanes)
        assert _created("cusolverDn") - s0 == solver_lanes >= 2
    np.testing.assert_allclose(np.asarray(xs[3]), np.linalg.inv(a[3]), rtol=1e-9, atol=1e-12)
    blas.close()
    for s in streams:
        s.close()


@gpu
def test_handle_stats_report_bytes_per_library_and_devices(rng):
    blas = _Blas(rng, n=2)
    s = lf.new_stream(lf.gpu, lanes=2)
    blas.run(s.lanes, [(0, 1), (1, 0)])
    lf.eval(lf.linalg.cholesky(lf.array(np.eye(3) * 4, stream=s), stream=s))
    st = lf.cuda.handle_stats()
    for lib in ("cublas", "cusolverDn"):
        assert st["handles_live"][lib] >= 1
        assert st["handle_bytes_how"][lib] in ("measured", "estimate")
        assert st["handle_bytes"][lib] >= 0
    assert st["workspace_bytes"]["cublas"] >= 2 * (4 << 20)
    assert st["workspace_bytes"]["cusolverDn"] > 0
    dev = st["devices"]["gpu:0"]
    assert dev["cublas"]["handles"] >= 1 and dev["cublas"]["workspace_bytes"] >= 2 * (4 << 20)
    assert st["set_stream_issued"] + st["set_stream_elided"] > 0
    blas.close()
    s.close()


@gpu
def test_a_closed_streams_lanes_give_their_workspaces_back(rng):
    blas = _Blas(rng, n=2)
    lf.eval(lf.linalg.inv(lf.eye(4, stream=lf.gpu) * 2, stream=lf.gpu))
    before = dict(lf.cuda.handle_stats()["workspace_bytes"])
    s = lf.new_stream(lf.gpu, lanes=3)
    blas.run(s.lanes, [(0, 1)] * 3)
    xs = [lf.linalg.inv(lf.eye(5, stream=s) * (k + 2), stream=s) for k in range(6)]
    lf.eval(*xs)
    grown = lf.cuda.handle_stats()["workspace_bytes"]
    assert grown["cublas"] > before.get("cublas", 0) and grown["cusolverDn"] > before.get("cusolverDn", 0)
    s.close()
    lf.eval(lf.add(lf.ones(3, stream=lf.gpu), 1.0, stream=lf.gpu))  # the next command destroys retired lanes
    after = lf.cuda.handle_stats()["workspace_bytes"]
    for lib in ("cublas", "cusolverDn", "cublasLt"):
        assert after.get(lib, 0) == before.get(lib, 0), lib
    blas.close()
