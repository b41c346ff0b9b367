#!/usr/bin/env bash
# The whole check on a GPU machine, in one go (fits one 10-minute device call; on 2026-11-30 the test
# suite in one process took about 340 s and the 2,000-program fuzz 25 s on the H200, so the suite
# runs as two processes and `bench all` may be cut at its 150 s: set BENCH_SUITE=experts (or run the
# bench in a call of its own) to be sure of one suite):
#   the full test suite (cpu and gpu cases), the differential fuzzer with 2,000 programs on the GPU,
#   `python -m laneflow bench all` against the importable peers, and the demo.
# Logs and results go to $OUT (default ./gpu-full-out); a short summary is printed last.
set -u
OUT=${OUT:-$PWD/gpu-full-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export LANEFLOW_KERNEL_CACHE=${LANEFLOW_KERNEL_CACHE:-/tmp/laneflow-kcache-$(id -u)}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/env.txt" 2>&1
python3 -c "import sys, numpy, cuda.bindings, nvmath; print(sys.version.split()[0], 'numpy', numpy.__version__, 'cuda-bindings', cuda.bindings.__version__, 'nvmath', nvmath.__version__)" >>"$OUT/env.txt" 2>&1

# Two pytest processes side by side (the suite is bound by NVRTC compiles on the host, 16 cores there):
# the elementwise, matmul and kernel-source files in one, every other file in the other.
A="tests/test_ops_elementwise.py tests/test_ops_matmul.py tests/test_kernel_sources.py"
B=$(ls tests/test_*.py | grep -v -e test_ops_elementwise.py -e test_ops_matmul.py -e test_kernel_sources.py)
timeout 330 python3 -m pytest -q -p no:cacheprovider $A --timeout=120 --tb=short --durations=8 >"$OUT/pytest-a.log" 2>&1 &
PA=$!
timeout 330 python3 -m pytest -q -p no:cacheprovider $B --timeout=120 --tb=short --durations=8 >"$OUT/pytest-b.log" 2>&1
echo "pytest (b) rc=$?" >>"$OUT/env.txt"
wait $PA
echo "pytest (a) rc=$?" >>"$OUT/env.txt"
cat "$OUT/pytest-a.log" "$OUT/pytest-b.log" >"$OUT/pytest.log"
timeout 45 python3 -m pytest -q -p no:cacheprovider tests/test_fuzz.py -k "random and gpu" --fuzz-programs 2000 \
  --timeout=40 --hypothesis-show-statistics >"$OUT/fuzz.log" 2>&1
echo "fuzz rc=$?" >>"$OUT/env.txt"
timeout 150 python3 -m laneflow bench ${BENCH_SUITE:-all} --device gpu --peers torch,jax,cupy --json "$OUT/bench.json" >"$OUT/bench.log" 2>&1
echo "bench rc=$?" >>"$OUT/env.txt"
timeout 40 python3 -m laneflow demo --device gpu --out "$OUT" >"$OUT/demo.log" 2>&1
echo "demo rc=$?" >>"$OUT/env.txt"

echo "== env"; cat "$OUT/env.txt"
echo "== pytest"; grep -E "^FAILED|^ERROR" "$OUT/pytest.log" | sed 's/ - .*//' | head -20
tail -1 "$OUT/pytest-a.log"; tail -1 "$OUT/pytest-b.log"
echo "== fuzz"; grep -E "passing|failing" "$OUT/fuzz.log"; tail -1 "$OUT/fuzz.log"
echo "== demo"; tail -14 "$OUT/demo.log"
