"""lf.nn.scaled_dot_product_attention through cuDNN's fused SDPA (``LANEFLOW_ATTENTION=cudnn``) against the
float64 numpy reference, eager and inside lf.compile, and the fallbacks to the NVRTC kernel, on every
backend (the CPU ignores the mode: the same values are expected). On the GPU the tests also check which
implementation ran (``lf.cuda.attention_stats()``), so a silent fallback fails them; without the cuDNN
frontend and library the cases that need cuDNN skip with the reason."""

from __future__ import annotations

import numpy as np
import pytest
from test_nn import BF16, _arr, _sdpa_ref

import laneflow as lf

#: (rtol, atol) against float64: cuDNN rounds the softmax weights to the io dtype before P @ V, and the
#: output once (the NVRTC kernel keeps the weights in float32, hence test_nn's tighter figures).
TOL = {np.dtype(np.float16): (6e-3, 6e-3), np.dtype(BF16): (3e-2, 3e-2), np.dtype(np.float32): (2e-5, 2e-5)}

CASES = {
    "plain": dict(q=(2, 3, 40, 64), kv=(2, 3, 40, 64)),
    "causal square": dict(q=(2, 4, 33, 64), kv=(2, 4, 33, 64), causal=True),
    "causal bottom-right, Tq < Tk": dict(q=(1, 2, 24, 64), kv=(1, 2, 80, 64), causal=True),
    "decode step, Tq = 1": dict(q=(3, 4, 1, 64), kv=(3, 4, 256, 64), causal=True),
    "grouped-query, 8 over 2 heads": dict(q=(1, 8, 48, 64), kv=(1, 2, 48, 64), causal=True),
    "head_dim 128": dict(q=(1, 2, 20, 128), kv=(1, 2, 36, 128)),
}


def _close(got, ref, dtype):
    rtol, atol = TOL[np.dtype(dtype)]
    np.testing.assert_allclose(np.asarray(got).astype(np.float64), ref, rtol=rtol, atol=atol)


def _need_cudnn(device):
    """On the GPU, the cuDNN module, or a skip naming why cuDNN is unavailable; None on the CPU."""
    if device.type != "gpu":
        return None
    from laneflow.backends.cuda import cudnn_attention as C

    why = C.unavailable_reason()
    if why is not None:
        pytest.skip(why)
    return C


def _inputs(rng, c, dtype):
    q, qr = _arr(rng, c["q"], dtype)
    k, kr = _arr(rng, c["kv"], dtype)
    vshape = c["kv"][:3] + (c.get("dv", c["kv"][3]),)
    v, vr = _arr(rng, vshape, dtype)
    return (q, k, v), _sdpa_ref(qr, kr, vr, causal=c.get("causal", False))


def _ran(device, before=None):
    """attention_stats on the GPU (None on the CPU): ``before`` given, the counts since then."""
    if device.type != "gpu":
        return None
    st = lf.cuda.attention_stats()
    if before is not None:
        st = dict(st, cudnn=st["cudnn"] - before["cudnn"], nvrtc=st["nvrtc"] - before["nvrtc"])
    return st


@pytest.mark.parametrize("dtype", [np.float16, BF16])
@pytest.mark.parametrize("case", list(CASES))
def test_cudnn_attention_matches_numpy_eager_and_compiled(device, rng, monkeypatch, dtype, case):
    _need_cudnn(device)
    monkeypatch.setenv("LANEFLOW_ATTENTION", "cudnn")
    c = CASES[case]
    (q, k, v), ref = _inputs(rng, c, dtype)
    causal = c.get("causal", False)

    def attn(q, k, v):
        return lf.nn.scaled_dot_product_attention(q, k, v, is_causal=causal)

    with lf.stream(lf.new_stream(device)):
        qa, ka, va = lf.array(q), lf.array(k), lf.array(v)
        before = _ran(device)
        eager = np.asarray(attn(qa, ka, va))
        ran = _ran(device, before)
        if ran is not None:
            assert ran["cudnn"] == 1 and ran["nvrtc"] == 0, ran
        _close(eager, ref, dtype)
        f = lf.compile(attn)
        for _ in range(3):  # commands, then a capture, then a replay
            np.testing.assert_array_equal(np.asarray(f(qa, ka, va)), eager)
        if device.type == "gpu":  # cuDNN's execute was captured into the graph
            (st,) = f.stats()
            assert st["mode"] == "cuda graph", st


def test_cudnn_reads_the_heads_of_a_fused_qkv_projection(device, rng, monkeypatch):
    _need_cudnn(device)
    monkeypatch.setenv("LANEFLOW_ATTENTION", "cudnn")
    B, T, H, dh = 2, 24, 4, 64
    d = H * dh
    x, xr = _arr(rng, (B, T, 3 * d), BF16)

    def heads(a):
        return a.reshape(B, T, H, dh).transpose(0, 2, 1, 3)

    ref = _sdpa_ref(*(heads(xr[..., s * d:(s + 1) * d]) for s in range(3)), causal=True)
    with lf.stream(lf.new_stream(device)):
        xa = lf.array(x)
        before = _ran(device)
        o = lf.nn.scaled_dot_product_attention(heads(xa[..., :d]), heads(xa[..., d:2 * d]), heads(xa[..., 2 * d:]),
                                               is_causal=True)
        _close(o, ref, BF16)
        ran = _ran(device, before)
        if ran is not None:
            assert ran["cudnn"] == 1, ran


def test_auto_picks_cudnn_for_a_long_prefill_and_nvrtc_for_a_short_one(device, rng, monkeypatch):
    C = _need_cudnn(device)
    from laneflow.backends.cuda.attention_choice import AUTO_CUDNN_MIN_SCORES

    monkeypatch.setenv("LANEFLOW_ATTENTION", "auto")
    T = int(np.ceil(np.sqrt(AUTO_CUDNN_MIN_SCORES)))
    with lf.stream(lf.new_stream(device)):
        for t, want in ((T, "cudnn"), (16, "nvrtc")):
            (q, k, v), ref = _inputs(rng, dict(q=(1, 2, t, 64), kv=(1, 2, t, 64), causal=True), BF16)
            before = _ran(device)
            o = lf.nn.scaled_dot_product_attention(lf.array(q), lf.array(k), lf.array(v), is_causal=True)
            _close(o, ref, BF16)
            ran = _ran(device, before)
            if C is not None:
                assert ran[want] == 1 and ran["cudnn" if want == "nvrtc" else "nvrtc"] == 0, (t, ran)


@pytest.mark.parametrize("what", ["float32", "bool mask", "causal, Tq > Tk"])
def test_calls_cudnn_cannot_take_fall_back_to_nvrtc_with_the_reason(device, rng, monkeypatch, what):
    monkeypatch.setenv("LANEFLOW_ATTENTION", "cudnn")
    dtype = np.float32 if what == "float32" else BF16
    tq = 40 if "Tq > Tk" in what else 16
    (q, k, v), _ = _inputs(rng, dict(q=(1, 2, tq, 64), kv=(1, 2, 16, 64)), dtype)
    mask = np.tril(np.ones((tq, 16), bool)) if what == "bool mask" else None
    causal = what != "float32"
    ref = _sdpa_ref(*(a.astype(np.float64) for a in (q, k, v)), mask=mask, causal=causal)
    with lf.stream(lf.new_stream(device)):
        before = _ran(device)
        o = lf.nn.scaled_dot_product_attention(lf.array(q), lf.array(k), lf.array(v), is_causal=causal,
                                               mask=None if mask is None else lf.array(mask))
        _close(o, ref, dtype)
        ran = _ran(device, before)
    if ran is not None:
        assert ran["nvrtc"] == 1 and ran["cudnn"] == 0, ran
        words = {"float32": "float16 or bfloat16", "bool mask": "bool mask", "causal, Tq > Tk": "Tq > Tk"}[what]
        assert any(words in r for r in ran["fallbacks"]), ran


def test_nvrtc_mode_never_runs_cudnn(device, rng, monkeypatch):
    monkeypatch.setenv("LANEFLOW_ATTENTION", "nvrtc")
    (q, k, v), ref = _inputs(rng, dict(q=(1, 2, 512, 64), kv=(1, 2, 512, 64), causal=True), BF16)
    with lf.stream(lf.new_stream(device)):
        before = _ran(device)
        _close(lf.nn.scaled_dot_product_attention(lf.array(q), lf.array(k), lf.array(v), is_causal=True), ref, BF16)
        ran = _ran(device, before)
    if ran is not None:
        assert ran["cudnn"] == 0 and ran["nvrtc"] == 1, ran
