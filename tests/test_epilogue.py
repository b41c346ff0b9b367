"""Matmul epilogues (graph/epilogue.py): a bias add, a residual add and a tanh GELU after a product run
in the product's kernel; results against numpy, command counts, and the cases that must not fuse."""

from __future__ import annotations

import math

import numpy as np
import pytest

import laneflow as lf
from laneflow.graph import fusion
from laneflow.runtime.backend import backend_for
from conftest import random_array
from test_fusion import _run as fusion_run

BF16 = lf.bfloat16
TOL = {np.dtype(np.float32): 2e-5, np.dtype(np.float16): 4e-3, np.dtype(BF16): 3e-2}


def _gelu(z):
    return 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))


def _run(device, build, arrays):
    """(host results as float64, commands) of ``build(*arrays)`` evaluated at once (test_fusion's helper)."""
    res, n = fusion_run(device, build, arrays)
    return [r.astype(np.float64) for r in res], n


def _data(rng, dtype, *shapes):
    out = [random_array(rng, s, np.float32).astype(dtype) for s in shapes]
    return out, [a.astype(np.float64) for a in out]


def _fuses(device, dtype) -> bool:
    return fusion._enabled and np.dtype(dtype) in backend_for(device).matmul_epilogues


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
@pytest.mark.parametrize("shape", [((5, 24), (24, 16)), ((2, 7, 24), (24, 16)), ((3, 5, 24), (3, 24, 16))])
def test_bias_residual_and_gelu_epilogues_match_numpy(device, rng, dtype, shape):
    # three widths, so no two products are alike (a GPU would group those: graph/grouping.py)
    sa, sw = shape
    (a, w, b, h), (ar, wr, br, hr) = _data(rng, dtype, sa, sw, (16,), sa[:-1] + (16,))
    (w2, b2, w3, b3), (wr2, br2, wr3, br3) = _data(rng, dtype, sw[:-1] + (12,), (12,), sw[:-1] + (8,), (8,))
    tol = TOL[np.dtype(dtype)] * 24
    ys, n = _run(device, lambda a, w, b, h, w2, b2, w3, b3: [h + (a @ w + b), lf.nn.gelu(a @ w2 + b2, approximate="tanh"),
                                                            (a @ w3 + b3)], (a, w, b, h, w2, b2, w3, b3))
    for y, ref in zip(ys, [hr + (ar @ wr + br), _gelu(ar @ wr2 + br2), ar @ wr3 + br3]):
        np.testing.assert_allclose(y, ref, rtol=tol, atol=tol)
    if _fuses(device, dtype):
        assert n == 3  # three products, each with its epilogue in its kernel


def test_a_product_read_twice_keeps_its_own_kernel(device, rng):
    (a, w, b), (ar, wr, br) = _data(rng, np.float32, (6, 8), (8, 5), (5,))
    ys, n = _run(device, lambda a, w, b: (lambda m: [m + b, m * 2.0])(a @ w), (a, w, b))
    np.testing.assert_allclose(ys[0], ar @ wr + br, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ys[1], 2 * (ar @ wr), rtol=1e-5, atol=1e-5)
    assert n == 3  # the product, and each elementwise reader


def test_adds_that_are_not_epilogues_stay_elementwise(device, rng):
    """A (1, N) row, a column bias (M, 1) and a product with a 1-D right operand are not cuBLASLt
    biases; each is computed as written."""
    (a, w, r, c, v), (ar, wr, rr, cr, vr) = _data(rng, np.float32, (6, 8), (8, 5), (1, 5), (6, 1), (8,))
    ys, _ = _run(device, lambda a, w, r, c, v: [a @ w + r, a @ w + c, a @ v + v[:6]], (a, w, r, c, v))
    for y, ref in zip(ys, [ar @ wr + rr, ar @ wr + cr, ar @ vr + vr[:6]]):
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_fusion_off_runs_the_adds_separately_with_the_same_results(device, rng, monkeypatch):
    (a, w, b, h), _ = _data(rng, np.float32, (6, 8), (8, 5), (5,), (6, 5))

    def prog(a, w, b, h):
        return h + (a @ w + b)
    on, n_on = _run(device, prog, (a, w, b, h))
    monkeypatch.setattr(fusion, "_enabled", False)
    off, n_off = _run(device, prog, (a, w, b, h))
    np.testing.assert_allclose(on[0], off[0], rtol=1e-5, atol=1e-5)
    assert n_off == 3 and n_on <= n_off


def test_compiled_epilogues_equal_eager(device, rng):
    (a, w, b, h), _ = _data(rng, BF16, (2, 4, 32), (32, 64), (64,), (2, 4, 64))

    def prog(a, w, b, h):
        return [h + (a @ w + b), lf.nn.gelu(a @ w + b, approximate="tanh")]
    with lf.stream(lf.new_stream(device)):
        xs = [lf.array(x) for x in (a, w, b, h)]
        eager = [np.asarray(y) for y in prog(*xs)]
        f = lf.compile(prog)
        for _ in range(3):
            for got, want in zip(f(*xs), eager):
                np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_products_with_long_unaligned_rows_match_numpy(device, rng, dtype):
    """Rows of 1,031 elements (not a multiple of 16 bytes): the GPU writes them through padded rows
    (cuda/matmul.py), with and without a bias epilogue, from a transposed weight as GPT-2's head."""
    (a, w, b), (ar, wr, br) = _data(rng, dtype, (2, 5, 64), (1031, 64), (1031,))
    wt = np.ascontiguousarray(w.T)
    ys, _ = _run(device, lambda a, w, b, wt: [a @ w.T, a @ w.T + b, a @ wt, a[0] @ wt + b], (a, w, b, wt))
    tol = TOL[np.dtype(dtype)] * 16
    for y, ref in zip(ys, [ar @ wr.T, ar @ wr.T + br, ar @ wr.T, ar[0] @ wr.T + br]):
        np.testing.assert_allclose(y, ref, rtol=tol, atol=tol)
