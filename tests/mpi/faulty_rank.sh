#!/usr/bin/env bash
# A 2-stage MPI training run whose rank 1 is killed (SIGKILL) or stopped (SIGSTOP) once
# training is under way. The job must end non-zero within a bound (timeout's 124 = a hang),
# saying what went wrong: for a killed rank Open MPI's report (or our timeout), for a stopped
# rank our timeout error from stage 0. No process may be left behind.
# usage: faulty_rank.sh kill|stop STATEFLOW MPIEXEC
set -uo pipefail
here=$(dirname "$0")
source "$here/common.sh"
mode=$1 stateflow=$2 mpiexec=$3
bound_s=60
case $mode in
  kill) signal=KILL timeout_s=30 expect='exited on signal 9|stage 0 waited 30 s' ;;
  stop) signal=STOP timeout_s=3 expect='error: stage 0 waited 3 s .*which stalled or died' ;;
  *) echo "usage: $0 kill|stop STATEFLOW MPIEXEC" >&2; exit 2 ;;
esac
tmp=$(mktemp -d)
victim=""
alive() { [[ -n $1 ]] && ps -o stat= -p "$1" 2>/dev/null | grep -qv '^Z'; }  # zombies count as gone
cleanup() {
  if alive "$victim"; then kill -CONT "$victim"; kill -KILL "$victim"; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL ($mode): $*"; echo "--- job output:"; cat "$tmp/log"; exit 1; }

timeout "$bound_s" "$mpiexec" "${MPI_FLAGS[@]}" -n 2 bash "$here/rank_wrapper.sh" "$tmp/rank1.pid" \
  "$stateflow" train --transport mpi --stages 2 --steps 1000000 --log-every 1 --timeout "$timeout_s" \
  >"$tmp/log" 2>&1 &
job=$!
# Strike once rank 0 has logged two steps: both ranks are then past start-up and mid-run.
for _ in $(seq 300); do
  grep -q '^step *2/' "$tmp/log" && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
grep -q '^step *2/' "$tmp/log" || fail "training did not reach step 2"
victim=$(cat "$tmp/rank1.pid")
kill -"$signal" "$victim"
struck=$(now)
wait "$job"
rc=$?
took=$(seconds_since "$struck")

[[ $rc -ne 124 ]] || fail "the job hung: still running ${bound_s} s after launch"
[[ $rc -ne 0 ]] || fail "the job exited 0 although rank 1 was sent SIG$signal"
grep -Eq "$expect" "$tmp/log" || fail "the output does not say what went wrong (want /$expect/)"
sleep 0.5  # let mpirun's kill of the ranks land before looking for leftovers
if alive "$victim"; then fail "rank 1 (pid $victim) was left behind after the job ended"; fi
echo "ok ($mode): rank 1 got SIG$signal, job exited $rc after $took s, reporting:"
grep -E "$expect" "$tmp/log" | sed 's/^/    /'
