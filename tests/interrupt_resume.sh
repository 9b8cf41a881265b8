#!/usr/bin/env bash
# SIGINT, then SIGTERM, during `stateflow train` each stop the run after the step in progress
# with a checkpoint and exit code 130 / 143, and `--resume` from it continues to the same
# losses as an unbroken run (a constant learning rate, so --steps may change on resume).
# Usage: interrupt_resume.sh path/to/stateflow
set -euo pipefail
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAILED: $*"; for f in "$dir"/*.log; do echo "--- $f"; tail -20 "$f"; done; exit 1; }
common=(--preset tiny --batch 4 --seq-len 32 --stages 2 --chunks 2 --recall-pairs 4 --recall-queries 4
        --lr 1e-3 --min-lr 1e-3 --warmup 0 --log-every 1)

# Starts a long run (fresh or resumed) in the background, waits until it has printed a step
# line past `after`, sends `signal`, and checks the exit code and the checkpoint it reports.
# Prints the step it stopped after.
interrupt() {
  local signal=$1 want_rc=$2 after=$3 log=$4; shift 4
  "$bin" train "$@" >"$log" 2>&1 &
  local pid=$! i
  for i in $(seq 1 400); do
    (( $(grep -c '^step' "$log" || true) > after )) && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  kill -"$signal" "$pid" 2>/dev/null || fail "the run ended before $signal"
  local rc=0
  wait "$pid" || rc=$?
  [[ $rc == "$want_rc" ]] || fail "$signal: expected exit $want_rc, got $rc"
  local step
  step=$(sed -n "s/^stopped by SIG$signal after step \([0-9]*\) of .*/\1/p" "$log")
  [[ -n $step ]] || fail "no 'stopped by SIG$signal' line"
  [[ -f $dir/ck/step-$(printf %06d "$step")/manifest.json ]] || fail "no checkpoint at step $step"
  echo "$step"
}

first=$(interrupt INT 130 2 "$dir/first.log" "${common[@]}" --steps 100000 --save-dir "$dir/ck" --save-every 1000)
second=$(interrupt TERM 143 $((first + 2)) "$dir/second.log" --resume "$dir/ck")
grep -q "resumed at step $first of 100000" "$dir/second.log" || fail "the second run did not resume at step $first"
(( second > first )) || fail "the resumed run made no progress ($first -> $second)"

total=$((second + 2))
"$bin" train --resume "$dir/ck" --steps "$total" >"$dir/resumed.log" 2>&1 || fail "resume to step $total"
"$bin" train "${common[@]}" --steps "$total" >"$dir/unbroken.log" 2>&1 || fail "unbroken run of $total steps"
last_steps() { grep '^step' "$1" | tail -2 | sed 's/  [0-9]* tok\/s.*//'; }  # loss, acc, |g|, lr
diff <(last_steps "$dir/resumed.log") <(last_steps "$dir/unbroken.log") || fail "resumed and unbroken runs differ"
echo "SIGINT after step $first, SIGTERM after step $second, resumed to step $total: same losses as an unbroken run"
