#!/usr/bin/env bash
# GPU check for laneflow's CUDA backend: a smoke test of every primitive kind with a few timings,
# then the GPU half of the test suite. Logs go to $OUT (default ./gpu-check-out); a short table
# is printed last. Run from the repository root on a machine with an NVIDIA GPU:
#   bash tools/gpu_check.sh            # smoke + tests
#   bash tools/gpu_check.sh smoke      # smoke only
set -u
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export LANEFLOW_KERNEL_CACHE=${LANEFLOW_KERNEL_CACHE:-/tmp/laneflow-kcache-$(id -u)}
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv >"$OUT/nvidia-smi.txt" 2>&1

python3 - >"$OUT/smoke.log" 2>&1 <<'PY'
import time, traceback
import numpy as np
import laneflow as lf
rows = []
def check(name, fn):
    t = time.perf_counter()
    try:
        note = fn() or ""
        rows.append((name, "ok", f"{(time.perf_counter() - t) * 1e3:.0f} ms", str(note)))
    except Exception as e:
        traceback.print_exc()
        rows.append((name, "FAIL", "", f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"))
rng = np.random.default_rng(7)
print("gpu_available", lf.gpu_available())
from laneflow.defaults import backend_for
be = backend_for(lf.gpu); ctx = be.context(0)
print("device", ctx.name, ctx.arch, "SMs", ctx.sm_count, "stream mem ops", ctx.stream_mem_ops)
g = lf.gpu
a = rng.standard_normal((300, 257)).astype(np.float32)
def t_upload():
    np.testing.assert_array_equal(np.asarray(lf.array(a, device=g)), a)
def t_ew():
    x = lf.array(a, device=g)
    np.testing.assert_allclose(np.asarray(lf.exp(x) * 2 + x[:1]), np.exp(a) * 2 + a[:1], rtol=1e-6, atol=1e-6)
def t_dtypes():
    for d in (lf.int8, lf.uint8, lf.int32, lf.int64, lf.float16, lf.bfloat16, lf.float64, lf.bool_):
        h = (a * 10).astype(d)
        got = np.asarray(lf.array(h, device=g) + lf.array(h[0], device=g))
        np.testing.assert_array_equal(got, (h + h[0]) if d != lf.bool_ else (h | h[0]))
def t_reduce():
    x = lf.array(a, device=g)
    np.testing.assert_allclose(np.asarray(lf.sum(x, axis=0)), a.sum(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(lf.var(x, axis=1)), a.var(1), rtol=1e-4)
    np.testing.assert_array_equal(np.asarray(lf.argmax(x, axis=1)), a.argmax(1))
def t_softmax():
    x = lf.array(a, device=g)
    e = np.exp(a - a.max(1, keepdims=True)); np.testing.assert_allclose(np.asarray(lf.softmax(x)), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
def t_matmul():
    b = rng.standard_normal((257, 64)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(lf.array(a, device=g) @ lf.array(b, device=g)), a @ b, rtol=1e-4, atol=1e-3)
    h = lf.array(a, dtype=lf.bfloat16, device=g) @ lf.array(b, dtype=lf.bfloat16, device=g)
    ref = a.astype(lf.bfloat16).astype(np.float32) @ b.astype(lf.bfloat16).astype(np.float32)
    err = np.linalg.norm(np.asarray(h).astype(np.float32) - ref) / np.linalg.norm(ref); assert err < 1e-2, err
def t_index():
    x = lf.array(a, device=g)
    np.testing.assert_array_equal(np.asarray(x[3:9, ::5]), a[3:9, ::5])
    np.testing.assert_array_equal(np.asarray(lf.take(x, np.array([4, 0]), axis=0)), a[[4, 0]])
def t_random():
    k = lf.random.key(5)
    np.testing.assert_array_equal(np.asarray(lf.random.uniform((999,), key=k, stream=lf.cpu)), np.asarray(lf.random.uniform((999,), key=k, stream=g)))
def t_cross():
    x = lf.array(a, device=lf.cpu) + 1
    y = lf.multiply(x, 2.0, stream=g)
    z = lf.add(y, 1.0, stream=lf.cpu)
    np.testing.assert_allclose(np.asarray(z), (a + 1) * 2 + 1, rtol=1e-6)
for n, f in [("upload", t_upload), ("elementwise", t_ew), ("dtypes", t_dtypes), ("reduce", t_reduce), ("softmax", t_softmax),
             ("matmul", t_matmul), ("index", t_index), ("random", t_random), ("cpu<->gpu", t_cross)]:
    check(n, f)

def bench_dispatch():
    s = lf.new_stream(g, lanes=1)
    x = lf.array(np.ones(16, np.float32), stream=s); lf.eval(x)
    for n in (200, 10000):
        y = x
        t = time.perf_counter()
        for _ in range(n):
            y = lf.add(y, 1.0, stream=s)
        lf.eval(y)
        dt = time.perf_counter() - t
    return f"{dt / n * 1e6:.1f} us/op (10k chained adds, eval once)"
def bench_bw():
    n = 64 << 20  # 64 Mi float32 = 256 MiB
    x = lf.random.uniform((n,), key=lf.random.key(1), stream=g); y = lf.random.uniform((n,), key=lf.random.key(2), stream=g)
    lf.eval(x, y)
    from laneflow.backends.cuda.kernels.copy import strided_copy
    from cuda.bindings import driver as cu
    def tm(f, reps=10):
        f(); lf.synchronize()
        t = time.perf_counter()
        for _ in range(reps): f()
        lf.synchronize()
        return (time.perf_counter() - t) / reps
    s = lf.default_stream(g)
    buf = be.allocate(g, (n,), np.dtype(np.float32), "bench")
    def cp():
        s.encoder.encode("copy", lambda lane: cu.cuMemcpyDtoDAsync(buf.data.ptr, x._data.buffer.data.ptr, n * 4, lane.stream), (x._data.buffer,), (buf,))
    t_copy = tm(cp)
    t_add = tm(lambda: lf.async_eval(x + y))
    xs = x.reshape(8192, 8192); yrow = y[:8192]; lf.eval(xs, yrow)
    t_bmul = tm(lambda: lf.async_eval(xs * yrow))
    t_sum = tm(lambda: lf.async_eval(lf.sum(xs, axis=1)))
    t_sm = tm(lambda: lf.async_eval(lf.softmax(xs, axis=1)))
    bw = lambda b, t: b / t / 1e9
    nb = n * 4
    return (f"copy {bw(2*nb, t_copy):.0f} GB/s; add {bw(3*nb, t_add):.0f} GB/s; bcast-mul {bw(2*nb, t_bmul):.0f} GB/s; "
            f"row-sum {bw(nb, t_sum):.0f} GB/s; row-softmax {bw(2*nb, t_sm):.0f} GB/s")
def bench_experts():
    ws = [lf.random.normal((4096, 1024), lf.bfloat16, key=lf.random.key(i), stream=g) for i in range(32)]
    xs = [lf.random.normal((16, 4096), lf.bfloat16, key=lf.random.key(100 + i), stream=g) for i in range(32)]
    lf.eval(*ws, *xs)
    res = []
    for lanes in (1, 4, 8):
        s = lf.new_stream(g, lanes=lanes)
        for rep in range(4):
            lf.synchronize()
            t = time.perf_counter()
            outs = [lf.matmul(xx, w, stream=s) for xx, w in zip(xs, ws)]
            lf.eval(*outs)
            dt = time.perf_counter() - t
        res.append(f"{lanes} lanes {dt * 1e6:.0f} us")
    return "; ".join(res)
def bench_matmul_repeat():
    w = lf.random.normal((4096, 1024), lf.bfloat16, key=lf.random.key(3), stream=g)
    x = lf.random.normal((16, 4096), lf.bfloat16, key=lf.random.key(4), stream=g)
    s = lf.new_stream(g, lanes=1)
    lf.eval(lf.matmul(x, w, stream=s))
    t = time.perf_counter()
    outs = [lf.matmul(x, w, stream=s) for _ in range(100)]
    t_host = time.perf_counter() - t
    lf.eval(*outs)
    t_all = time.perf_counter() - t
    return f"16x4096@4096x1024 bf16 x100 on 1 lane: {t_all * 1e4:.1f} us each ({t_host * 1e4:.1f} us host)"
def profile_dispatch():
    import cProfile, pstats, io
    s = lf.new_stream(g, lanes=1)
    x = lf.array(np.ones(16, np.float32), stream=s); lf.eval(x)
    def chain():
        y = x
        for _ in range(5000):
            y = lf.add(y, 1.0, stream=s)
        lf.eval(y)
    chain()
    pr = cProfile.Profile(); pr.enable(); chain(); pr.disable()
    out = io.StringIO(); pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(14); print(out.getvalue())
for n, f in [("dispatch", bench_dispatch), ("bandwidth", bench_bw), ("experts bf16", bench_experts),
             ("matmul repeat", bench_matmul_repeat), ("profile", profile_dispatch)]:
    check(n, f)
print()
for r in rows:
    print(f"{r[0]:<14} {r[1]:<5} {r[2]:>8}  {r[3]}")
PY
echo "== smoke (full log: smoke.log)"; sed -n '/^$/,$p' "$OUT/smoke.log" | tail -20
[ "${1:-all}" = smoke ] && exit 0

timeout 480 python3 -m pytest -q -p no:cacheprovider tests -k "gpu or cuda" --timeout=90 --tb=short -rf \
  >"$OUT/pytest.log" 2>&1
echo "== pytest (full log: pytest.log), failures:"
grep -E "^FAILED|^ERROR" "$OUT/pytest.log" | sed 's/ - .*//' | head -40
tail -3 "$OUT/pytest.log"
