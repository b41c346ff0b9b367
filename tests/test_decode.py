"""KV-cache decoding of GPT-2 (models/gpt2_decode.py): a prefill, then one compiled step per token with
the caches donated, against the float64 reference forward re-run on the whole sequence each step."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf
from laneflow.models import gpt2
from laneflow.models import gpt2_decode as D


def _setup(device, dtype=lf.float32, seed=0):
    cfg = gpt2.GPT2Config.tiny()
    P = gpt2.numpy_params(cfg, seed)
    with lf.stream(device):
        p = gpt2.to_laneflow(P, dtype=dtype)
    return cfg, P, p


def _tol(dtype, ref):
    return (1e-5 if dtype == lf.float32 else 3e-2) * float(np.abs(ref).max())


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("dtype", [lf.float32, lf.bfloat16])
def test_cached_decode_matches_the_full_forward(device, fused, compiled, dtype):
    if dtype == lf.bfloat16 and device.type == "cpu" and (fused or not compiled):
        pytest.skip("bfloat16 on the CPU: one combination is enough (numpy's bfloat16 is slow)")
    cfg, P, p = _setup(device, dtype)
    rng = np.random.default_rng(3)
    ids = rng.integers(0, cfg.vocab_size, (2, 4))

    def step(p, tok, pos, cache):
        return D.decode_step(p, tok, pos, cfg, cache, fused=fused)
    f = lf.compile(step, donate_argnums=(3,)) if compiled else step
    with lf.stream(lf.new_stream(device, lanes=2)):
        cache = D.init_cache(cfg, 2, 12, dtype=dtype)
        logits, cache = D.prefill(p, lf.array(ids), cfg, cache)
        ref = gpt2.reference_forward(P, ids, cfg)
        assert np.abs(np.asarray(logits, np.float64) - ref).max() <= _tol(dtype, ref)
        seq = np.concatenate([ids, ref[:, -1].argmax(-1)[:, None]], 1)
        for s in range(6):
            lg, cache = f(p, lf.array(seq[:, -1].astype(np.int32)), lf.array(np.int32(seq.shape[1] - 1)), cache)
            ref = gpt2.reference_forward(P, seq, cfg)[:, -1]
            assert np.abs(np.asarray(lg, np.float64) - ref).max() <= _tol(dtype, ref), s
            seq = np.concatenate([seq, ref.argmax(-1)[:, None]], 1)
    if compiled:
        assert f.cache_size == 1  # one trace for the whole generation: positions are data
        if device.type == "gpu":
            st = f.stats()[0]
            assert st["mode"] == "cuda graph", st


def test_prompts_of_different_lengths_decode_at_their_own_positions(device):
    cfg, P, p = _setup(device)
    rng = np.random.default_rng(4)
    lens = [2, 5, 3]
    ids = rng.integers(0, cfg.vocab_size, (3, 5))
    f = lf.compile(lambda p, tok, pos, cache: D.decode_step(p, tok, pos, cfg, cache, fused=True),
                   donate_argnums=(3,))
    with lf.stream(device):
        cache = D.init_cache(cfg, 3, 16)
        logits, cache = D.prefill(p, lf.array(ids), cfg, cache)
        lg = np.asarray(logits)
        seqs = [list(ids[r, :n]) + [int(lg[r, n - 1].argmax())] for r, n in enumerate(lens)]
        pos = np.array(lens, np.int32)
        for s in range(5):
            out, cache = f(p, lf.array(np.array([q[-1] for q in seqs], np.int32)), lf.array(pos), cache)
            out = np.asarray(out)
            for r, q in enumerate(seqs):
                ref = gpt2.reference_forward(P, np.array([q]), cfg)[0, -1]
                assert np.abs(out[r] - ref).max() <= 1e-5 * np.abs(ref).max(), (s, r)
                q.append(int(out[r].argmax()))
            pos += 1


def test_decode_errors(device):
    cfg, P, p = _setup(device)
    with lf.stream(device):
        cache = D.init_cache(cfg, 1, 8)
        with pytest.raises(TypeError, match="pos must be a 0-d or"):
            D.decode_step(p, lf.array(np.array([1])), 3, cfg, cache)
        with pytest.raises(ValueError, match="do not fit a cache of 8 positions"):
            D.prefill(p, lf.array(np.zeros((1, 9), np.int32)), cfg, cache)
        with pytest.raises(ValueError, match="max_len 100"):
            D.init_cache(cfg, 1, 100)


def test_greedy_generation_equals_the_uncached_reference(device):
    cfg, P, p = _setup(device, seed=5)
    rng = np.random.default_rng(6)
    prompts = [list(rng.integers(0, cfg.vocab_size, n)) for n in (3, 7, 5)]
    with lf.stream(device):
        got = D.generate(p, cfg, prompts, 6)
    for q, g in zip(prompts, got):
        want = D.reference_generate(P, np.array([q]), cfg, 6, gpt2.reference_forward)[0]
        assert g == list(want), (g, list(want))


def test_top_k_and_top_p_pick_only_allowed_tokens_with_the_right_frequencies():
    from laneflow.models.sampling import pick

    rng = np.random.default_rng(7)
    logits = rng.standard_normal((1, 12)) * 2
    p = np.exp(logits[0] - logits.max())
    p /= p.sum()
    u = rng.random(20000)
    draws = np.concatenate([pick(np.repeat(logits, 1000, 0), u[k:k + 1000]) for k in range(0, 20000, 1000)])
    freq = np.bincount(draws, minlength=12) / draws.size
    assert np.abs(freq - p).max() < 0.02  # plain sampling follows the softmax
    top3 = set(np.argsort(-p)[:3])
    d = pick(np.repeat(logits, 500, 0), u[:500], top_k=3)
    assert set(d.tolist()) <= top3 and len(set(d.tolist())) == 3
    order = np.argsort(-p)
    nucleus = set(order[:int(np.searchsorted(np.cumsum(p[order]), 0.7)) + 1])
    d = pick(np.repeat(logits, 500, 0), u[:500], top_p=0.7)
    assert set(d.tolist()) <= nucleus and len(set(d.tolist())) == len(nucleus)
    assert (pick(logits, np.array([0.5]), temperature=1e-6) == logits.argmax()).all()  # cold: greedy


def test_sampling_with_a_seed_is_reproducible_and_the_example_runs(device, tmp_path):
    import os
    import subprocess
    import sys

    cfg, P, p = _setup(device, seed=8)
    prompts = [[1, 2, 3], [4, 5]]
    with lf.stream(device):
        a = D.generate(p, cfg, prompts, 5, temperature=1.0, top_p=0.9, seed=3)
        b = D.generate(p, cfg, prompts, 5, temperature=1.0, top_p=0.9, seed=3)
        c = D.generate(p, cfg, prompts, 5, temperature=1.0, top_k=5, seed=4)
    assert a == b and all(len(s) == len(q) + 5 for s, q in zip(c, prompts))
    if device.type != "cpu":
        return
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "generate.py")
    r = subprocess.run([sys.executable, example, "--device", "cpu", "--config", "tiny", "--max-new", "4",
                        "--sampling", "top-k", "--prompt", "1,2,3", "--prompt", "9"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "[0] prompt 3 tokens ->" in r.stdout and "tokens/s" in r.stdout


def test_greedy_tokens_equal_transformers_generate(device):
    """The same weights through transformers' GPT2LMHeadModel.generate (greedy, float32, on the CPU)."""
    pytest.importorskip("transformers", reason="transformers is not installed (a GPU machine has it)")
    pytest.importorskip("torch", reason="PyTorch is not installed")
    from laneflow.bench.peers.torch_peer import hf_generate

    cfg, P, p = _setup(device, seed=9)
    prompt = [5, 17, 3, 99, 42]
    with lf.stream(device):
        ours = D.generate(p, cfg, [prompt], 10)[0]
    assert ours == hf_generate(cfg, P, prompt, 10)
