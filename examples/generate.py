"""GPT-2 text generation with a KV cache: a prefill, then one compiled decode step per token.

    python examples/generate.py                         # seeded random GPT-2 small weights, 4 prompts
    python examples/generate.py --checkpoint model.safetensors --tokenizer DIR --prompt "Hello, my name is"
    python examples/generate.py --device cpu --config tiny --sampling top-p --top-p 0.9 --seed 1

The prompts (token ids, or text with ``--tokenizer``: a local directory with GPT-2's tokenizer files,
read by transformers) may have different lengths: they are right-padded into one batch for the
prefill, and each row then decodes at its own position. Each step is one ``lf.compile``'d call with
the caches donated: one CUDA graph launch per token on the GPU, the caches updated in place. Prints
the generated tokens and the decode speed (tokens/s over the batch).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import laneflow as lf
from laneflow.models import gpt2
from laneflow.models import gpt2_decode as dec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", help="a GPT-2 safetensors file with Hugging Face names (default: random weights)")
    ap.add_argument("--config", choices=("small", "tiny"), default="small", help="random weights' shape")
    ap.add_argument("--tokenizer", help="a local directory with GPT-2's tokenizer files (needs transformers)")
    ap.add_argument("--prompt", action="append", help="a prompt: text with --tokenizer, else comma-separated ids")
    ap.add_argument("--batch", type=int, default=4, help="random prompts when none is given")
    ap.add_argument("--max-new", type=int, default=32, help="tokens to generate per prompt")
    ap.add_argument("--sampling", choices=("greedy", "top-k", "top-p"), default="greedy")
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", choices=("cpu", "gpu"), default=None)
    ap.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: bfloat16 on a GPU)")
    a = ap.parse_args(argv)

    device = lf.gpu if (a.device or ("gpu" if lf.gpu_available() else "cpu")) == "gpu" else lf.cpu
    dtype = a.dtype or ("bfloat16" if device == lf.gpu else "float32")
    tok = _tokenizer(a.tokenizer)
    if a.checkpoint:
        params = gpt2.load_safetensors(a.checkpoint, dtype=dtype, device=device)
        cfg = gpt2.config_from_params(params)
    else:
        cfg = gpt2.GPT2Config() if a.config == "small" else gpt2.GPT2Config.tiny()
        params = gpt2.init_params(cfg, seed=a.seed, dtype=dtype, device=device)
    prompts = _prompts(a, tok, cfg)
    lens = [len(p) for p in prompts]
    if max(lens) + a.max_new > cfg.n_positions:
        ap.error(f"the longest prompt plus --max-new is {max(lens) + a.max_new} tokens; the model has "
                 f"{cfg.n_positions} positions")
    temperature = 0.0 if a.sampling == "greedy" else a.temperature
    t0 = [0.0]

    def progress(k: int) -> None:
        if k == 1:
            t0[0] = time.perf_counter()  # decode speed from the first token on (the prefill is apart)
        _progress(k, a.max_new, time.perf_counter() - t0[0], len(prompts))
    with lf.stream(lf.new_stream(device, lanes=1)):
        out = dec.generate(params, cfg, prompts, a.max_new, temperature=temperature,
                           top_k=a.top_k if a.sampling == "top-k" else 0,
                           top_p=a.top_p if a.sampling == "top-p" else 1.0, seed=a.seed, dtype=dtype,
                           on_token=progress)
        lf.synchronize()
        dt = time.perf_counter() - t0[0]
    print(file=sys.stderr)
    for r, seq in enumerate(out):
        gen = seq[lens[r]:]
        text = tok.decode(gen) if tok is not None else " ".join(map(str, gen))
        print(f"[{r}] prompt {lens[r]} tokens -> {text}")
    n = len(prompts) * (a.max_new - 1)
    print(f"{n} tokens in {dt:.3f} s: {n / dt:.1f} tokens/s ({len(prompts)} prompts, {device}, {dtype}, "
          f"{a.sampling}; one compiled decode step per token)")
    return 0


def _tokenizer(path: str | None):
    if path is None:
        return None
    from transformers import AutoTokenizer  # only with --tokenizer: a local directory, never a download
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def _prompts(a, tok, cfg) -> list[list[int]]:
    if a.prompt:
        if tok is not None:
            return [tok.encode(p) for p in a.prompt]
        return [[int(t) for t in p.split(",")] for p in a.prompt]
    rng = np.random.default_rng(a.seed)
    hi = max(2, min(16, cfg.n_positions - a.max_new))
    return [list(rng.integers(0, cfg.vocab_size, int(rng.integers(max(1, hi // 2), hi + 1)))) for _ in range(a.batch)]


def _progress(done: int, total: int, secs: float, rows: int) -> None:
    width = 30
    fill = int(width * done / total)
    rate = (done - 1) * rows / secs if secs > 0 and done > 1 else 0.0
    sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {done}/{total} tokens per prompt, {rate:.1f} tokens/s")
    sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
