"""laneflow.models.gpt2: the plain-op forward against numpy and transformers, compiled against eager,
safetensors checkpoints (both name styles, float32 and bfloat16, bad files), and ``bench gpt2``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import laneflow as lf
from laneflow.models import gpt2

CFG = gpt2.GPT2Config.tiny()


def fresh(rng, cfg=CFG, batch=2, tokens=8):
    """Random weights (their seed from the test's rng) and random token ids."""
    weights = gpt2.numpy_params(cfg, seed=int(rng.integers(2**31)))
    ids = rng.integers(0, cfg.vocab_size, (batch, tokens)).astype(np.int32)
    return weights, ids


def logits(params, ids, cfg=CFG) -> np.ndarray:
    return np.asarray(gpt2.forward(params, lf.array(ids), cfg))


def assert_close(got, want, rtol):
    """|got - want| <= rtol * max |want| everywhere (logits are O(1); relative per element is noisy)."""
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape
    scale = np.max(np.abs(want))
    err = np.max(np.abs(got - want))
    assert err <= rtol * scale, f"max |diff| {err:.3g} over {rtol} x max |want| {scale:.3g}"


def test_float32_forward_matches_the_numpy_reference(device, rng):
    weights, ids = fresh(rng)
    want = gpt2.reference_forward(weights, ids, CFG)  # float64, written differently
    with lf.stream(device):
        got = logits(gpt2.to_laneflow(weights), ids)
    assert got.dtype == np.float32 and got.shape == (2, 8, CFG.vocab_size)
    assert_close(got, want, 1e-5)
    assert_close(gpt2.forward(weights, ids, CFG, gpt2.NUMPY_OPS), want, 1e-5)  # the numpy peer's forward


def test_forward_is_causal_a_later_token_changes_no_earlier_logit(device, rng):
    weights, ids = fresh(rng, batch=1)
    other = ids.copy()
    other[0, 5:] = (other[0, 5:] + 1) % CFG.vocab_size
    with lf.stream(device):
        params = gpt2.to_laneflow(weights)
        a, b = logits(params, ids), logits(params, other)
    np.testing.assert_array_equal(a[:, :5], b[:, :5])
    assert np.abs(a[:, 5:] - b[:, 5:]).max() > 0


def test_bfloat16_forward_stays_bfloat16_and_near_the_reference(device, rng):
    weights, ids = fresh(rng)
    bf = {k: v.astype(ml_dtypes.bfloat16) for k, v in weights.items()}
    want = gpt2.reference_forward(bf, ids, CFG)  # the same (rounded) weights, float64 math
    with lf.stream(device):
        out = gpt2.forward(gpt2.to_laneflow(bf), lf.array(ids), CFG)
    assert out.dtype == lf.bfloat16  # no float64 scalar upcast the graph on the way
    assert_close(np.asarray(out).astype(np.float32), want, 5e-2)


def test_compiled_forward_equals_eager_with_weights_captured_or_passed(device, rng):
    weights, ids = fresh(rng)
    _, ids2 = fresh(rng)
    with lf.stream(device):
        params = gpt2.to_laneflow(weights)
        eager = [logits(params, i) for i in (ids, ids2)]
        captured = lf.compile(lambda ids: gpt2.forward(params, ids, CFG))
        passed = lf.compile(gpt2.forward)  # params a dict argument, the config static
        for i, want in zip((ids, ids2, ids), eager + eager[:1]):  # later calls replay with new ids
            np.testing.assert_array_equal(np.asarray(captured(lf.array(i))), want)
            np.testing.assert_array_equal(np.asarray(passed(params, lf.array(i), CFG)), want)
        assert captured.cache_size == 1 and passed.cache_size == 1


def test_an_untied_lm_head_is_used(device, rng):
    weights, ids = fresh(rng)
    weights["lm_head.weight"] = gpt2.numpy_params(CFG, seed=99)["transformer.wte.weight"]
    with lf.stream(device):
        assert_close(logits(gpt2.to_laneflow(weights), ids), gpt2.reference_forward(weights, ids, CFG), 1e-5)


def test_config_and_token_count_are_checked():
    with pytest.raises(ValueError, match="multiple of n_head"):
        gpt2.GPT2Config(n_embd=64, n_head=5)
    with pytest.raises(ValueError, match="n_layer"):
        gpt2.GPT2Config(n_layer=0)
    params = gpt2.init_params(CFG, device=lf.cpu)
    with pytest.raises(ValueError, match="65 tokens is more than the model's 64 positions"):
        gpt2.forward(params, lf.zeros((1, 65), dtype=lf.int32, device=lf.cpu), CFG)
    assert gpt2.GPT2Config().num_params() == 124_439_808  # GPT-2 small, head tied
    assert gpt2.config_from_params(params, n_head=4) == CFG


# -- checkpoints ------------------------------------------------------------------------------------

def hf_file(path, weights, *, prefix: bool, dtype, buffers: bool = False, lm_head: bool = False) -> None:
    """A checkpoint as transformers writes it, written here with safetensors itself: GPT2LMHeadModel's
    names (``prefix``) or GPT2Model's (the hub's gpt2 file), optionally with the old mask buffers."""
    st = pytest.importorskip("safetensors.numpy", reason="safetensors not installed")
    out = {}
    for k, v in weights.items():
        out[k if prefix else k[len(gpt2.PREFIX):]] = v.astype(dtype)
    if buffers:
        for i in range(CFG.n_layer):
            out[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, CFG.n_positions, CFG.n_positions), dtype))
    if lm_head:
        out["lm_head.weight"] = weights[gpt2.PREFIX + "wte.weight"].astype(dtype)
    st.save_file(out, str(path), metadata={"format": "pt"})


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("prefix", [True, False], ids=["GPT2LMHeadModel names", "hub names"])
def test_safetensors_checkpoint_gives_the_same_logits(device, rng, tmp_path, prefix, dtype):
    weights, ids = fresh(rng)
    path = tmp_path / "model.safetensors"
    hf_file(path, weights, prefix=prefix, dtype=dtype, buffers=not prefix, lm_head=prefix)
    with lf.stream(device):
        loaded = gpt2.load_safetensors(path)
        direct = gpt2.to_laneflow({k: v.astype(dtype) for k, v in weights.items()})
        assert sorted(loaded) == sorted(direct)  # buffers ignored, the tied head dropped
        assert all(loaded[k].dtype == np.dtype(dtype) for k in loaded)
        np.testing.assert_array_equal(logits(loaded, ids), logits(direct, ids))
        as32 = gpt2.load_safetensors(path, dtype=lf.float32)
        assert as32[gpt2.PREFIX + "wte.weight"].dtype == lf.float32


def test_save_then_load_round_trips_bit_for_bit(device, rng, tmp_path):
    pytest.importorskip("safetensors", reason="safetensors not installed")
    weights, ids = fresh(rng)
    with lf.stream(device):
        for dtype in (lf.float32, lf.bfloat16):
            params = gpt2.to_laneflow(weights, dtype)
            path = tmp_path / f"{np.dtype(dtype).name}.safetensors"
            gpt2.save_safetensors(params, path)
            back = gpt2.load_safetensors(path, cfg=CFG)
            for k, v in params.items():
                assert back[k].dtype == v.dtype
                np.testing.assert_array_equal(np.asarray(back[k]), np.asarray(v))
            np.testing.assert_array_equal(logits(back, ids), logits(params, ids))


def _drop(w):
    return {k: v for k, v in w.items() if k != "transformer.h.1.mlp.c_fc.bias"}


@pytest.mark.parametrize("edit, message", [
    (_drop, r"missing tensor transformer\.h\.1\.mlp\.c_fc\.bias of shape \(256,\)"),
    (lambda w: {**w, "transformer.h.0.attn.q_proj.weight": np.zeros((64, 64), np.float32)},
     r"unexpected tensor transformer\.h\.0\.attn\.q_proj\.weight of shape \(64, 64\)"),
    (lambda w: {**w, "transformer.h.0.ln_1.weight": np.zeros(65, np.float32)},
     r"tensor transformer\.h\.0\.ln_1\.weight has shape \(65,\), expected \(64,\)"),
    (lambda w: {k: v for k, v in w.items() if "wte" not in k}, r"missing tensor transformer\.wte\.weight"),
    (lambda w: {**w, "lm_head.weight": np.zeros((3, 64), np.float32)}, r"lm_head\.weight has shape \(3, 64\)"),
], ids=["missing", "unexpected", "wrong shape", "no embedding", "wrong head"])
def test_a_wrong_checkpoint_raises_a_clear_error(rng, tmp_path, edit, message):
    st = pytest.importorskip("safetensors.numpy", reason="safetensors not installed")
    weights, _ = fresh(rng)
    path = tmp_path / "bad.safetensors"
    st.save_file(edit(weights), str(path))
    with pytest.raises(ValueError, match=message) as e:
        gpt2.load_safetensors(path, device=lf.cpu)
    assert str(path) in str(e.value)


def test_a_checkpoint_of_another_size_or_no_checkpoint_at_all_is_refused(rng, tmp_path):
    pytest.importorskip("safetensors", reason="safetensors not installed")
    weights, _ = fresh(rng)
    path = tmp_path / "tiny.safetensors"
    gpt2.save_safetensors(weights, path)
    with pytest.raises(ValueError, match=r"transformer\.wte\.weight has shape \(256, 64\), expected \(50257, 768\)"):
        gpt2.load_safetensors(path, cfg=gpt2.GPT2Config(), device=lf.cpu)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match="junk.safetensors is not a safetensors file"):
        gpt2.load_safetensors(junk, device=lf.cpu)
    with pytest.raises(FileNotFoundError, match="nothere"):
        gpt2.load_safetensors(tmp_path / "nothere.safetensors", device=lf.cpu)


# -- transformers ----------------------------------------------------------------------------------

def test_float32_logits_equal_transformers_on_the_same_weights(device, rng):
    pytest.importorskip("torch", reason="PyTorch not installed")
    pytest.importorskip("transformers", reason="transformers not installed")
    from laneflow.bench.peers.torch_peer import hf_gpt2_logits

    weights, ids = fresh(rng)
    want = hf_gpt2_logits(CFG, weights, ids)
    with lf.stream(device):
        assert_close(logits(gpt2.to_laneflow(weights), ids), want.astype(np.float64), 1e-5)


# -- the benchmark -----------------------------------------------------------------------------------

def test_bench_gpt2_quick_runs_and_every_row_agrees(tmp_path):
    f = tmp_path / "gpt2.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.run([sys.executable, "-m", "laneflow", "bench", "gpt2", "--quick", "--device", "cpu",
                        "--peers", "numpy", "--json", str(f)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(f.read_text())
    assert doc["suites"] == ["gpt2"]
    rows = doc["results"]
    assert {r["workload"] for r in rows} == {
        f"GPT-2-like 2 layers x 64 (4 heads, vocab 256) forward, {b} x 8 tokens, float32" for b in (1, 2)}
    impls = {(r["impl"], r["lanes"]) for r in rows}
    lanes = doc["settings"]["lanes"]  # (the CPU default: 2 to 4, by the machine's cores)
    assert {("laneflow eager, first call", 1), ("laneflow eager", 1), ("laneflow compiled", lanes),
            ("laneflow compiled, weights captured", lanes), ("numpy eager", 1)} <= impls
    for r in rows:
        assert r["status"] == "ok" and r["matches"] is True, r
        assert r["max_abs_diff"] < 1e-5 and r["bytes"] > 0 and r["floor_us"] > 0
    assert "laneflow eager, first call" in p.stdout


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-5), (lf.bfloat16, 5e-2)])
def test_the_lf_nn_model_matches_the_reference_and_the_plain_model(device, rng, dtype, rtol):
    """The forward written with lf.nn (fused norms, attention and epilogues) against the float64
    reference, eager and compiled."""
    weights, ids = fresh(rng)
    want = gpt2.reference_forward(weights, ids, CFG)
    with lf.stream(device):
        P = gpt2.to_laneflow(weights, dtype)
        ids_a = lf.array(ids)
        got = np.asarray(gpt2.forward(P, ids_a, CFG, gpt2.NN_OPS)).astype(np.float64)
        assert_close(got, want, rtol)
        f = lf.compile(lambda ids: gpt2.forward(P, ids, CFG, gpt2.NN_OPS))
        for _ in range(2):
            assert_close(np.asarray(f(ids_a)).astype(np.float64), want, rtol)
