"""lf.compile(fn, donate_argnums=...): a donated argument's buffer is updated in place (a KV cache is
not copied per step), the donated Arrays cannot be used after the call, and results equal the
undonated function's, on commands, on the CPU's one-command executor and in CUDA graphs."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import laneflow as lf


def _step(cache, pos, kv):
    c = lf.dynamic_update_slice(cache, kv, (0, pos, 0))
    return c, (lf.dynamic_slice(c, (0, pos, 0), (2, 1, 3)) * 2).sum()


def _ptr(a):
    b = a._data.buffer
    return b.data.ctypes.data if isinstance(b.data, np.ndarray) else b.data.ptr


def test_a_donated_cache_is_updated_in_place_and_matches_the_undonated_step(device):
    f, g = lf.compile(_step, donate_argnums=(0,)), lf.compile(_step)
    with lf.stream(lf.new_stream(device, lanes=2)):
        c1 = lf.zeros((2, 12, 3))
        c2 = lf.zeros((2, 12, 3))
        ptrs, captures = [], []
        for t in range(8):
            kv = lf.array(np.full((2, 1, 3), t + 0.5, np.float32))
            pos = lf.array(np.int64(t))
            c1, s1 = f(c1, pos, kv)
            c2, s2 = g(c2, pos, kv)
            assert float(s1) == float(s2) == 12 * (t + 0.5)
            ptrs.append(_ptr(c1))
            data = c1._data.buffer.data  # the memory later ops read the value through: its own shape
            assert tuple(data.shape) == c1.shape and data.dtype == c1.dtype
            captures.append(f.stats()[0].get("captures"))
        np.testing.assert_array_equal(np.asarray(c1), np.asarray(c2))
    # from the third call on (the second builds the executor / graph) the cache stays where it is
    assert len(set(ptrs[2:])) == 1, ptrs
    st = f.stats()[0]
    if device.type == "gpu":  # no capture per call: the position and the update are data
        assert st["mode"] == "cuda graph" and captures[4] == captures[-1], (st, captures)


def test_a_donated_array_cannot_be_used_after_the_call(device):
    f = lf.compile(_step, donate_argnums=0)
    with lf.stream(device):
        cache = lf.zeros((2, 4, 3))
        new, _ = f(cache, lf.array(np.int32(1)), lf.ones((2, 1, 3)))
        with pytest.raises(lf.CompileError, match="donated to the compiled function _step"):
            cache + 1
        with pytest.raises(lf.CompileError, match="donated"):
            np.asarray(cache)
        assert np.asarray(new)[:, 1].sum() == 6


def test_a_value_held_elsewhere_is_copied_not_overwritten(device):
    f = lf.compile(_step, donate_argnums=(0,))
    with lf.stream(device):
        cache = lf.zeros((2, 4, 3))
        other = copy.copy(cache)  # a second Array bound to the same value: that value cannot be written
        for t in range(4):
            held = copy.copy(cache) if t == 2 else None  # the graph's own state buffer, held elsewhere
            cache, _ = f(cache, lf.array(np.int32(t)), lf.ones((2, 1, 3)))
            if held is not None:
                assert np.asarray(held).sum() == 12  # calls 0 and 1 wrote it; call 2 did not overwrite it
        np.testing.assert_array_equal(np.asarray(other), 0)
        assert np.asarray(cache).sum() == 24


def test_donated_lists_of_arrays_and_bad_arguments(device):
    def step(caches, pos):
        return [lf.dynamic_update_slice(c, lf.full((1, 2), 7.0), (pos, 0)) for c in caches]
    f = lf.compile(step, donate_argnums=(0,))
    with lf.stream(device):
        caches = [lf.zeros((5, 2)) for _ in range(3)]
        for t in range(5):
            caches = f(caches, lf.array(np.int32(t)))
        for c in caches:
            np.testing.assert_array_equal(np.asarray(c), 7.0)
        c = lf.zeros((5, 2))
        with pytest.raises(ValueError, match="donated array is passed twice"):
            f([c, c], lf.array(np.int32(0)))   # a new structure: checked before it is traced
        with pytest.raises(ValueError, match="donated array is passed twice"):
            f([c, lf.zeros((5, 2)), c], lf.array(np.int32(0)))   # the traced structure: checked as well
        np.testing.assert_array_equal(np.asarray(c), 0.0)  # nothing was donated or written
    with pytest.raises(TypeError, match="donate_argnums"):
        lf.compile(step, donate_argnums=(-1,))
    with pytest.raises(TypeError, match="donate_argnums"):
        lf.compile(step, donate_argnums="0")


_FAKE_SCRIPT = r"""
import sys
sys.path.insert(0, sys.argv[1])
import fake_cuda
fake_cuda.install()
import numpy as np, laneflow as lf
f = lf.compile(lambda c, p, kv: lf.dynamic_update_slice(c, kv, (0, p, 0)), donate_argnums=(0,))
with lf.stream(lf.gpu):
    c = lf.zeros((2, 12, 3))
    ptrs = []
    for t in range(5):
        c = f(c, lf.array(np.int32(t)), lf.ones((2, 1, 3)))
        lf.eval(c)
        h = c._data.buffer.data
        assert tuple(h.shape) == (2, 12, 3) and h.dtype == c.dtype, (h.shape, h.dtype)
        ptrs.append(h.ptr)
    assert f.stats()[0]["mode"] == "cuda graph" and len(set(ptrs[1:])) == 1, (f.stats(), ptrs)
print("donation ok")
"""


def test_a_graphs_state_buffer_is_a_value_of_the_arguments_shape_on_the_fake_gpu(tmp_path):
    """On the CUDA backend (fake driver, no GPU): from the graph's first call on, the cache lives in the
    graph's state buffer, whose handle has the argument's shape and dtype (later eager ops read it so)."""
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed")
    from conftest import run_under_fake_driver

    p = run_under_fake_driver(_FAKE_SCRIPT, tmp_path, timeout=120)
    assert p.returncode == 0 and "donation ok" in p.stdout, p.stdout[-2000:] + p.stderr[-3000:]


def _chain_allocations(n: int) -> tuple[int, np.ndarray]:
    """Allocations made by an uncached chain of n adds on one CPU lane (fusion off), and its value."""
    from laneflow.graph import eval_cache, fusion
    from laneflow.runtime.backend import backend_for

    backend = backend_for(lf.cpu)
    made = []
    real = backend.allocate

    def counting(*a, **k):
        made.append(a)
        return real(*a, **k)

    st = lf.new_stream(lf.cpu, lanes=1)
    x = lf.array(np.arange(4, dtype=np.float32), stream=st)
    lf.eval(x)
    was = fusion._enabled
    fusion.set_enabled(False)
    backend.allocate = counting
    try:
        with lf.stream(st), eval_cache.bypass():
            y = x
            for _ in range(n):
                y = y + 1.0
            lf.eval(y)
    finally:
        del backend.allocate
        fusion.set_enabled(was)
    return len(made), np.asarray(y)


def test_a_primitive_class_attribute_changed_later_is_read_again(monkeypatch):
    """The C submit path (graph/csubmit.c) keeps a primitive class's attributes per class while the
    class is unchanged; assigning one later (here: elementwise ops no longer write in place) is seen at
    the next node, as the Python path sees it."""
    from laneflow.ops.primitives import Elementwise

    n, want = 10, np.arange(4, dtype=np.float32) + 10
    allocs, got = _chain_allocations(n)
    np.testing.assert_array_equal(got, want)
    assert allocs == 1  # the first add allocates; the rest write in place
    monkeypatch.setattr(Elementwise, "donates", False)
    allocs, got = _chain_allocations(n)
    np.testing.assert_array_equal(got, want)
    assert allocs == n


def test_a_backends_own_kernel_of_is_asked(monkeypatch):
    """Every place that runs a primitive asks the backend's kernel_of (runtime/backend.py): the C submit
    path too, when a backend has its own."""
    from laneflow.runtime.backend import backend_for

    backend = backend_for(lf.cpu)
    asked = []
    base = type(backend).kernel_of

    def own(self, prim):
        asked.append(prim.name)
        return base(self, prim)

    monkeypatch.setattr(type(backend), "kernel_of", own)
    _, got = _chain_allocations(5)
    np.testing.assert_array_equal(got, np.arange(4, dtype=np.float32) + 5)
    assert asked.count("add") == 5
