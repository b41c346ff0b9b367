#!/usr/bin/env bash
# The measurements still owed on a GPU (docs/cuda-notes.md, "Open / next"), in one device call of
# under 10 minutes (the timeouts below, loops counted, add up to 570 s), after `bash tools/gpu_full.sh` has passed:
#   - fusion on the GPU: bench dispatch and bench kernels (their "laneflow eager, fused" row turns fusion
#     on for its runs: issue 3's 8 us/op target; the plain rows stay unfused), and the fusion tests;
#   - the sticky lane policy against the greedy one: the demo both ways;
#   - bench experts and replay (issues 3 and 5) and bench handles (issue 4).
# Logs and JSON go to $OUT (default ./gpu-bench-out); a short summary is printed last.
set -u
OUT=${OUT:-$PWD/gpu-bench-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export LANEFLOW_KERNEL_CACHE=${LANEFLOW_KERNEL_CACHE:-/tmp/laneflow-kcache-$(id -u)}
PEERS=${PEERS:-torch}

timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_fusion.py tests/test_grouping.py -k gpu \
  --timeout=60 >"$OUT/fusion-tests.log" 2>&1
echo "fusion tests rc=$?" >"$OUT/rc.txt"
for suite in dispatch kernels; do
  timeout 75 python3 -m laneflow bench $suite --device gpu --peers "$PEERS" \
    --json "$OUT/$suite-fused.json" >"$OUT/$suite-fused.log" 2>&1
  echo "bench $suite rc=$?" >>"$OUT/rc.txt"
done
for p in greedy sticky; do
  LANEFLOW_LANE_POLICY=$p timeout 40 python3 -m laneflow demo --device gpu --out "$OUT/demo-$p" >"$OUT/demo-$p.log" 2>&1
  echo "demo ($p) rc=$?" >>"$OUT/rc.txt"
done
timeout 100 python3 -m laneflow bench experts --device gpu --peers "$PEERS" --json "$OUT/experts.json" \
  >"$OUT/experts.log" 2>&1
echo "bench experts rc=$?" >>"$OUT/rc.txt"
timeout 60 python3 -m laneflow bench replay --device gpu --json "$OUT/replay.json" >"$OUT/replay.log" 2>&1
echo "bench replay rc=$?" >>"$OUT/rc.txt"
timeout 120 python3 -m laneflow bench handles --device gpu --json "$OUT/handles.json" >"$OUT/handles.log" 2>&1
echo "bench handles rc=$?" >>"$OUT/rc.txt"

echo "== rc"; cat "$OUT/rc.txt"
echo "== fusion tests"; grep -E "^FAILED|passed|failed" "$OUT/fusion-tests.log" | head -12
echo "== dispatch / kernels (fused row vs eager)"
cat "$OUT"/dispatch-fused.log "$OUT"/kernels-fused.log | grep -E "^│ laneflow (eager|compiled)|^(dispatch|kernels):" | cut -c1-110
for p in greedy sticky; do echo "== demo $p"; grep -E "^│ (eager|compiled)" "$OUT/demo-$p.log"; done
echo "== experts"; grep -E "^│ (laneflow|torch (bmm|graph|eager))|^experts" "$OUT/experts.log" | cut -c1-110
echo "== replay"; grep -E "^│ laneflow|^replay" "$OUT/replay.log" | cut -c1-110
echo "== handles"; tail -25 "$OUT/handles.log" | cut -c1-140
