"""Last-axis reductions fuse with their elementwise producers and consumers into one row program
(graph/rowfusion.py): a hand-written layer norm and a softmax with a scale and a mask become one
command each.

On the CPU a row program runs the members' own kernels, so its results are the unfused ones bit for
bit. On the GPU a reduction adds up its elements in another order than the unfused reduce kernel, so
the fused result must be as close to a float64 reference as the unfused one is, up to a small factor
(the documented tolerance: at most twice the unfused error plus two ulps of the dtype at the row's
magnitude).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import laneflow as lf
from laneflow.defaults import backend_for
from laneflow.graph import fusion
from conftest import random_array

DTYPES = [np.float32, np.float64, "bfloat16", np.float16]


def _dt(d):
    return np.dtype(lf.bfloat16) if d == "bfloat16" else np.dtype(d)


@pytest.fixture
def fused(device, monkeypatch):
    """``device`` with fusion on, whatever LANEFLOW_FUSE says."""
    monkeypatch.setattr(fusion, "_enabled", True)
    monkeypatch.setattr(type(backend_for(device)), "fuses_elementwise", True)
    return device


def _run(device, build, inputs, fuse: bool, monkeypatch, compiled: bool = False):
    """(host results, commands of the evaluation) of ``build(*arrays)``."""
    monkeypatch.setattr(fusion, "_enabled", fuse)
    st = lf.new_stream(device, lanes=1)
    try:
        with lf.stream(st):
            xs = [lf.array(x) for x in inputs]
            lf.eval(*xs)
            fn = lf.compile(build) if compiled else build
            if compiled:
                fn(*xs)  # trace and build
            lf.reset_stats()
            outs = fn(*xs)
            outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
            lf.eval(*outs)
            n = lf.stats()["commands"]
            return [np.asarray(o) for o in outs], n
    finally:
        st.close()
        monkeypatch.setattr(fusion, "_enabled", True)


def _ulp(dtype) -> float:
    return float(np.finfo(np.float32 if dtype == _dt("bfloat16") else dtype).eps) if dtype != _dt("bfloat16") \
        else 2.0 ** -7


def _close_as_unfused(device, got, unfused, ref, dtype):
    """Equal to the unfused bits on the CPU; on the GPU no further from ``ref`` than twice the unfused
    error plus two ulps of the values' magnitude."""
    if device == lf.cpu:
        np.testing.assert_array_equal(got, unfused)
        return
    g, u, r = (np.asarray(a, np.float64) for a in (got, unfused, ref))
    scale = np.abs(r).max(axis=-1, keepdims=True) if r.ndim else abs(r)  # the row's magnitude
    bound = 2 * np.abs(u - r) + 2 * _ulp(dtype) * scale + 1e-30
    bad = np.abs(g - r) > bound
    assert not bad.any(), f"{bad.sum()} of {bad.size} off: max {np.abs(g - r).max()} vs unfused {np.abs(u - r).max()}"


def layer_norm(xp, x, w, b, eps=1e-5):
    xc = x - x.mean(axis=-1, keepdims=True)
    var = (xc * xc).mean(axis=-1, keepdims=True)
    return xc / xp.sqrt(var + eps) * w + b


def _ln_ref(x, w, b, eps=1e-5):
    x, w, b = (np.asarray(a, np.float64) for a in (x, w, b))
    xc = x - x.mean(-1, keepdims=True)
    return xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + eps) * w + b


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(16, 768), (2, 3, 100), (5, 1), (1, 4096), (7, 33)])
def test_a_hand_written_layer_norm_is_one_command(fused, rng, monkeypatch, dtype, shape):
    dtype = _dt(dtype)
    x = random_array(rng, shape, dtype) * 3 + 1
    w, b = random_array(rng, shape[-1:], dtype), random_array(rng, shape[-1:], dtype)
    f = lambda a, c, d: layer_norm(lf, a, c, d)  # noqa: E731
    (got,), n = _run(fused, f, [x, w, b], True, monkeypatch)
    (want,), m = _run(fused, f, [x, w, b], False, monkeypatch)
    assert n == 1 and m == 9
    assert got.dtype == want.dtype == dtype
    _close_as_unfused(fused, got, want, _ln_ref(x, w, b), dtype)


def _softmax_ref(s):
    s = np.asarray(s, np.float64)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_with_scale_and_additive_mask_is_one_command(fused, rng, monkeypatch, dtype):
    dtype = _dt(dtype)
    t = 16
    s = random_array(rng, (2, 3, t, t), dtype)
    mask = np.triu(np.full((t, t), -1e4, dtype), 1).astype(dtype)
    f = lambda a, m: lf.softmax(a * 0.125 + m, axis=-1)  # noqa: E731
    (got,), n = _run(fused, f, [s, mask], True, monkeypatch)
    (want,), m = _run(fused, f, [s, mask], False, monkeypatch)
    assert n == 1 and m == 3
    ref = _softmax_ref(np.asarray(s, np.float64) * 0.125 + np.asarray(mask, np.float64))
    _close_as_unfused(fused, got, want, ref, dtype)


@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"])
def test_hand_written_softmax_with_a_bool_mask_is_one_command(fused, rng, monkeypatch, dtype):
    dtype = _dt(dtype)
    s = random_array(rng, (4, 9, 40), dtype)
    keep = rng.random((9, 40)) < 0.7
    keep[:, 0] = True

    def f(a, k):
        z = lf.where(k, a * 0.5, -1e9)
        e = lf.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    (got,), n = _run(fused, f, [s, keep], True, monkeypatch)
    (want,), m = _run(fused, f, [s, keep], False, monkeypatch)
    assert n == 1 and m == 7
    ref = _softmax_ref(np.where(keep, np.asarray(s, np.float64) * 0.5, -1e9))
    _close_as_unfused(fused, got, want, ref, dtype)


def test_a_per_row_root_and_integer_sums(fused, rng, monkeypatch):
    x = rng.integers(-100, 100, (6, 50)).astype(np.int32)
    f = lambda a: (a * 3 - 1).sum(axis=-1, keepdims=True) * 2  # noqa: E731
    (got,), n = _run(fused, f, [x], True, monkeypatch)
    assert n == 1
    np.testing.assert_array_equal(got, ((x * 3 - 1).sum(-1, keepdims=True, dtype=np.int64)) * 2)
    y = random_array(rng, (6, 50), np.float32)
    g = lambda a: 1.0 / lf.sqrt((a * a).mean(axis=-1, keepdims=True) + 1e-6)  # noqa: E731 (rms)
    (got,), n = _run(fused, g, [y], True, monkeypatch)
    (want,), _ = _run(fused, g, [y], False, monkeypatch)
    assert n == 1 and got.shape == (6, 1)
    ref = 1 / np.sqrt((y.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6)
    _close_as_unfused(fused, got, want, ref, np.dtype(np.float32))


def test_max_min_prod_and_nan(fused, rng, monkeypatch):
    x = random_array(rng, (5, 30), np.float32)
    x[2, 7] = np.nan
    f = lambda a: (a - a.max(axis=-1, keepdims=True)) * (a.min(axis=-1, keepdims=True)  # noqa: E731
                                                         + (a * 0.1 + 1).prod(axis=-1, keepdims=True))
    (got,), n = _run(fused, f, [x], True, monkeypatch)
    (want,), _ = _run(fused, f, [x], False, monkeypatch)
    assert n == 1
    assert np.isnan(got[2]).all() and not np.isnan(np.delete(got, 2, axis=0)).any()
    ref = (x - x.max(-1, keepdims=True)) * (x.min(-1, keepdims=True) + (x * np.float32(0.1) + 1).prod(-1, keepdims=True))
    _close_as_unfused(fused, got, want, ref, np.dtype(np.float32))


def test_values_seen_outside_stay_out_of_the_group(fused, rng, monkeypatch):
    x = random_array(rng, (8, 64), np.float32)

    def f(a):
        mu = a.mean(axis=-1, keepdims=True)
        return a - mu, mu  # the mean is an output too: computed once, read by the row program
    (got, mu), n = _run(fused, f, [x], True, monkeypatch)
    (want, wmu), _ = _run(fused, f, [x], False, monkeypatch)
    assert n == 2
    np.testing.assert_array_equal(mu, wmu)
    np.testing.assert_array_equal(got, want)  # (no reduction inside: the same kernels' bits)


def test_what_does_not_fuse(fused, rng, monkeypatch):
    x = random_array(rng, (6, 10, 12), np.float32)
    # not the last axis; no keepdims; var (two-pass, a single op): each leaves the elementwise work apart
    for f, cmds in ((lambda a: a * 2 - (a * 2).sum(axis=1, keepdims=True), 3),
                    (lambda a: (a * 2).sum(axis=-1) + 1, 3),
                    (lambda a: (a - a.var(axis=-1, keepdims=True)) * 3, 2)):
        (got,), n = _run(fused, f, [x], True, monkeypatch)
        (want,), _ = _run(fused, f, [x], False, monkeypatch)
        assert n == cmds
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_fusion_off_and_compiled(fused, rng, monkeypatch):
    x = random_array(rng, (16, 96), np.float32)
    w, b = random_array(rng, (96,), np.float32), random_array(rng, (96,), np.float32)
    f = lambda a, c, d: layer_norm(lf, a, c, d)  # noqa: E731
    (eager,), _ = _run(fused, f, [x, w, b], True, monkeypatch)
    (comp,), _ = _run(fused, f, [x, w, b], True, monkeypatch, compiled=True)
    np.testing.assert_array_equal(comp, eager)  # compiled and eager run the same kernels
    monkeypatch.setenv("LANEFLOW_FUSE", "0")
    (off,), m = _run(fused, f, [x, w, b], False, monkeypatch)
    assert m == 9
    _close_as_unfused(fused, eager, off, _ln_ref(x, w, b), np.dtype(np.float32))


def test_plan_cache_hits_take_new_values_and_scalars(fused, rng, monkeypatch):
    st = lf.new_stream(fused, lanes=1)
    try:
        with lf.stream(st):
            for k in range(4):
                x = random_array(rng, (4, 32), np.float32)
                eps = 10.0 ** -(k + 1)  # a Python scalar: the plan cache binds its new value
                a = lf.array(x)
                got = np.asarray((a - a.mean(axis=-1, keepdims=True)) / lf.sqrt(
                    ((a - a.mean(axis=-1, keepdims=True)) ** 2).mean(axis=-1, keepdims=True) + eps))
                xc = x.astype(np.float64) - x.mean(-1, keepdims=True)
                ref = xc / np.sqrt((xc ** 2).mean(-1, keepdims=True) + eps)
                np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5)
    finally:
        st.close()


def test_gpt2_plain_layers_fuse(fused, rng, monkeypatch):
    """The plain-op GPT-2 forward: every layer norm and every attention softmax is one command."""
    from laneflow.models import gpt2

    cfg = gpt2.GPT2Config.tiny()
    params = gpt2.numpy_params(cfg, seed=1)
    ids = rng.integers(0, cfg.vocab_size, (2, 8))
    ref = gpt2.reference_forward(params, ids, cfg)

    def run(fuse):
        monkeypatch.setattr(fusion, "_enabled", fuse)
        st = lf.new_stream(fused, lanes=1)
        try:
            with lf.stream(st):
                p = gpt2.to_laneflow(params, dtype=lf.float32)
                i = lf.array(ids.astype(np.int32))
                lf.eval(i, *p.values())
                lf.reset_stats()
                out = gpt2.forward(p, i, cfg, gpt2.plain_ops(lf))
                lf.eval(out)
                return np.asarray(out), lf.stats()["commands"]
        finally:
            st.close()
            monkeypatch.setattr(fusion, "_enabled", True)
    got, n = run(True)
    want, m = run(False)
    norms = 2 * cfg.n_layer + 1
    assert m - n >= norms * 8 + cfg.n_layer * 2  # each norm 9 -> 1, each softmax and its scale/mask 3 -> 1
    tol = 1e-4 * float(np.abs(ref).max())
    assert np.abs(got - ref).max() <= tol and math.isfinite(float(got.max()))
