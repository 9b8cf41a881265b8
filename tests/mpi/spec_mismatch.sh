#!/usr/bin/env bash
# A message that is not what the receiver expects fails the run with an error naming both,
# instead of being misread: an MPMD launch where rank 0 runs `verify --batch 3` and rank 1
# `verify --batch 6`, so stage 1 expects twice the rows stage 0 sends. The job must exit
# non-zero, promptly, with "arrived as ... but the receiver expects" in its output.
# usage: spec_mismatch.sh STATEFLOW MPIEXEC
set -uo pipefail
here=$(dirname "$0")
source "$here/common.sh"
stateflow=$1 mpiexec=$2
args=(verify --transport mpi --stages 2 --config "$here/tiny_4_blocks.json" --chunks 1 --timeout 30)
start=$(now)
out=$(timeout 60 "$mpiexec" "${MPI_FLAGS[@]}" -n 1 "$stateflow" "${args[@]}" --batch 3 : \
  -n 1 "$stateflow" "${args[@]}" --batch 6 2>&1)
rc=$?
if [[ $rc -ne 0 && $rc -ne 124 ]] && grep -q "arrived as .* but the receiver expects" <<<"$out"; then
  echo "ok   mismatching message refused: exit $rc after $(seconds_since "$start") s"
  grep -m1 "arrived as" <<<"$out"
  exit 0
fi
echo "FAIL exit $rc (want non-zero, not a timeout) and an 'arrived as ... but the receiver expects' error"
echo "$out"
exit 1
