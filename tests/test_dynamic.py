"""lf.dynamic_slice and lf.dynamic_update_slice (ops/dynamic.py): starts that are ints or 0-d integer
arrays on the device, clamped as JAX clamps them; in-place updates of a value nothing else sees; a
compiled step whose 0-d position changes every call without a new trace or capture."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf
from conftest import random_array


def _np_window(shape, starts, sizes):
    return tuple(slice(min(max(s, 0), n - z), min(max(s, 0), n - z) + z) for s, n, z in zip(starts, shape, sizes))


@pytest.mark.parametrize("seed", range(8))
def test_dynamic_slices_match_numpy_with_clamping(device, seed):
    r = np.random.default_rng(seed)
    nd = int(r.integers(1, 4))
    shape = tuple(int(v) for v in r.integers(1, 7, nd))
    x = random_array(r, shape, [np.float32, np.int32, np.float64, lf.bfloat16][seed % 4])
    sizes = tuple(int(r.integers(0, n + 1)) for n in shape)
    starts = [int(v) for v in r.integers(-3, 9, nd)]  # out of range on purpose: clamped
    idx_dt = [np.int32, np.int64, np.uint8, np.int16][seed % 4]
    with lf.stream(device):
        X = lf.array(x)
        mixed = [lf.array(np.array(max(s, 0) if idx_dt == np.uint8 else s, idx_dt)) if k % 2 == 0 else s
                 for k, s in enumerate(starts)]
        want_starts = [max(s, 0) if idx_dt == np.uint8 and k % 2 == 0 else s for k, s in enumerate(starts)]
        got = np.asarray(lf.dynamic_slice(X, mixed, sizes))
        np.testing.assert_array_equal(got, x[_np_window(shape, want_starts, sizes)])
        u = random_array(r, sizes, x.dtype)
        got = np.asarray(lf.dynamic_update_slice(X, lf.array(u), mixed))
        want = x.copy()
        want[_np_window(shape, want_starts, sizes)] = u
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.asarray(X), x)  # value semantics: x keeps its value


def test_an_update_of_a_value_no_one_else_sees_is_written_in_place(device):
    with lf.stream(lf.new_stream(device, lanes=1)):
        cache = lf.zeros((2, 3, 16, 4))
        lf.eval(cache)
        ref = np.zeros((2, 3, 16, 4), np.float32)
        for t in range(6):
            kv = lf.full((2, 3, 1, 4), float(t + 1))
            lf.eval(kv)
            lf.reset_stats()
            cache = lf.dynamic_update_slice(cache, kv, (0, 0, lf.array(np.int32(t)), 0))
            lf.eval(cache)
            ref[:, :, t] = t + 1
        np.testing.assert_array_equal(np.asarray(cache), ref)
        assert lf.stats()["commands"] <= 2  # the position's upload and the update: no copy of the cache


@pytest.mark.parametrize("batch", [1, 3])
def test_a_transposed_slice_is_written_into_a_cache_without_a_copy_of_its_own(device, rng, batch):
    """A decode step's keys: heads of a slice of the qkv product, (b, 1, h, d) transposed to (b, h, 1, d),
    read by the update through a strided view (graph/views.py), and the cache still written in place."""
    h, d, S = 3, 4, 8
    qkv = random_array(rng, (batch, 1, 3 * h * d), np.float32)
    with lf.stream(lf.new_stream(device, lanes=1)):
        cache = lf.zeros((batch, h, S, d), dtype=lf.float32)
        Q = lf.array(qkv)
        lf.eval(cache, Q)
        ref = np.zeros((batch, h, S, d), np.float32)
        for t in range(3):
            pos = lf.array(np.int32(t))
            lf.eval(pos)
            lf.reset_stats()
            k = Q[..., h * d:2 * h * d].reshape(batch, 1, h, d).transpose(0, 2, 1, 3)
            cache = lf.dynamic_update_slice(cache, k, (0, 0, pos, 0))
            del k  # (an array a user holds is a value of its own: evaluated with the cache)
            lf.eval(cache)
            assert lf.stats()["commands"] == 1  # the update alone: no copy of k, none of the cache
            ref[:, :, t] = qkv[..., h * d:2 * h * d].reshape(batch, h, d)
        np.testing.assert_array_equal(np.asarray(cache), ref)


def test_a_compiled_step_takes_a_new_position_every_call_without_a_new_capture(device):
    def step(cache, pos, kv):
        c = lf.dynamic_update_slice(cache, kv, (0, pos, 0))
        return c, lf.dynamic_slice(c, (0, pos, 0), (2, 1, 3)).sum()
    f = lf.compile(step)
    with lf.stream(lf.new_stream(device, lanes=1)):
        cache = lf.zeros((2, 10, 3))
        ref = np.zeros((2, 10, 3), np.float32)
        for t in range(12):  # past the end: the start is clamped to 9
            kv = np.full((2, 1, 3), t + 1, np.float32)
            cache, s = f(cache, lf.array(np.int32(t)), lf.array(kv))
            p = min(t, 9)
            ref[:, p:p + 1] = kv
            assert float(s) == 6.0 * (t + 1)
        np.testing.assert_array_equal(np.asarray(cache), ref)
    stats = f.stats()
    assert len(stats) == 1  # one trace for every position
    if device.type == "gpu":
        assert stats[0]["mode"] == "cuda graph" and stats[0]["captures"] <= 3  # two output sets, one re-binding


def test_errors_name_the_op_and_shapes(device):
    with lf.stream(device):
        x = lf.zeros((4, 5))
        with pytest.raises(ValueError, match=r"dynamic_slice: 1 start indices .*\(4, 5\)"):
            lf.dynamic_slice(x, (0,), (1, 1))
        with pytest.raises(ValueError, match="dynamic_slice: sizes"):
            lf.dynamic_slice(x, (0, 0), (5, 1))
        with pytest.raises(TypeError, match="dynamic_slice: start index 1 must be a 0-d integer array"):
            lf.dynamic_slice(x, (0, lf.array(1.5)), (1, 1))
        with pytest.raises(TypeError, match="start index 0 is a bool"):
            lf.dynamic_slice(x, (True, 0), (1, 1))
        with pytest.raises(ValueError, match=r"dynamic_update_slice: an update \(5, 1\) float\d+ does not fit"):
            lf.dynamic_update_slice(x, lf.zeros((5, 1)), (0, 0))
        with pytest.raises(TypeError, match="start must be a sequence"):
            lf.dynamic_update_slice(x, lf.zeros((1, 1)), 3)
