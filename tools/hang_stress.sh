#!/usr/bin/env bash
# Loop test files in several processes side by side on a GPU machine, to catch a hang that the suite shows
# only now and then (each run under tools/hang_diag.py: a test past HANG_DIAG_S seconds prints every CUDA
# stream's state; pytest-timeout ends it at 120 s). Kept: the log of every run that did not pass.
#   PROCS (default 6) processes for SECONDS_EACH seconds (default 220) each; FILES (default the compile tests).
# On 2026-12-05 (H100) this found the graph-upload hang: 19 of ~150 runs failed with cuGraphUpload on the
# capture lane, none of 174 without it. Logs and summary.txt go to $OUT (default ./hang-stress-out).
set -u
OUT=${OUT:-$PWD/hang-stress-out}
mkdir -p "$OUT"
FILES=${FILES:-tests/test_compile.py tests/test_compile_graph.py}
export HANG_DIAG_S=${HANG_DIAG_S:-40}
for k in $(seq 1 "${PROCS:-6}"); do
  (end=$((SECONDS + ${SECONDS_EACH:-220})); n=0
   while [ $SECONDS -lt $end ]; do
     n=$((n + 1))
     PYTHONPATH=${PYTHONPATH:-}:$PWD/tools timeout 150 python3 -m pytest -q -p no:cacheprovider -p hang_diag $FILES \
       -m "not alone" --timeout=120 --timeout-method=thread --tb=short >"$OUT/stress-$k-$n.log" 2>&1
     rc=$?; echo "process $k run $n rc=$rc $(tail -n 1 "$OUT/stress-$k-$n.log" | cut -c1-80)" >>"$OUT/summary.txt"
     if [ $rc = 0 ]; then rm -f "$OUT/stress-$k-$n.log"; fi
   done) &
done
wait
echo "runs: $(grep -c rc= "$OUT/summary.txt") failed: $(grep -vc 'rc=0' "$OUT/summary.txt") with a stream dump: $(cat "$OUT"/stress-*.log 2>/dev/null | grep -c 'hang_diag:')"
