"""One rank of a multi-process test of lf.distributed (tests/test_distributed.py launches it with mpiexec).

    mpiexec -n 4 python tests/dist_worker.py SCENARIO [SEED]

Every rank builds the same random inputs (rank r's from seed + r) so each can compute the expected
result of every collective with numpy. Prints "rank R ok: ..." lines; a failing check raises.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import laneflow as lf
from laneflow import distributed as dist

DTYPES = ("float32", "float64", "int32", "int64", "float16", "bfloat16", "complex64", "bool")


def _inputs(seed: int, size: int, shape: tuple, dtype: str) -> list[np.ndarray]:
    out = []
    for r in range(size):
        rng = np.random.default_rng(seed + r)
        if dtype == "bool":
            a = rng.random(shape) < 0.5
        elif dtype.startswith("int"):
            a = rng.integers(-50, 50, shape)
        elif dtype.startswith("complex"):
            a = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape)
        out.append(a.astype(lf.dtype(dtype)))
    return out


def _close(got, want, dtype: str, what: str) -> None:
    got = np.asarray(got)
    if got.shape != want.shape or got.dtype != want.dtype:
        raise AssertionError(f"{what}: got {got.shape} {got.dtype}, want {want.shape} {want.dtype}")
    tol = {"float16": 2e-2, "bfloat16": 5e-2, "float32": 1e-5, "complex64": 1e-5}.get(dtype, 1e-12)
    g, w = got.astype(np.complex128 if want.dtype.kind == "c" else np.float64), want.astype(
        np.complex128 if want.dtype.kind == "c" else np.float64)
    if not np.allclose(g, w, rtol=tol, atol=tol):
        raise AssertionError(f"{what}: max |diff| {np.max(np.abs(g - w))}")


def collectives(g: dist.Group, seed: int, lanes: int) -> None:
    """Every collective, every dtype, against numpy; two lanes of compute beside the communication lane."""
    s = lf.new_stream(lf.cpu, lanes=lanes)
    n, r = g.size, g.rank
    for dtype in DTYPES:
        xs = _inputs(seed, n, (2 * n, 3), dtype)
        with lf.stream(s):
            x = lf.array(xs[r])
            reds = ("max", "min") if dtype == "bool" else ("sum", "max") if dtype[0] != "c" else ("sum", "prod")
            for red in reds:
                acc = xs[0].astype(np.float32) if dtype in ("float16", "bfloat16") else xs[0]
                for a in xs[1:]:
                    a = a.astype(np.float32) if dtype in ("float16", "bfloat16") else a
                    acc = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[red](acc, a)
                want = acc.astype(xs[0].dtype)
                _close(dist.all_reduce(x, red), want, dtype, f"all_reduce({red}) {dtype}")
                _close(dist.reduce_scatter(x, red), np.split(want, n)[r], dtype, f"reduce_scatter({red}) {dtype}")
                _close(dist.reduce_scatter(x.T, red, axis=1), np.split(want.T, n, axis=1)[r], dtype,
                       f"reduce_scatter(axis=1) {dtype}")
            if dtype[0] == "f" or dtype == "bfloat16":
                want = (sum(a.astype(np.float64) for a in xs) / n).astype(xs[0].dtype)
                _close(dist.all_reduce(x, "avg"), want, dtype, f"all_reduce(avg) {dtype}")
            _close(dist.all_gather(x), np.concatenate(xs), dtype, f"all_gather {dtype}")
            _close(dist.all_gather(x, axis=1), np.concatenate(xs, axis=1), dtype, f"all_gather(axis=1) {dtype}")
            root = n - 1
            _close(dist.broadcast(x, root), xs[root], dtype, f"broadcast {dtype}")
            # a collective's result feeding compute, and compute feeding a collective
            if dtype != "bool":
                y = dist.all_reduce(x * 2, "sum") + 1
                want = (sum(a.astype(np.float64 if a.dtype.kind != "c" else np.complex128) for a in xs) * 2 + 1)
                _close(y, want.astype(xs[0].dtype), dtype, f"compute around all_reduce {dtype}")
    print(f"rank {r} ok: collectives of {len(DTYPES)} dtypes over {n} ranks", flush=True)


def p2p(g: dist.Group, seed: int, lanes: int) -> None:
    """A ring: every rank sends to the next and receives from the previous."""
    n, r = g.size, g.rank
    xs = _inputs(seed, n, (5, 4), "float32")
    x = lf.array(xs[r])
    if r % 2 == 0:
        dist.send(x, (r + 1) % n, tag=3)
        got = dist.recv((5, 4), "float32", (r - 1) % n, tag=3)
    else:
        got = dist.recv((5, 4), "float32", (r - 1) % n, tag=3)
        dist.send(x, (r + 1) % n, tag=3)
    _close(got, xs[(r - 1) % n], "float32", "recv")
    print(f"rank {r} ok: ring of send/recv", flush=True)


def compiled(g: dist.Group, seed: int, lanes: int) -> None:
    """A data-parallel step under lf.compile: local gradient, all-reduced, applied."""
    n, r = g.size, g.rank
    xs = _inputs(seed, n, (8, 4), "float32")
    w0 = _inputs(seed + 100, 1, (4, 4), "float32")[0]

    @lf.compile
    def step(w, x):
        grad = x.T @ (x @ w)
        return w - 0.01 * dist.all_reduce(grad, "avg")

    w = lf.array(w0)
    want = w0.copy()
    for _ in range(3):
        w = step(w, lf.array(xs[r]))
        want = want - 0.01 * sum(a.T @ (a @ want) for a in xs) / n
    _close(w, want.astype(np.float32), "float32", "compiled step")
    print(f"rank {r} ok: compiled data-parallel step ({step.stats()[0]['mode']})", flush=True)


def mismatch(g: dist.Group, seed: int, lanes: int) -> None:
    """Ranks disagree on the shape: every rank fails with a DistributedError naming both calls."""
    x = lf.zeros((4 + g.rank, 2))
    try:
        lf.eval(dist.all_reduce(x))
    except dist.DistributedError as e:
        assert "all_reduce" in str(e) and "same shapes" in str(e), str(e)
        print(f"rank {g.rank} ok: mismatch: {e}", flush=True)
        # the group is still usable: the next agreed collective works
        _close(dist.all_reduce(lf.ones(3)), np.full(3, g.size, np.float64), "float64", "after mismatch")
        print(f"rank {g.rank} ok: usable after the mismatch", flush=True)
        return
    raise AssertionError("no error for mismatched shapes")


def recv_mismatch(g: dist.Group, seed: int, lanes: int) -> None:
    """Rank 1 expects another shape than rank 0 sends: rank 1 fails naming both; rank 0's send completes."""
    if g.rank == 0:
        dist.send(lf.ones((5, 4), dtype=lf.float32), 1, tag=7)
        dist.barrier()
        print("rank 0 ok: sent", flush=True)
        return
    try:
        lf.eval(dist.recv((4, 5), "float32", 0, tag=7))
    except dist.DistributedError as e:
        assert "rank 0 sent (5, 4) float32 with tag 7, this rank expected (4, 5) float32" in str(e), str(e)
        print(f"rank {g.rank} ok: recv mismatch: {e}", flush=True)
        dist.barrier()
        return
    raise AssertionError("no error for a recv of another shape")


def absent(g: dist.Group, seed: int, lanes: int) -> None:
    """The last rank leaves without calling: the others fail within the timeout, never hang."""
    if g.rank == g.size - 1:
        print(f"rank {g.rank} ok: leaving", flush=True)
        return
    t = time.monotonic()
    try:
        lf.eval(dist.all_reduce(lf.ones(3)))
    except dist.DistributedError as e:
        took = time.monotonic() - t
        assert "within" in str(e) and took < g.timeout + 5, (took, str(e))
        print(f"rank {g.rank} ok: timed out after {took:.1f} s: {e}", flush=True)
        return
    raise AssertionError("no error with a rank absent")


def gpt2_tp(g: dist.Group, seed: int, lanes: int) -> None:
    """GPT-2 (tiny, 4 heads) split over the ranks: every rank's logits equal the whole model's, eager
    and under lf.compile, and equal numpy's float64 reference."""
    from laneflow.models import gpt2, gpt2_tp
    cfg = gpt2.GPT2Config.tiny()
    full = gpt2.numpy_params(cfg, seed=seed)
    ids = np.random.default_rng(seed).integers(0, cfg.vocab_size, (2, 8))
    want = gpt2.reference_forward(full, ids, cfg)
    whole = np.asarray(gpt2.forward(gpt2.to_laneflow(full), lf.array(ids), cfg))
    s = lf.new_stream(lf.cpu, lanes=lanes)
    with lf.stream(s):
        local = gpt2.to_laneflow(gpt2_tp.shard_params(full, cfg, g.rank, g.size))
        got = np.asarray(gpt2_tp.forward(local, lf.array(ids), cfg, group=g))
        f = lf.compile(lambda p, i: gpt2_tp.forward(p, i, cfg, group=g))
        for _ in range(3):
            compiled = np.asarray(f(local, lf.array(ids)))
    scale = np.abs(want).max()
    for what, a in (("eager", got), ("compiled", compiled), ("one process", whole)):
        err = np.abs(a - want).max() / scale
        assert err < 1e-5, f"rank {g.rank}: tensor-parallel GPT-2 {what}: max |diff| / max |logit| = {err:.2e}"
    assert np.abs(got - whole).max() / scale < 1e-5
    print(f"rank {g.rank} ok: tensor-parallel GPT-2 over {g.size} ranks ({local[gpt2.PREFIX + 'h.0.mlp.c_fc.weight'].shape})",
          flush=True)


SCENARIOS = {f.__name__: f for f in (collectives, p2p, compiled, mismatch, recv_mismatch, absent, gpt2_tp)}


def main() -> int:
    name = sys.argv[1]
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    lanes = int(os.environ.get("LANES", "2"))
    lf.set_default_device(lf.cpu)  # CPU arrays: the MPI transport (a GPU machine's default is the GPU)
    g = dist.init()
    assert g.size > 1 and g.backend == "mpi", g
    SCENARIOS[name](g, seed, lanes)
    dist.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
