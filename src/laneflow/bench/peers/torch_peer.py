"""PyTorch: eager on one stream, hand-written streams, CUDA-graph replay (1 and several streams), and
the batched kernel as the fused limit. Timed with CUDA events on the GPU."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ...models import gpt2 as model
from ..harness import FIRST_CALL_NOTE, Impl, chain_program, first_call
from ..memory import device_used_bytes
from ..suites.dispatch import mixed_program
from . import PeerUnavailable, require


def _torch():
    return require("torch", "PyTorch")


def check(device: Any) -> None:
    torch = _torch()
    if device.type == "gpu" and not torch.cuda.is_available():
        raise PeerUnavailable("PyTorch sees no CUDA device")


class EventTimer:
    """CUDA events on the current stream (multi-stream runs join back to it before returning)."""

    def __init__(self, torch):
        self.torch = torch

    def start(self) -> None:
        self._s = self.torch.cuda.Event(enable_timing=True)
        self._s.record()

    def stop(self) -> float:
        e = self.torch.cuda.Event(enable_timing=True)
        e.record()
        e.synchronize()
        return self._s.elapsed_time(e) / 1e3


def _setup(device: Any):
    torch = _torch()
    dev = "cuda" if device.type == "gpu" else "cpu"
    gpu = dev == "cuda"
    sync = torch.cuda.synchronize if gpu else (lambda: None)

    def impl(name: str, run, to_host=None, lanes=None, note="") -> Impl:
        return Impl(f"torch {name}", run, to_host or _host, lanes=lanes, sync=sync,
                    timer=EventTimer(torch) if gpu else None, note=note)

    return torch, dev, gpu, impl


def _tensor(torch, a: np.ndarray, dev: str):
    if a.dtype.name in ("bfloat16", "float16"):
        tdt = torch.bfloat16 if a.dtype.name == "bfloat16" else torch.float16
        return torch.from_numpy(a.astype(np.float32)).to(dev).to(tdt)
    return torch.from_numpy(np.ascontiguousarray(a)).to(dev)


def _host(out: Any) -> Any:
    if isinstance(out, (list, tuple)):
        return [_host(o) for o in out]
    t = out.detach()
    if t.dtype.is_floating_point and t.element_size() < 4:
        t = t.float()
    return t.cpu().numpy()


def _stacked(out: Any) -> np.ndarray:
    return np.stack(_host(list(out)))


def _multi(torch, streams, parts):
    """Run parts[i]() on streams[i % k], forked from and joined back to the current stream."""
    cur = torch.cuda.current_stream()
    for s in streams:
        s.wait_stream(cur)
    for i, part in enumerate(parts):
        with torch.cuda.stream(streams[i % len(streams)]):
            part()
    for s in streams:
        cur.wait_stream(s)


def _graph(torch, fn):
    """Capture fn into a CUDA graph (after a warm-up on a side stream, as PyTorch requires)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def dispatch(case, device, lanes):
    torch, dev, gpu, impl = _setup(device)
    x0 = _tensor(torch, case.inputs["x"], dev)
    n = case.params["n"]

    chain = chain_program(n)
    return [impl("eager", lambda: chain(x0), lanes=1)]


def dispatch_mixed(case, device, lanes):
    torch, dev, gpu, impl = _setup(device)
    x, w = _tensor(torch, case.inputs["x"], dev), _tensor(torch, case.inputs["w"], dev)
    prog = mixed_program(case.params["n"], lambda v: v.sum(dim=0, keepdim=True))
    return [impl("eager", lambda: prog(x, w), lanes=1)]


def experts(case, device, lanes):
    torch, dev, gpu, impl = _setup(device)
    X = _tensor(torch, case.inputs["x"], dev)
    W = _tensor(torch, case.inputs["w"], dev)
    E = X.shape[0]
    xs, ws = list(X.unbind(0)), list(W.unbind(0))
    ys = [torch.empty(X.shape[1], W.shape[2], device=dev, dtype=X.dtype) for _ in range(E)]
    parts = [lambda i=i: torch.matmul(xs[i], ws[i], out=ys[i]) for i in range(E)]

    def serial():
        for p in parts:
            p()
        return ys
    yb = torch.empty(E, X.shape[1], W.shape[2], device=dev, dtype=X.dtype)
    out = [impl("eager", serial, _stacked, lanes=1),
           impl("bmm (fused)", lambda: torch.bmm(X, W, out=yb), lanes=1)]
    if gpu:
        streams = [torch.cuda.Stream() for _ in range(lanes)]

        def multi():
            _multi(torch, streams, parts)
            return ys
        out.append(impl("streams", multi, _stacked, lanes=lanes))
        g1 = _graph(torch, serial)
        out.append(impl("graph", lambda: (g1.replay(), ys)[1], _stacked, lanes=1))
        gk = _graph(torch, multi)
        out.append(impl("graph streams", lambda: (gk.replay(), ys)[1], _stacked, lanes=lanes))
    return out


def branches(case, device, lanes):
    torch, dev, gpu, impl = _setup(device)
    x = _tensor(torch, case.inputs["x"], dev)
    W = _tensor(torch, case.inputs["w"], dev)
    B = W.shape[0]
    ws = list(W.unbind(0))
    hs = [torch.empty(x.shape[0], W.shape[2], device=dev, dtype=x.dtype) for _ in range(B)]
    acc = torch.empty_like(hs[0])
    parts = [lambda i=i: torch.tanh(torch.matmul(x, ws[i], out=hs[i]), out=hs[i]) for i in range(B)]

    def combine():
        torch.sum(torch.stack(hs), 0, out=acc)
        return acc

    def serial():
        for p in parts:
            p()
        return combine()
    out = [impl("eager", serial, lanes=1),
           impl("bmm (fused)", lambda: torch.tanh(torch.matmul(x, W)).sum(0), lanes=1)]
    if gpu:
        streams = [torch.cuda.Stream() for _ in range(lanes)]

        def multi():
            _multi(torch, streams, parts)
            return combine()
        out.append(impl("streams", multi, lanes=lanes))
        g1 = _graph(torch, serial)
        out.append(impl("graph", lambda: (g1.replay(), acc)[1], lanes=1))
        gk = _graph(torch, multi)
        out.append(impl("graph streams", lambda: (gk.replay(), acc)[1], lanes=lanes))
    return out


def kernels(case, device, lanes):
    torch, dev, gpu, impl = _setup(device)
    a, b, c = (_tensor(torch, case.inputs[k], dev) for k in "abc")
    rows = case.params["rows"]
    cr = c.view(rows, -1)
    res: list = [None] * 4
    parts = [lambda: res.__setitem__(0, torch.addcmul(c, a, b)),
             lambda: res.__setitem__(1, torch.exp(a)),
             lambda: res.__setitem__(2, b.sum()),
             lambda: res.__setitem__(3, torch.softmax(cr, -1))]

    def serial():
        for p in parts:
            p()
        return list(res)
    out = [impl("eager", serial, lanes=1)]
    if gpu:
        streams = [torch.cuda.Stream() for _ in range(lanes)]

        def multi():
            _multi(torch, streams, parts)
            return list(res)
        out.append(impl("streams", multi, lanes=lanes))
    return out


def kernel_one(case, device, lanes):
    """One kernel of ``bench kernels``' bandwidth cases (``case.params["op"]``)."""
    torch, dev, gpu, impl = _setup(device)
    ins = [_tensor(torch, t, dev) for t in case.inputs.values()]
    fns = {"add": torch.add, "broadcast multiply": torch.mul,
           "last-axis sum": lambda x: x.sum(-1), "row softmax": lambda x: torch.softmax(x, -1)}
    fn = fns[case.params["op"]]
    return [impl("eager", lambda: fn(*ins), lanes=1)]


def fences(case, device, lanes):
    torch, dev, gpu, impl = _setup(device)
    if not gpu:
        raise PeerUnavailable("PyTorch has no streams on the CPU")
    x0 = _tensor(torch, case.inputs["x"], dev)
    n = case.params["n"]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]

    def one_stream():
        x = x0
        for _ in range(n):
            x = x + 1.0
        return x

    def ping_pong():
        cur = torch.cuda.current_stream()
        streams[0].wait_stream(cur)
        x = x0
        for i in range(n):
            s, other = streams[i & 1], streams[(i + 1) & 1]
            s.wait_stream(other)
            with torch.cuda.stream(s):
                x = x + 1.0
        cur.wait_stream(streams[(n - 1) & 1])
        return x
    return [impl("one stream", one_stream, lanes=1, note="no fences: baseline"),
            impl("two streams", ping_pong, lanes=2, note="wait_stream every hop")]


def handles(case, device, lanes):
    """c GEMMs, each on its own stream (PyTorch binds cuBLAS workspaces per stream)."""
    torch, dev, gpu, impl = _setup(device)
    if not gpu:
        raise PeerUnavailable("PyTorch's cuBLAS handles exist on the GPU only")
    X = _tensor(torch, case.inputs["x"], dev)
    w = _tensor(torch, case.inputs["w"], dev)
    c = X.shape[0]
    torch.cuda.synchronize()
    before = device_used_bytes(device)
    t0 = time.perf_counter()
    streams = [torch.cuda.Stream() for _ in range(c)]
    ys = [None] * c

    def run():
        _multi(torch, streams, [lambda i=i: ys.__setitem__(i, X[i] @ w) for i in range(c)])
        return list(ys)
    run()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    after = device_used_bytes(device)
    it = impl(f"{c} streams", run, _stacked, lanes=c)
    it.extra.update(first_run_ms=round(first * 1e3, 3),
                    memory_growth_MiB=None if before is None else round((after - before) / 2**20, 2))
    return [it]


def handles_batched(case, device, lanes):
    """``torch.linalg.solve`` on the whole batch (one batched call: cuBLAS/cuSOLVER batched LU or MAGMA)."""
    torch, dev, gpu, impl = _setup(device)
    if not gpu:
        raise PeerUnavailable("the batched-solve comparison is about GPU handles")
    A = _tensor(torch, case.inputs["a"], dev)
    Bm = _tensor(torch, case.inputs["b"], dev)
    return [impl("linalg.solve (batched)", lambda: torch.linalg.solve(A, Bm), lanes=1)]


def hf_gpt2(cfg: Any, weights: dict, dev: str = "cpu", dtype: Any = None):
    """transformers' ``GPT2LMHeadModel`` of ``cfg`` (a laneflow GPT2Config) with sdpa attention (its
    eager attention breaks CUDA-graph capture), in eval mode, holding ``weights`` (numpy, Hugging Face
    names; the head stays tied to ``wte``) in ``dtype`` (a torch dtype; None: float32) on ``dev``."""
    torch = _torch()
    transformers = require("transformers")
    hc = transformers.GPT2Config(n_layer=cfg.n_layer, n_embd=cfg.n_embd, n_head=cfg.n_head,
                                 vocab_size=cfg.vocab_size, n_positions=cfg.n_positions,
                                 layer_norm_epsilon=cfg.layer_norm_epsilon, attn_implementation="sdpa",
                                 bos_token_id=cfg.vocab_size - 1, eos_token_id=cfg.vocab_size - 1)
    m = transformers.GPT2LMHeadModel(hc).eval()
    state = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in weights.items()}
    got = m.load_state_dict(state, strict=False)
    missing = [k for k in got.missing_keys if k != "lm_head.weight"]
    if missing or got.unexpected_keys:
        raise ValueError(f"transformers' GPT-2 did not take the weights: missing {missing[:3]}, "
                         f"unexpected {got.unexpected_keys[:3]}")
    return m.to(dev, dtype or torch.float32)


def hf_gpt2_logits(cfg: Any, weights: dict, ids: np.ndarray) -> np.ndarray:
    """Float32 logits of ``ids`` through :func:`hf_gpt2` on the CPU (a reference for the float32 math)."""
    torch = _torch()
    m = hf_gpt2(cfg, weights)
    with torch.no_grad():
        return m(torch.from_numpy(ids.astype(np.int64)), use_cache=False).logits.numpy()


def hf_generate(cfg: Any, weights: dict, prompt: list, n: int) -> list:
    """transformers' greedy ``generate`` of ``n`` tokens after ``prompt`` (float32, on the CPU): the
    prompt and the new tokens, as a list of ids."""
    torch = _torch()
    m = hf_gpt2(cfg, weights)
    m.generation_config.eos_token_id = None  # never stop early: exactly n tokens, as laneflow's loop
    with torch.no_grad():
        out = m.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, num_beams=1,
                         attention_mask=torch.ones(1, len(prompt), dtype=torch.long), pad_token_id=cfg.vocab_size - 1)
    return out[0].tolist()


def gpt2(case, device, lanes):
    """transformers' GPT-2 forward: eager, and replayed from a CUDA graph on the GPU (as
    ``anchors/probe_gpt2.py``; ``use_cache=False``: a forward, no KV cache built)."""
    torch, dev, gpu, impl = _setup(device)
    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(np.dtype(case.dtype).name, torch.float32)
    m = hf_gpt2(case.params["config"], case.params["weights"], dev, tdt)
    ids = torch.from_numpy(case.inputs["ids"].astype(np.int64)).to(dev)

    def forward():
        with torch.no_grad():
            return m(ids, use_cache=False).logits
    # (before any other row runs it: the first forward of these shapes, as laneflow's first-call row)
    rows = [first_call(case, impl("eager, first call", forward, lanes=1, note=FIRST_CALL_NOTE)),
            impl("eager", forward, lanes=1, note="GPT2LMHeadModel, sdpa attention")]
    if gpu:
        static: dict = {}
        g = _graph(torch, lambda: static.__setitem__("logits", forward()))  # the captured call's output
        rows.append(impl("graph", lambda: (g.replay(), static["logits"])[1], lanes=1))
    return rows


def decode(case, device, lanes):
    """One GPT-2 decode step with static caches, written in PyTorch as ``anchors/probe_decode.py``
    writes it (the position a device tensor, ``index_copy_`` into the caches, a masked float32 softmax),
    on the suite's weights: eager, and replayed from a CUDA graph on the GPU."""
    torch, dev, gpu, impl = _setup(device)
    F = torch.nn.functional
    cfg, S, POS, B = (case.params[k] for k in ("config", "S", "POS", "B"))
    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(np.dtype(case.dtype).name, torch.float32)
    W = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)).to(dev, tdt)
         for k, v in case.params["weights"].items()}
    P, d, nh, dh, eps = model.PREFIX, cfg.n_embd, cfg.n_head, cfg.head_dim, cfg.layer_norm_epsilon
    kc = [torch.zeros(B, nh, S, dh, device=dev, dtype=tdt) for _ in range(cfg.n_layer)]
    vc = [torch.zeros(B, nh, S, dh, device=dev, dtype=tdt) for _ in range(cfg.n_layer)]
    ar = torch.arange(S, device=dev)

    def step(tok, pos):
        h = (W[P + "wte.weight"][tok] + W[P + "wpe.weight"][pos]).view(B, 1, d)
        keep = (ar <= pos).view(1, 1, 1, S)
        for i in range(cfg.n_layer):
            p = f"{P}h.{i}."
            a = F.layer_norm(h, (d,), W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps)
            q, k, v = (a @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]).split(d, dim=-1)
            q = q.view(B, 1, nh, dh).transpose(1, 2)
            kc[i].index_copy_(2, pos, k.view(B, 1, nh, dh).transpose(1, 2))
            vc[i].index_copy_(2, pos, v.view(B, 1, nh, dh).transpose(1, 2))
            att = (q @ kc[i].transpose(-1, -2)) * (1.0 / dh ** 0.5)
            att = torch.softmax(att.masked_fill(~keep, -1e9).float(), dim=-1).to(tdt)
            y = (att @ vc[i]).transpose(1, 2).reshape(B, 1, d)
            h = h + (y @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"])
            m = F.layer_norm(h, (d,), W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps)
            m = F.gelu(m @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"], approximate="tanh")
            h = h + (m @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"])
        h = F.layer_norm(h, (d,), W[P + "ln_f.weight"], W[P + "ln_f.bias"], eps)
        return (h @ W[P + "wte.weight"].T).view(B, -1)

    ids = torch.from_numpy(case.inputs["ids"].astype(np.int64)).to(dev)
    with torch.no_grad():
        for t in range(POS):  # fill the caches with the prompt, one step a token
            step(ids[:, t], torch.tensor([t], device=dev))
        tok, pos = ids[:, POS].contiguous(), torch.tensor([POS], device=dev)

        def eager():
            with torch.no_grad():
                return step(tok, pos)
        rows = [impl("eager", eager, lanes=1, note="static caches, index_copy_ at a device position")]
        if gpu:
            static: dict = {}
            g = _graph(torch, lambda: static.__setitem__("logits", eager()))
            rows.append(impl("graph", lambda: (g.replay(), static["logits"])[1], lanes=1,
                             note="the step captured once; the position a device tensor"))
    return rows
