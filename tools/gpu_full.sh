#!/usr/bin/env bash
# The whole check on a GPU machine, in one go (fits one 10-minute device call; on 2026-11-30 the test
# suite in one process took about 340 s and the 2,000-program fuzz 25 s on the H200, about 4x that since each program runs four times (plan cache), so the suite
# runs as three processes, and `bench all` may be cut at its 150 s: set BENCH_SUITE to one or more
# suites, e.g. BENCH_SUITE="dispatch kernels", each with BENCH_TIMEOUT seconds, PEERS to choose peers):
#   the full test suite (cpu and gpu cases), the differential fuzzer with 2,000 programs on the GPU,
#   `python -m laneflow bench` against the importable peers, and the demo (DEMO=0 skips it).
# Logs and results go to $OUT (default ./gpu-full-out); a short summary is printed last.
set -u
OUT=${OUT:-$PWD/gpu-full-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export LANEFLOW_KERNEL_CACHE=${LANEFLOW_KERNEL_CACHE:-/tmp/laneflow-kcache-$(id -u)}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/env.txt" 2>&1
python3 -c "import sys, numpy, cuda.bindings, nvmath; print(sys.version.split()[0], 'numpy', numpy.__version__, 'cuda-bindings', cuda.bindings.__version__, 'nvmath', nvmath.__version__)" >>"$OUT/env.txt" 2>&1

# Three pytest processes side by side (the suite is bound by NVRTC compiles on the host, 16 cores
# there): the elementwise, matmul and kernel-source files in one, the other files split in two.
A="tests/test_ops_elementwise.py tests/test_ops_matmul.py tests/test_kernel_sources.py"
REST=$(ls tests/test_*.py | grep -v -e test_ops_elementwise.py -e test_ops_matmul.py -e test_kernel_sources.py)
B=$(echo "$REST" | grep -E "tests/test_[a-n]")
C=$(echo "$REST" | grep -v -E "tests/test_[a-n]")
for part in a b c; do
  case $part in a) files=$A ;; b) files=$B ;; c) files=$C ;; esac
  timeout 330 python3 -m pytest -q -p no:cacheprovider $files --timeout=120 --tb=short --durations=5 \
    >"$OUT/pytest-$part.log" 2>&1 &
  eval "P_$part=$!"
done
for part in a b c; do
  eval "wait \$P_$part"
  echo "pytest ($part) rc=$?" >>"$OUT/env.txt"
done
cat "$OUT"/pytest-[abc].log >"$OUT/pytest.log"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_fuzz.py -k "random and gpu" --fuzz-programs 2000 \
  --timeout=230 --hypothesis-show-statistics >"$OUT/fuzz.log" 2>&1
echo "fuzz rc=$?" >>"$OUT/env.txt"
for suite in ${BENCH_SUITE:-all}; do  # one or more suites, e.g. BENCH_SUITE="dispatch kernels"
  timeout ${BENCH_TIMEOUT:-150} python3 -m laneflow bench $suite --device gpu --peers ${PEERS:-torch,jax,cupy} \
    --json "$OUT/bench-$suite.json" >>"$OUT/bench.log" 2>&1
  echo "bench $suite rc=$?" >>"$OUT/env.txt"
done
if [ "${DEMO:-1}" != 0 ]; then
  timeout 40 python3 -m laneflow demo --device gpu --out "$OUT" >"$OUT/demo.log" 2>&1
  echo "demo rc=$?" >>"$OUT/env.txt"
fi

echo "== env"; cat "$OUT/env.txt"
echo "== pytest"; grep -E "^FAILED|^ERROR" "$OUT/pytest.log" | sed 's/ - .*//' | head -20
for part in a b c; do tail -1 "$OUT/pytest-$part.log"; done
echo "== fuzz"; grep -E "passing|failing" "$OUT/fuzz.log"; tail -1 "$OUT/fuzz.log"
if [ -f "$OUT/demo.log" ]; then echo "== demo"; tail -14 "$OUT/demo.log"; fi  # (exit 0 without a demo)
