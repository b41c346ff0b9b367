"""lf.nn against numpy references written here (float64, per head), on every backend, eager and compiled,
for float32, float16 and bfloat16; and the errors it raises."""

from __future__ import annotations

import math

import numpy as np
import pytest

import laneflow as lf
from conftest import random_array

BF16 = lf.bfloat16
#: (rtol, atol) of a result against the float64 reference, per dtype (one rounding of the output
#: dtype, plus float32 accumulation)
TOL = {np.dtype(np.float32): (2e-5, 2e-5), np.dtype(np.float16): (4e-3, 4e-3), np.dtype(BF16): (2e-2, 2e-2)}
DTYPES = [np.float32, np.float16, BF16]


def _close(got, ref, dtype):
    rtol, atol = TOL[np.dtype(dtype)]
    np.testing.assert_allclose(np.asarray(got).astype(np.float64), ref, rtol=rtol, atol=atol)


def _arr(rng, shape, dtype, scale=1.0):
    """Random data rounded to ``dtype`` once, as (host array in dtype, its float64 value)."""
    x = (random_array(rng, shape, np.float32) * scale).astype(dtype)
    return x, x.astype(np.float64)


# -- norms ----------------------------------------------------------------------------------------

def _layer_norm_ref(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


def _rms_norm_ref(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * (1 if w is None else w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 37, 768, 1500, 9000])  # one warp per row, a block, a block re-reading
def test_layer_norm_matches_numpy(device, rng, dtype, n):
    x, xr = _arr(rng, (3, 5, n), dtype, 3.0)
    x += np.asarray(1.5, dtype)  # an offset: a one-pass variance would lose digits here
    xr = x.astype(np.float64)
    w, wr = _arr(rng, (n,), dtype)
    b, br = _arr(rng, (n,), dtype)
    with lf.stream(lf.new_stream(device)):
        y = lf.nn.layer_norm(lf.array(x), lf.array(w), lf.array(b), eps=1e-5)
        assert y.dtype == np.dtype(dtype) and y.shape == x.shape
        _close(y, _layer_norm_ref(xr, wr, br, 1e-5), dtype)
        _close(lf.nn.layer_norm(lf.array(x)), _layer_norm_ref(xr, None, None, 1e-5), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [5, 768, 4096])
def test_rms_norm_matches_numpy(device, rng, dtype, n):
    x, xr = _arr(rng, (4, n), dtype, 2.0)
    w, wr = _arr(rng, (n,), dtype)
    with lf.stream(lf.new_stream(device)):
        _close(lf.nn.rms_norm(lf.array(x), lf.array(w), eps=1e-6), _rms_norm_ref(xr, wr, 1e-6), dtype)
        _close(lf.nn.rms_norm(lf.array(x), eps=0.5), _rms_norm_ref(xr, None, 0.5), dtype)


def test_norms_take_weights_of_another_float_dtype_and_keep_x_dtype(device, rng):
    x, xr = _arr(rng, (2, 64), BF16)
    w = random_array(rng, (64,), np.float32)
    with lf.stream(lf.new_stream(device)):
        y = lf.nn.layer_norm(lf.array(x), lf.array(w))
        assert y.dtype == np.dtype(BF16)
        _close(y, _layer_norm_ref(xr, w.astype(np.float64), None, 1e-5), BF16)


def test_norms_inside_compile_equal_eager(device, rng):
    x, _ = _arr(rng, (6, 96), np.float32)
    w, _ = _arr(rng, (96,), np.float32)
    b, _ = _arr(rng, (96,), np.float32)
    with lf.stream(lf.new_stream(device)):
        args = [lf.array(a) for a in (x, w, b)]
        f = lf.compile(lambda x, w, b: lf.nn.rms_norm(lf.nn.layer_norm(x, w, b) * 2.0, w))
        eager = np.asarray(lf.nn.rms_norm(lf.nn.layer_norm(*args) * 2.0, args[1]))
        for _ in range(3):
            np.testing.assert_array_equal(np.asarray(f(*args)), eager)


# -- activations ----------------------------------------------------------------------------------

def _gelu_ref(x, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_numpy(device, rng, dtype, approximate):
    x, xr = _arr(rng, (7, 33), dtype, 3.0)
    with lf.stream(lf.new_stream(device)):
        y = lf.nn.gelu(lf.array(x), approximate=approximate)
        assert y.dtype == np.dtype(dtype)
        _close(y, _gelu_ref(xr, approximate), dtype)
        # as a step of a fused elementwise chain too
        _close(lf.nn.gelu(lf.array(x) * 2.0, approximate=approximate) + 1.0, _gelu_ref(2 * xr, approximate) + 1,
               dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_softmax_match_numpy(device, rng, dtype):
    x, xr = _arr(rng, (5, 40), dtype, 4.0)
    with lf.stream(lf.new_stream(device)):
        _close(lf.nn.silu(lf.array(x)), xr / (1 + np.exp(-xr)), dtype)
        e = np.exp(xr - xr.max(-1, keepdims=True))
        _close(lf.nn.softmax(lf.array(x)), e / e.sum(-1, keepdims=True), dtype)


# -- attention ------------------------------------------------------------------------------------

def _sdpa_ref(q, k, v, mask=None, causal=False, scale=None):
    """Per batch and head in float64: scores, bottom-right causal mask, softmax, zeros where no key."""
    B, Hq, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(D) if scale is None else scale
    out = np.zeros((B, Hq, Tq, v.shape[3]))
    full = None if mask is None else np.broadcast_to(mask, (B, Hq, Tq, Tk))
    for b in range(B):
        for h in range(Hq):
            kh = h // (Hq // Hkv)
            s = np.einsum("qd,kd->qk", q[b, h], k[b, kh]) * scale
            ok = np.ones((Tq, Tk), bool)
            if causal:
                ok &= np.arange(Tk)[None, :] <= np.arange(Tq)[:, None] + (Tk - Tq)
            if full is not None:
                if full.dtype == np.bool_:
                    ok &= full[b, h]
                else:
                    s = s + full[b, h]
            for i in range(Tq):
                if not ok[i].any():
                    continue
                si = np.where(ok[i], s[i], -np.inf)
                p = np.exp(si - si.max())
                out[b, h, i] = (p / p.sum()) @ v[b, kh]
    return out


CASES = {
    "plain": dict(q=(2, 3, 5, 16), kv=(2, 3, 5, 16)),
    "causal square": dict(q=(2, 3, 7, 16), kv=(2, 3, 7, 16), causal=True),
    "causal bottom-right, Tq < Tk": dict(q=(1, 2, 3, 8), kv=(1, 2, 9, 8), causal=True),
    "decode step, Tq = 1": dict(q=(2, 4, 1, 64), kv=(2, 4, 70, 64), causal=True),
    "grouped-query, 8 over 2 heads": dict(q=(1, 8, 6, 32), kv=(1, 2, 6, 32), causal=True),
    "long keys, several chunks": dict(q=(1, 2, 40, 40), kv=(1, 2, 100, 40)),
    "value width differs": dict(q=(2, 2, 4, 24), kv=(2, 2, 6, 24), dv=40),
    "head_dim 128": dict(q=(1, 2, 3, 128), kv=(1, 2, 33, 128), causal=True),
    "decode, 256 keys, grouped": dict(q=(1, 4, 1, 64), kv=(1, 2, 256, 64), causal=True),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CASES))
def test_attention_matches_numpy(device, rng, dtype, case):
    c = CASES[case]
    q, qr = _arr(rng, c["q"], dtype)
    k, kr = _arr(rng, c["kv"], dtype)
    vshape = c["kv"][:3] + (c.get("dv", c["kv"][3]),)
    v, vr = _arr(rng, vshape, dtype)
    causal = c.get("causal", False)
    with lf.stream(lf.new_stream(device)):
        o = lf.nn.scaled_dot_product_attention(lf.array(q), lf.array(k), lf.array(v), is_causal=causal)
        assert o.shape == c["q"][:3] + vshape[3:] and o.dtype == np.dtype(dtype)
        _close(o, _sdpa_ref(qr, kr, vr, causal=causal), dtype)


@pytest.mark.parametrize("kind", ["bool (T, T)", "bool (B, 1, 1, T) padding", "additive (B, H, T, T)",
                                  "additive float32 on bfloat16", "bool with causal", "a row sees no key"])
def test_attention_masks(device, rng, kind):
    B, H, T, D = 2, 3, 6, 16
    dtype = BF16 if "bfloat16" in kind else np.float32
    q, qr = _arr(rng, (B, H, T, D), dtype)
    k, kr = _arr(rng, (B, H, T, D), dtype)
    v, vr = _arr(rng, (B, H, T, D), dtype)
    causal = "causal" in kind
    if kind.startswith("bool (T, T)") or kind == "bool with causal":
        m = rng.random((T, T)) < 0.7
        m[:, 0] = True
    elif kind.startswith("bool (B"):
        m = np.ones((B, 1, 1, T), bool)
        m[0, ..., 4:] = False
    elif kind == "a row sees no key":
        m = rng.random((T, T)) < 0.6
        m[2] = False
    else:
        m = random_array(rng, (B, H, T, T) if "(B, H" in kind else (T, T), np.float32)
    mr = m if m.dtype == np.bool_ else m.astype(np.float64)
    with lf.stream(lf.new_stream(device)):
        o = lf.nn.scaled_dot_product_attention(lf.array(q), lf.array(k), lf.array(v), mask=lf.array(m),
                                               is_causal=causal, scale=0.3)
        ref = _sdpa_ref(qr, kr, vr, mask=mr, causal=causal, scale=0.3)
        _close(o, ref, dtype)
        if kind == "a row sees no key":
            assert not np.asarray(o)[:, :, 2].any()  # zeros, not NaN


def test_a_decode_step_masked_to_a_prefix_and_a_head_that_sees_nothing(device, rng):
    """Few query rows split their keys over warps (the GPU's split mode): a mask keeping a prefix of 256
    cached positions, one row seeing no key at all (zeros), warps whose keys are all masked."""
    B, H, S, D = 2, 3, 256, 64
    q, qr = _arr(rng, (B, H, 1, D), np.float32)
    k, kr = _arr(rng, (B, H, S, D), np.float32)
    v, vr = _arr(rng, (B, H, S, D), np.float32)
    m = np.zeros((B, H, 1, S), bool)
    m[0, :, :, :129] = True
    m[1, 0, :, 200:] = True
    m[1, 2, :, 37] = True  # (head 1 of batch 1 sees nothing)
    with lf.stream(lf.new_stream(device)):
        o = lf.nn.scaled_dot_product_attention(lf.array(q), lf.array(k), lf.array(v), mask=lf.array(m), scale=0.125)
        _close(o, _sdpa_ref(qr, kr, vr, mask=m, scale=0.125), np.float32)
        assert not np.asarray(o)[1, 1].any()


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_attention_reads_the_heads_of_a_fused_qkv_projection(device, rng, dtype):
    """q, k, v as strided views of one (B, T, 3 d) array, as a GPT-2 block makes them, and in compile."""
    B, T, H, dh = 2, 8, 4, 16
    d = H * dh
    x, xr = _arr(rng, (B, T, 3 * d), dtype)

    def heads(a):
        return a.reshape(B, T, H, dh).transpose(0, 2, 1, 3)

    def attn(x):
        q, k, v = heads(x[..., :d]), heads(x[..., d:2 * d]), heads(x[..., 2 * d:])
        return lf.nn.scaled_dot_product_attention(q, k, v, is_causal=True)

    ref = _sdpa_ref(*(xr[..., s * d:(s + 1) * d].reshape(B, T, H, dh).transpose(0, 2, 1, 3) for s in range(3)),
                    causal=True)
    with lf.stream(lf.new_stream(device)):
        xa = lf.array(x)
        eager = np.asarray(attn(xa))
        _close(eager, ref, dtype)
        f = lf.compile(attn)
        for _ in range(2):
            np.testing.assert_array_equal(np.asarray(f(xa)), eager)


def test_attention_with_empty_sizes(device, rng):
    with lf.stream(lf.new_stream(device)):
        q = lf.array(random_array(rng, (1, 2, 0, 8), np.float32))
        k = lf.array(random_array(rng, (1, 2, 4, 8), np.float32))
        assert lf.nn.scaled_dot_product_attention(q, k, k).shape == (1, 2, 0, 8)
        q = lf.array(random_array(rng, (1, 2, 3, 8), np.float32))
        k0 = lf.array(np.zeros((1, 2, 0, 8), np.float32))
        assert not np.asarray(lf.nn.scaled_dot_product_attention(q, k0, k0)).any()  # no key: zeros


# -- errors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("call, exc, words", [
    (lambda: lf.nn.layer_norm(lf.array(np.ones((2, 3), np.int32))), TypeError, "layer_norm: expects a floating"),
    (lambda: lf.nn.layer_norm(lf.ones((2, 3)), lf.ones((4,))), ValueError, "weight must have shape (3,)"),
    (lambda: lf.nn.layer_norm(lf.ones((2, 3)), None, lf.ones((3, 1))), ValueError, "bias must have shape (3,)"),
    (lambda: lf.nn.layer_norm(lf.ones((2, 3)), eps=-1.0), ValueError, "eps must be finite and >= 0"),
    (lambda: lf.nn.rms_norm(lf.ones((2, 3)), eps="x"), TypeError, "rms_norm: eps must be a real number"),
    (lambda: lf.nn.layer_norm(lf.ones(())), ValueError, "at least 1 dimension"),
    (lambda: lf.nn.gelu(lf.ones(3), approximate="erf"), ValueError, "approximate must be 'none' or 'tanh'"),
    (lambda: lf.nn.scaled_dot_product_attention(lf.ones((2, 3, 4)), lf.ones((2, 3, 4)), lf.ones((2, 3, 4))),
     ValueError, "q must be 4-D"),
    (lambda: lf.nn.scaled_dot_product_attention(lf.ones((1, 3, 4, 8)), lf.ones((1, 2, 4, 8)), lf.ones((1, 2, 4, 8))),
     ValueError, "multiple of k and v's 2"),
    (lambda: lf.nn.scaled_dot_product_attention(lf.ones((1, 2, 4, 8)), lf.ones((1, 2, 4, 4)), lf.ones((1, 2, 4, 4))),
     ValueError, "same head_dim"),
    (lambda: lf.nn.scaled_dot_product_attention(lf.ones((1, 2, 4, 8)), lf.ones((1, 2, 5, 8)), lf.ones((1, 2, 4, 8))),
     ValueError, "k and v must agree"),
    (lambda: lf.nn.scaled_dot_product_attention(lf.ones((1, 2, 4, 8)), lf.ones((1, 2, 4, 8)),
                                                lf.ones((1, 2, 4, 8), dtype=lf.float16)), TypeError, "share one dtype"),
    (lambda: lf.nn.scaled_dot_product_attention(*[lf.ones((1, 2, 4, 8), dtype=lf.int32)] * 3), TypeError,
     "floating-point q, k and v"),
    (lambda: lf.nn.scaled_dot_product_attention(*[lf.ones((1, 2, 4, 8))] * 3, mask=lf.ones((4, 5), dtype=lf.bool_)),
     ValueError, "does not broadcast to (B, Hq, Tq, Tk) = (1, 2, 4, 4)"),
    (lambda: lf.nn.scaled_dot_product_attention(*[lf.ones((1, 2, 4, 8))] * 3, mask=lf.ones((4, 4), dtype=lf.int32)),
     TypeError, "mask must be bool"),
    (lambda: lf.nn.scaled_dot_product_attention(*[lf.ones((1, 2, 4, 8))] * 3, is_causal=1), TypeError,
     "is_causal must be a bool"),
    (lambda: lf.nn.scaled_dot_product_attention(*[lf.ones((1, 2, 4, 8))] * 3, scale="1"), TypeError,
     "scale must be a real number"),
])
def test_bad_arguments_raise_errors_naming_the_op(call, exc, words):
    with pytest.raises(exc) as e:
        call()
    assert words in str(e.value)
