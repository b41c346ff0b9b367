#!/usr/bin/env bash
# The whole check on a GPU machine, in one go (fits one 10-minute device call):
#   the full test suite (cpu and gpu cases) in PARTS processes side by side (default 3; on 2026-12-04
#   three parts took up to 256 s on the H200, PART_TIMEOUT seconds each, default 330), the array API
#   suite on the GPU alongside (ARRAY_API=1) or after the parts (ARRAY_API=after; ~150 s), the differential fuzzer
#   with 2,000 programs on the GPU (~40 s; FUZZ=0 skips it), `python -m laneflow bench` for each suite in
#   BENCH_SUITE (default all, which may be cut at BENCH_TIMEOUT, 150 s; BENCH_SUITE=" " runs none; PEERS
#   chooses peers), and the demo (DEMO=0 skips it). KCACHE_IN / KCACHE_OUT carry the kernel cache
#   from one GPU machine to the next (see below). Tests marked "alone" (they time the GPU) run after the
#   parts, in one process.
# Logs and results go to $OUT (default ./gpu-full-out; also packed as $OUT/logs.tgz: the device tool brings back few files); a short summary is printed last.
set -u
OUT=${OUT:-$PWD/gpu-full-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export LANEFLOW_KERNEL_CACHE=${LANEFLOW_KERNEL_CACHE:-/tmp/laneflow-kcache-$(id -u)}
# A fresh GPU machine compiles every kernel again (most of the suite's time). KCACHE_IN: a tarball of an
# earlier run's kernel cache (with its signing key) to start from, e.g. one carried into the checkout;
# KCACHE_OUT=1 leaves this run's cache as $OUT/kcache.tgz for the next run.
if [ -n "${KCACHE_IN:-}" ] && [ -f "$KCACHE_IN" ]; then
  mkdir -p "$LANEFLOW_KERNEL_CACHE" && chmod 700 "$LANEFLOW_KERNEL_CACHE" && tar xzf "$KCACHE_IN" -C "$LANEFLOW_KERNEL_CACHE"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/env.txt" 2>&1
python3 -c "import sys, numpy, cuda.bindings, nvmath; print(sys.version.split()[0], 'numpy', numpy.__version__, 'cuda-bindings', cuda.bindings.__version__, 'nvmath', nvmath.__version__)" >>"$OUT/env.txt" 2>&1

# A test that blocks in a driver call past 120 s (a hang) ends its part with every thread's stack in the
# part's log (pytest-timeout's thread method; the signal method cannot interrupt a blocked C call). Before
# that, past HANG_DIAG_S seconds (default 90), tools/hang_diag.py prints every CUDA stream's state there.
# PARTS pytest processes side by side (default 3; the suite is bound by NVRTC compiles on the host, 16
# cores there): the test files are dealt out by size, largest first, each to the part with the least so far.
# PARTS=0 runs none (the array API suite, the alone part, the fuzzer or benches only).
PARTS=${PARTS:-3}
python3 - "$PARTS" >"$OUT/parts.txt" <<'PY'
import glob, os, sys
n = int(sys.argv[1])
parts = [[0, []] for _ in range(n)]
if not parts:
    sys.exit(0)
for f in sorted(glob.glob("tests/test_*.py"), key=os.path.getsize, reverse=True):
    p = min(parts, key=lambda q: q[0])
    p[0] += os.path.getsize(f)
    p[1].append(f)
for _, files in parts:
    print(" ".join(sorted(files)))
PY
# ARRAY_API=1: the array API suite alongside the parts; ARRAY_API=after: once they are done (alongside
# six parts on a fresh kernel cache it was cut at 450 s twice; alone it takes ~150 s warm)
if [ "${ARRAY_API:-0}" = 1 ]; then
  (timeout ${PART_TIMEOUT:-330} python3 tools/array_api_suite.py --device gpu >"$OUT/array-api.log" 2>&1
   echo "array api (gpu) rc=$?" >>"$OUT/env.txt") &
  P_API=$!
fi
part=0
while read -r files; do
  part=$((part + 1))
  PYTHONPATH=${PYTHONPATH:-}:$PWD/tools HANG_DIAG_S=${HANG_DIAG_S:-90} \
  timeout ${PART_TIMEOUT:-330} python3 -m pytest -q -p no:cacheprovider -p hang_diag $files -m "not alone" --timeout=120 --timeout-method=thread \
    --tb=short --durations=5 >"$OUT/pytest-$part.log" 2>&1 &
  eval "P_$part=$!"
done <"$OUT/parts.txt"
for k in $(seq 1 "$part"); do
  eval "wait \$P_$k"
  echo "pytest ($k) rc=$?" >>"$OUT/env.txt"
done
[ -n "${P_API:-}" ] && wait "$P_API"
# The tests that time the GPU (marker "alone"), in one process once nothing else runs: kernels of
# other processes time-slice the GPU (two spinning kernels on two lanes took 2x one kernel while six
# parts ran, 2026-12-04).
timeout 120 python3 -m pytest -q -rs -p no:cacheprovider tests -m alone --timeout=60 --timeout-method=thread --tb=short \
  >"$OUT/pytest-alone.log" 2>&1
echo "pytest (alone) rc=$?" >>"$OUT/env.txt"
if [ "${ARRAY_API:-0}" = after ]; then
  timeout ${PART_TIMEOUT:-330} python3 tools/array_api_suite.py --device gpu >"$OUT/array-api.log" 2>&1
  echo "array api (gpu) rc=$?" >>"$OUT/env.txt"
fi
cat $(ls "$OUT"/pytest-[0-9]*.log 2>/dev/null) "$OUT/pytest-alone.log" >"$OUT/pytest.log"
if [ "${FUZZ:-1}" != 0 ]; then
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_fuzz.py -k "random and gpu" --fuzz-programs 2000 \
    --timeout=230 --hypothesis-show-statistics >"$OUT/fuzz.log" 2>&1
  echo "fuzz rc=$?" >>"$OUT/env.txt"
fi
for suite in ${BENCH_SUITE:-all}; do  # one or more suites, e.g. BENCH_SUITE="dispatch kernels"
  timeout ${BENCH_TIMEOUT:-150} python3 -m laneflow bench $suite --device gpu --peers ${PEERS:-torch,jax,cupy} \
    --json "$OUT/bench-$suite.json" >>"$OUT/bench.log" 2>&1
  echo "bench $suite rc=$?" >>"$OUT/env.txt"
done
if [ "${DEMO:-1}" != 0 ]; then
  timeout 40 python3 -m laneflow demo --device gpu --out "$OUT" >"$OUT/demo.log" 2>&1
  echo "demo rc=$?" >>"$OUT/env.txt"
fi

if [ "${KCACHE_OUT:-0}" != 0 ] && [ -d "$LANEFLOW_KERNEL_CACHE" ]; then
  tar czf "$OUT/kcache.tgz" -C "$LANEFLOW_KERNEL_CACHE" . && du -h "$OUT/kcache.tgz" >>"$OUT/env.txt"
fi
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz --exclude=kcache.tgz ./*.log ./*.txt $(ls ./*.json 2>/dev/null))
echo "== env"; cat "$OUT/env.txt"
echo "== pytest"; grep -E "^FAILED|^ERROR" "$OUT/pytest.log" | sed 's/ - .*//' | head -20
for f in $(ls "$OUT"/pytest-[0-9]*.log 2>/dev/null) "$OUT/pytest-alone.log"; do grep -E "passed|failed" "$f" | tail -1; done
if [ -f "$OUT/fuzz.log" ]; then echo "== fuzz"; grep -E "passing|failing" "$OUT/fuzz.log"; tail -1 "$OUT/fuzz.log"; fi
if [ -f "$OUT/array-api.log" ]; then echo "== array api (gpu)"; grep -E "^FAILED|passed|failed" "$OUT/array-api.log" | tail -5; fi
if [ -f "$OUT/demo.log" ]; then echo "== demo"; tail -14 "$OUT/demo.log"; fi  # (exit 0 without a demo)
