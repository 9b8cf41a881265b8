#!/usr/bin/env bash
# Kill-and-resume soak: a training run (float64, a 3-block tiny model, a checkpoint every step)
# is killed again and again, with SIGKILL or SIGTERM at seeded random points (after a random
# number of steps, then a random few milliseconds, so that many kills land while a checkpoint
# is being written), and each time resumed from its newest complete checkpoint, until it ends.
#   chain A keeps the shape (P=2, N=2, M=2): its final weights and AdamW moments must be
#           bitwise those of an uninterrupted run;
#   chain B resumes under a random P, N, M each time: equal to rounding (float64: measured
#           ~5e-10 relative after 150 steps, where one lost or repeated AdamW
#           update moves weights by up to lr = 3e-3 each).
# After every kill, every step directory with a manifest must read back and pass all checks
# (checkpoint_check verify): no checkpoint is ever left half-written or unreadable.
# Usage: kill_resume_soak.sh path/to/stateflow path/to/checkpoint_check [kills per chain] [seed]
# The default 40 kills per chain take about a minute on 2 cores (several times that under
# sanitizers: CMake gives them fewer).
set -euo pipefail
bin=$1 check=$2 kills=${3:-40} seed=${4:-${SOAK_SEED:-16}}
RANDOM=$seed
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAILED (seed $seed): $*"; for f in "$dir"/*.log; do echo "--- $f"; tail -5 "$f"; done; exit 1; }
echo '{"preset": "tiny", "pattern": "GGG"}' >"$dir/model.json"
steps=150
mid_save=0  # kills that left an incomplete step directory behind
common=(--config "$dir/model.json" --dtype f64 --batch 4 --seq-len 32 --recall-pairs 4 --recall-queries 4
        --lr 3e-3 --min-lr 3e-4 --warmup 5 --steps "$steps" --log-every 1 --save-every 1 --keep 2)
shapes=("--stages 2 --chunks 2 --microbatches 2" "--stages 1 --chunks 1 --microbatches 1"
        "--stages 3 --chunks 3 --microbatches 4" "--stages 2 --chunks 5 --microbatches 1"
        "--stages 3 --chunk-lengths 1,30,1 --microbatches 2")

# Runs one segment of a chain in the background and kills it after a random number of
# steps (then 0-29 ms more) with a random signal. Sets `ended` when the run finished first.
segment() {
  local chain=$1 round=$2; shift 2
  local log="$dir/$chain.$round.log" signal want after pause rc=0
  "$bin" train "$@" >"$log" 2>&1 &
  local pid=$!
  after=$((1 + RANDOM % 5)) pause=$((RANDOM % 30))
  if ((RANDOM % 2)); then signal=KILL want=137; else signal=TERM want=143; fi
  for _ in $(seq 1 600); do
    (($(grep -c '^step' "$log" || true) >= after)) && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.02
  done
  sleep "0.0$(printf %02d "$pause")"
  kill -"$signal" "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || rc=$?  # (no "Killed" line from the shell)
  if ((rc == 0)); then
    ended=1
  elif ((rc != want)); then
    fail "$chain round $round: SIG$signal gave exit $rc, expected $want"
  elif [[ $signal == TERM ]] && ! grep -q "stopped by SIGTERM" "$log"; then
    fail "$chain round $round: no 'stopped by SIGTERM' line"
  fi
  local found=""
  if [[ -d $dir/$chain ]]; then
    found=$("$check" verify "$dir/$chain" 2>"$dir/check.err") ||
      grep -q "no complete checkpoint" "$dir/check.err" || fail "$chain round $round: $(cat "$dir/check.err")"
    [[ $found == *", 0 incomplete" || -z $found ]] || mid_save=$((mid_save + 1))
  fi
  echo "  $chain round $round: SIG$signal after $after step(s) + ${pause} ms -> exit $rc; ${found#*: }"
}

# A chain: kills until the run ends or `kills` are spent, then runs to the end unkilled.
chain() {
  local name=$1 reshape=$2 round shape
  ended=0
  for ((round = 1; round <= kills && !ended; round++)); do
    shape=${shapes[0]}
    ((reshape)) && shape=${shapes[RANDOM % ${#shapes[@]}]}
    # shellcheck disable=SC2086
    if ls "$dir/$name"/step-*/manifest.json >/dev/null 2>&1; then
      segment "$name" "$round" --resume "$dir/$name" $shape
    else
      segment "$name" "$round" "${common[@]}" $shape --save-dir "$dir/$name"
    fi
  done
  if ((!ended)); then
    "$bin" train --resume "$dir/$name" ${shapes[0]} >"$dir/$name.end.log" 2>&1 || fail "$name: the last resume failed"
  fi
  "$check" verify "$dir/$name" >/dev/null || fail "$name: the final checkpoints do not verify"
}

final=$(printf 'step-%06d' "$steps")
# shellcheck disable=SC2086
"$bin" train "${common[@]}" ${shapes[0]} --save-dir "$dir/unbroken" >"$dir/unbroken.log" 2>&1 || fail "unbroken run"
echo "chain A: resumed under the same shape"
chain A 0
"$check" compare "$dir/A/$final" "$dir/unbroken/$final" 0 || fail "chain A differs from the unbroken run"
echo "chain B: resumed under random shapes"
chain B 1
"$check" compare "$dir/B/$final" "$dir/unbroken/$final" 1e-6 || fail "chain B differs from the unbroken run"
echo "soak passed (seed $seed): $mid_save kill(s) cut a checkpoint short, and every complete one verified"
