"""CUDA backend specifics: lanes and event fences, CPU<->GPU waits, memory, the kernel cache, matmul,
random bits. Every test needs a usable GPU and skips without one (one-line reason)."""

from __future__ import annotations

import os
import stat
import time

import numpy as np
import pytest

import laneflow as lf
from conftest import random_array

pytestmark = pytest.mark.skipif(not lf.gpu_available(), reason="no usable GPU: laneflow's CUDA backend or an NVIDIA driver is missing")


def _backend():
    from laneflow.defaults import backend_for

    return backend_for(lf.gpu)


# -- lanes, fences, waits ------------------------------------------------------------------------


def _spin_commands(stream, n: int, cycles: int):
    """Encode n independent clock-spin commands on stream (each writes its own buffer)."""
    from laneflow.backends.cuda.kernels.misc import gpu_spin

    b = _backend()
    bufs = [b.allocate(stream.device, (1,), np.dtype(np.int64), "spin") for _ in range(n)]
    for buf in bufs:
        def fn(lane, h=buf.data):
            gpu_spin(lane, cycles, h.ptr)
        stream.encoder.encode("spin", fn, (), (buf,))
    return bufs


def _timed_spins(lanes: int, cycles: int) -> float:
    s = lf.new_stream(lf.gpu, lanes=lanes)
    _spin_commands(s, 2, 1000)  # warm up (compile, allocate)
    s.synchronize()
    t = time.perf_counter()
    _spin_commands(s, 2, cycles)
    s.synchronize()
    return time.perf_counter() - t


@pytest.mark.alone
def test_two_spinning_commands_overlap_on_two_lanes_and_serialise_on_one():
    cycles = 4_000_000  # about 2 ms at H200 clocks
    one = _timed_spins(1, cycles)
    two = _timed_spins(2, cycles)
    assert two < 0.75 * one, f"two lanes took {two * 1e3:.2f} ms, one lane {one * 1e3:.2f} ms"


def test_fence_value_and_host_wait_follow_the_gpu():
    s = lf.new_stream(lf.gpu, lanes=1)
    lane = s.lanes[0]
    _spin_commands(s, 1, 1000)
    s.synchronize()
    bufs = _spin_commands(s, 3, 2_000_000)
    assert lane.pending() >= 1
    assert lane.host_wait(lane.submitted, timeout=10.0)
    assert lane.fence.value == lane.submitted and lane.pending() == 0
    del bufs


def test_cross_lane_dependencies_with_random_delays_give_program_order_results(rng):
    s = lf.new_stream(lf.gpu, lanes=4)
    a = random_array(rng, (64, 33), lf.float32)
    with lf.testing.inject_delays(0.0005, seed=1), lf.stream(s):
        x = lf.array(a)
        parts = [x * float(k) + 1.0 for k in range(8)]
        total = parts[0]
        for p in parts[1:]:
            total = total + p
        y = lf.exp(total * 0.001)
        lf.eval(y)
    want = np.exp(sum(a * k + 1 for k in range(8)).astype(np.float32) * np.float32(0.001))
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5)


@pytest.mark.parametrize("direction", ["cpu_to_gpu", "gpu_to_cpu"])
def test_arrays_cross_between_cpu_and_gpu_streams_with_delays(rng, direction):
    a = random_array(rng, (128, 7), lf.float32)
    cpu = lf.new_stream(lf.cpu, lanes=2)
    gpu = lf.new_stream(lf.gpu, lanes=2)
    first, second = (cpu, gpu) if direction == "cpu_to_gpu" else (gpu, cpu)
    with lf.testing.inject_delays(0.002, seed=3):
        x = lf.sqrt(lf.abs(lf.array(a, stream=first)) + 1.0, stream=first)
        y = lf.multiply(x, 2.0, stream=second)
        z = lf.add(y, x, stream=first)
        lf.eval(z)
    base = np.sqrt(np.abs(a) + np.float32(1.0))
    np.testing.assert_allclose(np.asarray(z), base * 2 + base, rtol=1e-6)


def test_write_after_a_cpu_read_of_a_gpu_buffer_waits_for_the_reader(rng):
    a = random_array(rng, (4096,), lf.float32)
    gpu = lf.new_stream(lf.gpu, lanes=2)
    cpu = lf.new_stream(lf.cpu, lanes=1)
    with lf.testing.inject_delays(fixed=0.01):
        x = lf.add(lf.array(a, stream=gpu), 1.0, stream=gpu)
        on_cpu = lf.multiply(x, 1.0, stream=cpu)  # copies x to the host on the CPU lane (delayed)
        lf.async_eval(on_cpu)
        x[0:100] = 0.0  # in place on the GPU only once the CPU copy has finished
        lf.eval(x, on_cpu)
    np.testing.assert_array_equal(np.asarray(on_cpu), a + np.float32(1))


# -- memory ----------------------------------------------------------------------------------------


def test_memory_returns_to_baseline_after_ten_thousand_evals(rng):
    b = _backend()
    s = lf.new_stream(lf.gpu, lanes=2)
    x = lf.array(random_array(rng, (1000,), lf.float32), stream=s)
    lf.eval(x)
    for _ in range(50):
        lf.eval(lf.exp(x * 2.0, stream=s))
    s.synchronize()
    base = b.memory_stats()["used"]
    for _ in range(10_000):
        y = lf.exp(x * 2.0, stream=s) + 1.0
        lf.eval(y)
    del y
    s.synchronize()
    b.memory_stats()
    s.synchronize()
    assert b.memory_stats()["used"] <= base + (1 << 16)


def test_out_of_memory_raises_with_requested_and_free_bytes_and_runtime_keeps_working(rng):
    huge = 1 << 42  # 4 TiB of float32
    with lf.stream(lf.gpu):
        x = lf.zeros((huge // 4,), lf.float32)
        with pytest.raises(lf.OutOfMemoryError) as info:
            lf.eval(x)
    assert info.value.requested == huge and info.value.free is not None
    assert isinstance(info.value, MemoryError)
    a = random_array(rng, (100,), lf.float32)
    with lf.stream(lf.gpu):
        np.testing.assert_allclose(np.asarray(lf.array(a) * 2.0), a * 2)


def test_an_in_place_update_of_a_dead_value_reuses_its_gpu_buffer(rng):
    a = random_array(rng, (256,), lf.float32)
    with lf.stream(lf.new_stream(lf.gpu, lanes=1)):
        x = lf.array(a) + 1.0
        lf.eval(x)
        before = x._data.buffer
        y = x * 3.0
        del x
        lf.eval(y)
        assert y._data.buffer is before
    np.testing.assert_allclose(np.asarray(y), (a + 1) * 3, rtol=1e-6)


# -- kernel cache ------------------------------------------------------------------------------------


def test_kernel_disk_cache_is_private_and_a_corrupt_entry_is_recompiled(tmp_path, monkeypatch):
    from laneflow.backends.cuda import nvrtc

    d = tmp_path / "kc"
    monkeypatch.setenv("LANEFLOW_KERNEL_CACHE", str(d))
    src = 'extern "C" __global__ void lf_t(int* x) { x[0] = %d; }' % (int(time.time_ns()) % 100000)
    ctx = _backend().context(0)
    key, image = nvrtc.compile(src, ctx.cc, "lf_t")
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    entry = d / key
    assert entry.exists() and stat.S_IMODE(os.stat(entry).st_mode) == 0o600
    data = bytearray(entry.read_bytes())
    data[-10] ^= 0xFF
    entry.write_bytes(bytes(data))
    nvrtc._mem.pop(key)
    key2, image2 = nvrtc.compile(src, ctx.cc, "lf_t")
    assert key2 == key and image2 == image
    assert entry.read_bytes() != bytes(data)  # rewritten with a good entry


def test_compile_error_shows_the_offending_source_line():
    from laneflow.backends.cuda import nvrtc

    src = 'extern "C" __global__ void lf_bad(int* x) {\n  x[0] = 1;\n  x[1] = undefined_name;\n}\n'
    with pytest.raises(nvrtc.KernelCompileError) as info:
        nvrtc.compile(src, _backend().context(0).cc, "lf_bad")
    msg = str(info.value)
    assert "undefined_name" in msg and "line 3" in msg


# -- numerics against numpy ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [lf.float16, lf.bfloat16, lf.float32, lf.float64])
@pytest.mark.parametrize("shapes", [((64, 48), (48, 80)), ((3, 17, 9), (9, 5)), ((2, 1, 8, 4), (3, 4, 6)), ((7,), (7, 3)), ((5, 7), (7,))])
def test_matmul_matches_numpy_with_batches_and_broadcasting(rng, dtype, shapes):
    sa, sb = shapes
    a, b = random_array(rng, sa, dtype), random_array(rng, sb, dtype)
    with lf.stream(lf.gpu):
        got = np.asarray(lf.matmul(lf.array(a), lf.array(b))).astype(np.float64)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    tol = {lf.float16: 2e-2, lf.bfloat16: 5e-2, lf.float32: 1e-5, lf.float64: 1e-12}[dtype]
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    assert got.shape == want.shape and err < tol


@pytest.mark.parametrize("dtype", [lf.int8, lf.int32, lf.int64, lf.bool_])
def test_integer_matmul_wraps_like_numpy(rng, dtype):
    a, b = random_array(rng, (2, 5, 6), dtype), random_array(rng, (6, 3), dtype)
    with lf.stream(lf.gpu):
        got = lf.matmul(lf.array(a), lf.array(b))
    np.testing.assert_array_equal(np.asarray(got), np.matmul(a, b))


def test_random_bits_match_the_cpu_backend():
    k = lf.random.key(1234)
    for dtype in (lf.float32, lf.float64, lf.bfloat16):
        c = np.asarray(lf.random.uniform((1000,), dtype, key=k, stream=lf.cpu))
        g = np.asarray(lf.random.uniform((1000,), dtype, key=k, stream=lf.gpu))
        np.testing.assert_array_equal(c, g)
        c = np.asarray(lf.random.normal((1000,), dtype, key=k, stream=lf.cpu)).astype(np.float64)
        g = np.asarray(lf.random.normal((1000,), dtype, key=k, stream=lf.gpu)).astype(np.float64)
        np.testing.assert_allclose(g, c, rtol=1e-5 if dtype != lf.bfloat16 else 1e-2, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(lf.random.split(k, 5, stream=lf.cpu)),
                                  np.asarray(lf.random.split(k, 5, stream=lf.gpu)))


REDUCTIONS = ["sum", "prod", "max", "min", "mean", "var", "std", "any", "all"]


@pytest.mark.parametrize("op", REDUCTIONS)
@pytest.mark.parametrize("dtype", [lf.bool_, lf.int8, lf.int32, lf.float16, lf.bfloat16, lf.float32, lf.float64])
def test_reductions_over_any_axes_match_the_cpu_backend(rng, op, dtype):
    shape = (5, 6, 7, 3)
    a = random_array(rng, shape, dtype)
    if op == "prod" and dtype not in (lf.bool_,):
        a = (np.sign(a.astype(np.float64)) + (a == 0)).astype(dtype)  # +-1: no overflow
    for axes in [None, 0, 3, (1, 2), (0, 2), (0, 1, 3), ()]:
        for keepdims in (False, True):
            try:
                want = np.asarray(getattr(lf, op)(lf.array(a, stream=lf.cpu), axis=axes, keepdims=keepdims))
            except (TypeError, ValueError):
                continue
            got = np.asarray(getattr(lf, op)(lf.array(a, stream=lf.gpu), axis=axes, keepdims=keepdims))
            assert got.dtype == want.dtype and got.shape == want.shape
            if want.dtype.kind in "biu":
                np.testing.assert_array_equal(got, want)
            else:
                tol = 1e-2 if dtype in (lf.float16, lf.bfloat16) else 1e-5
                np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


def test_large_reductions_split_over_blocks_match_numpy(rng):
    a = rng.standard_normal((3, 1 << 20)).astype(np.float32)
    with lf.stream(lf.gpu):
        x = lf.array(a)
        s_all, s_row, s_col, v = lf.sum(x), lf.sum(x, axis=1), lf.sum(x, axis=0), lf.var(x, axis=1)
        mx = lf.max(x, axis=1)
    np.testing.assert_allclose(np.asarray(s_all), a.astype(np.float64).sum(), rtol=1e-4, atol=1e-2)
    np.testing.assert_allclose(np.asarray(s_row), a.astype(np.float64).sum(1), rtol=1e-4, atol=1e-2)
    np.testing.assert_allclose(np.asarray(s_col), a.sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(v), a.astype(np.float64).var(1), rtol=1e-4)
    np.testing.assert_array_equal(np.asarray(mx), a.max(1))


@pytest.mark.parametrize("dtype", [lf.int8, lf.float16, lf.float32, lf.float64])
def test_argmax_argmin_softmax_logsumexp_match_the_cpu_backend(rng, dtype):
    a = random_array(rng, (6, 5, 9), dtype)
    if dtype.kind == "f" or dtype == lf.bfloat16:
        a[1, 2, 3] = np.nan
    for fn, kw in [(lf.argmax, {"axis": None}), (lf.argmin, {"axis": 1}), (lf.argmax, {"axis": 2}),
                   (lf.softmax, {"axis": -1}), (lf.softmax, {"axis": (0, 1)}), (lf.logsumexp, {"axis": 1}),
                   (lf.logsumexp, {"axis": None})]:
        want = np.asarray(fn(lf.array(a, stream=lf.cpu), **kw))
        got = np.asarray(fn(lf.array(a, stream=lf.gpu), **kw))
        assert got.dtype == want.dtype and got.shape == want.shape, fn
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-2 if dtype == lf.float16 else 1e-5,
                                   atol=1e-3 if dtype == lf.float16 else 1e-6, equal_nan=True)


def test_indexing_take_setitem_concatenate_match_numpy(rng):
    a = random_array(rng, (4, 5, 6), lf.float32)
    idx = np.array([[0, 3], [-1, 2]])
    with lf.stream(lf.gpu):
        x = lf.array(a)
        cases = {
            "slice": (x[1:3, ::2, -1], a[1:3, ::2, -1]),
            "newaxis": (x[None, 2, :, 1:4], a[None, 2, :, 1:4]),
            "adv": (x[idx, 1:4], a[idx, 1:4]),
            "adv_split": (x[idx, :, np.array([1, 0])[:, None, None] * 0 + 2], a[idx, :, np.array([1, 0])[:, None, None] * 0 + 2]),
            "take": (lf.take(x, np.array([4, 0, 2]), axis=1), np.take(a, [4, 0, 2], axis=1)),
            "take_flat": (lf.take(x, np.array([[7, 100], [0, -1]])), np.take(a, [[7, 100], [0, -1]])),
            "concat": (lf.concatenate([x, x[:, :2] * 2], axis=1), np.concatenate([a, a[:, :2] * 2], axis=1)),
            "transpose": (lf.transpose(x, (2, 0, 1)), a.transpose(2, 0, 1)),
            "broadcast": (lf.broadcast_to(x[:, :1], (4, 3, 6)), np.broadcast_to(a[:, :1], (4, 3, 6))),
            "reshape": (x.reshape(20, 6), a.reshape(20, 6)),
        }
        y = lf.array(a)
        y[1:3, 2] = 7.0
        y[np.array([0, 3]), :, np.array([5, 1])] = -1.0
        b = a.copy()
        b[1:3, 2] = 7.0
        b[np.array([0, 3]), :, np.array([5, 1])] = -1.0
        cases["setitem"] = (y, b)
    for name, (got, want) in cases.items():
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=name)
    with pytest.raises((IndexError, lf.ExecutionError)):
        with lf.stream(lf.gpu):
            np.asarray(lf.take(lf.array(a), np.array([0, 500])))


def test_creation_ops_match_numpy():
    with lf.stream(lf.gpu):
        cases = [
            (lf.arange(3, 40, 3), np.arange(3, 40, 3)),
            (lf.arange(0.5, 7.25, 0.75), np.arange(0.5, 7.25, 0.75)),
            (lf.arange(10, dtype=lf.bfloat16), np.arange(10).astype(lf.bfloat16)),
            (lf.linspace(-1, 2, 13), np.linspace(-1, 2, 13)),
            (lf.linspace(0, 1, 7, endpoint=False, dtype=lf.float32), np.linspace(0, 1, 7, endpoint=False).astype(np.float32)),
            (lf.eye(4, 6, k=1, dtype=lf.int8), np.eye(4, 6, 1, dtype=np.int8)),
            (lf.full((3, 2), 2.5, dtype=lf.float64), np.full((3, 2), 2.5)),
            (lf.full((5,), -3, dtype=lf.int64), np.full((5,), -3, np.int64)),
            (lf.full((5,), 1.5, dtype=lf.bfloat16), np.full((5,), 1.5).astype(lf.bfloat16)),
        ]
    for got, want in cases:
        g = np.asarray(got)
        assert g.dtype == want.dtype
        np.testing.assert_array_equal(g.astype(np.float64), want.astype(np.float64))


def test_a_cpu_lane_waiting_late_on_a_gpu_point_never_deadlocks_with_gpu_work_waiting_on_it(rng):
    """GPU lanes record events lazily; a CPU worker reaches its wait only when it gets there, by which
    time the GPU stream holds work that waits on that worker. The wait is pinned when encoded, so it
    never waits for that later work."""
    g = lf.new_stream(lf.gpu, lanes=1)
    c = lf.new_stream(lf.cpu, lanes=1)
    xn = rng.standard_normal(64).astype(np.float32)
    with lf.testing.inject_delays(0.002, seed=3):  # the CPU worker runs behind the host
        for _ in range(3):
            x = lf.array(xn, stream=g) * 2.0          # a few GPU commands, no event of its own yet
            y = lf.add(lf.array(x, device=lf.cpu), 1.0, stream=c)  # the CPU lane waits on x
            z = lf.add(lf.array(y, device=lf.gpu), 1.0, stream=g)  # the GPU lane waits on the CPU lane
            w = z * 3.0
            lf.eval(w, timeout=30)
            np.testing.assert_allclose(np.asarray(w), ((xn * 2.0) + 2.0) * 3.0, rtol=1e-6)
    g.close(), c.close()
