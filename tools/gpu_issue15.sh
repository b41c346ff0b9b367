#!/usr/bin/env bash
# Issue 15's measurements on a GPU machine, in one device call (steps 1-5 took 2 minutes on the H200), after
# tools/gpu_full.sh has passed: each figure with its peer from the same process where the bench has one.
#   1. bench gpt2 --peers torch,jax (rows taking turns): the cache-hit target (eager lf.nn vs compiled and
#      torch graph), the first-call target (uncached vs torch eager); the eager rows' notes count
#      tape replays and say why a step was not taped (tape_last_failure)
#   2. tools/probe_tape.py, B=1 and B=8: the tape on against paused in one process (build / eval split),
#      with cProfile of the evaluations at B=1
#   3. tools/profile_gpt2.py --nn with the tape on and off (one process each): the split and the plan
#      cache's counters (tape_last_failure among them)
#   4. tools/profile_chain.py: the uncached per-command cost (a tiny add chain, fusion off)
#   5. bench dispatch --peers torch: the uncached per-command target against torch eager
#   6. tools/probe_driver_calls.py --part chain, the C shim against LANEFLOW_CSHIM=0, two rounds taking
#      turns (one process each: the host drifts between processes)
#   7. bench gpt2 --order sequential (SEQ=1, the default; SEQ=0 skips it): the same rows one at a time,
#      against step 1's rows taking turns
#   8. tools/probe_tape.py --maker, B=1: the tape's node maker in C against the Python steps, in one process
#   9. tools/probe_tape.py --csteps, B=1: the steps in C against Python steps with the C node maker
#  10. tools/probe_hit_timeline.py, B=1, 1 and 4 lanes: a hit's speculated launch, build, submit and return
#      on one timeline, and the compiled call's device time (is the hit host- or launch-bound?)
#  11. tools/probe_chain_floor.py: the uncached add chain's wall, host and GPU time per add, laneflow and
#      torch in one process (is the per-command target bound by the host or the GPU? 2026-12-05: the host;
#      the GPU needs about 2 us a stream-launched tiny kernel)
#  12. tools/profile_native.py under py-spy --native (PYSPY: its path; skipped where there is none), the
#      chain and the mixed chain: where an uncached command's host time goes, driver and C modules named
# Logs go to $OUT (default ./gpu-issue15-out); a short table is printed last. REPEAT (default 40) sets
# bench gpt2's repeats.
set -u
OUT=${OUT:-$PWD/gpu-issue15-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
rev=${REV:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}  # (REV=...: the device's copy may lag)
echo "# $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%F), $rev" >"$OUT/env.txt"

timeout 300 python3 -m laneflow bench gpt2 --device gpu --peers torch,jax --repeat "${REPEAT:-40}" \
  >"$OUT/bench-gpt2.log" 2>&1
echo "bench gpt2 rc=$?" >>"$OUT/env.txt"
for b in 1 8; do
  extra=""; [ "$b" = 1 ] && extra="--profile"
  timeout 120 python3 tools/probe_tape.py --batch $b --rounds 4 --steps 15 $extra >"$OUT/probe-tape-b$b.log" 2>&1
  echo "probe_tape B=$b rc=$?" >>"$OUT/env.txt"
done
for t in 1 0; do
  LANEFLOW_TAPE=$t timeout 90 python3 tools/profile_gpt2.py --nn --steps 20 >"$OUT/profile-gpt2-tape$t.log" 2>&1
  echo "profile_gpt2 tape=$t rc=$?" >>"$OUT/env.txt"
done
timeout 60 python3 tools/profile_chain.py gpu >"$OUT/profile-chain.log" 2>&1
echo "profile_chain rc=$?" >>"$OUT/env.txt"
timeout 150 python3 -m laneflow bench dispatch --device gpu --peers torch >"$OUT/bench-dispatch.log" 2>&1
echo "bench dispatch rc=$?" >>"$OUT/env.txt"
for i in 1 2; do
  for c in 1 0; do
    LANEFLOW_CSHIM=$c timeout 60 python3 tools/probe_driver_calls.py --part chain --n 20000 \
      | sed "s/$/  LANEFLOW_CSHIM=$c round $i/" >>"$OUT/chain-ab.log" 2>&1
  done
done
echo "chain A/B rc=$?" >>"$OUT/env.txt"
if [ "${SEQ:-1}" = 1 ]; then
  timeout 300 python3 -m laneflow bench gpt2 --device gpu --peers torch,jax --repeat "${REPEAT:-40}" \
    --order sequential >"$OUT/bench-gpt2-sequential.log" 2>&1
  echo "bench gpt2 sequential rc=$?" >>"$OUT/env.txt"
fi
timeout 120 python3 tools/probe_tape.py --batch 1 --rounds 4 --steps 15 --maker >"$OUT/probe-tape-maker.log" 2>&1
echo "probe_tape --maker rc=$?" >>"$OUT/env.txt"
timeout 120 python3 tools/probe_tape.py --batch 1 --rounds 4 --steps 15 --csteps >"$OUT/probe-tape-csteps.log" 2>&1
echo "probe_tape --csteps rc=$?" >>"$OUT/env.txt"
for l in 1 4; do
  timeout 90 python3 tools/probe_hit_timeline.py --lanes $l --n 400 >>"$OUT/hit-timeline.log" 2>&1
  echo "probe_hit_timeline lanes=$l rc=$?" >>"$OUT/env.txt"
done
timeout 120 python3 tools/probe_chain_floor.py --rounds 3 >"$OUT/chain-floor.log" 2>&1  # 11.
echo "probe_chain_floor rc=$?" >>"$OUT/env.txt"
PYSPY=${PYSPY:-$(command -v py-spy || echo /tmp/site/bin/py-spy)}  # 12.
if [ -x "$PYSPY" ]; then
  for w in chain mixed; do
    LANEFLOW_NATIVE_KEEP=/tmp/lf-native timeout 60 "$PYSPY" record --native -r 2000 -f raw -o "$OUT/native-$w.raw" \
      -- python3 tools/profile_native.py $w --seconds 12 >"$OUT/native-$w.log" 2>&1
    python3 tools/profile_native.py --summary "$OUT/native-$w.raw" >>"$OUT/native-$w.log" 2>&1
    echo "profile_native $w rc=$?" >>"$OUT/env.txt"
    rm -f "$OUT/native-$w.raw"
  done
fi
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz ./*.log ./*.txt)

echo "== env"; cat "$OUT/env.txt"
echo "== bench gpt2 (B=1 then B=8)"
grep -E "lf.nn eager |lf.nn compiled  |lf.nn eager, uncached|not taped|torch (eager|graph)|jax jit" "$OUT/bench-gpt2.log" \
  | grep -v "^ *│ *│" | cut -c1-110
grep -o "tape_last_failure[^}]*" "$OUT/bench-gpt2.log" | sort | uniq -c | head -5
grep -A4 "^gpt2:" "$OUT/bench-gpt2.log" | tr -s ' ' | tr -d '\n' | grep -o "runs a sample[^┏]*" | cut -c1-400
echo "== probe_tape"; grep -hE "GPT-2|tape (on|off)" "$OUT"/probe-tape-b*.log
echo "== node maker A/B"; grep -hE "GPT-2|maker|Python" "$OUT/probe-tape-maker.log"
echo "== C steps A/B"; grep -hE "GPT-2|steps|Py\+mkr" "$OUT/probe-tape-csteps.log"
echo "== profile_gpt2 split"; grep -h "^split" "$OUT"/profile-gpt2-tape*.log | cut -c1-400
echo "== uncached chain"; grep -hE "per add" "$OUT/profile-chain.log"
echo "== bench dispatch (tiny adds, fusion off; mixed chain)"
grep -E "uncached|torch eager" "$OUT/bench-dispatch.log" | cut -c1-110 | tail -5
echo "== chain, C shim A/B"; cat "$OUT/chain-ab.log"
echo "== hit timeline"; grep -vE "^ *$" "$OUT/hit-timeline.log" | tail -16
echo "== chain floor (us per add: wall, host, GPU)"; tail -3 "$OUT/chain-floor.log"
for w in chain mixed; do [ -f "$OUT/native-$w.log" ] && { echo "== native profile, $w (self)"; grep -A12 "^-- self" "$OUT/native-$w.log"; }; done
if [ -f "$OUT/bench-gpt2-sequential.log" ]; then
  echo "== bench gpt2 --order sequential"
  grep -E "lf.nn eager |lf.nn compiled  |lf.nn eager, uncached|torch (eager|graph)|jax jit" \
    "$OUT/bench-gpt2-sequential.log" | grep -v "^ *│ *│" | cut -c1-110
fi
