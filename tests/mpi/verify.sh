#!/usr/bin/env bash
# Gradients through the MPI pipeline equal one stage, one chunk, in f64 (<= 1e-10):
# `stateflow verify --transport mpi` over P processes, 4-block tiny model, batch 3 x 45
# tokens, M in {1,3} microbatches; for each M one run with N = 1 and one with verify's
# built-in chunkings (N = 2, 3, 4, 8 even, uneven 5,31,9, unaligned 9,35,1, short 1,1,2,41,
# one token per chunk), which also builds one MPI pipeline per chunking in one process.
# Each run must exit 0, print its table once (rank 0 only) and report max_rel_grad_diff <= 1e-10.
# usage: verify.sh STATEFLOW MPIEXEC P
set -uo pipefail
here=$(dirname "$0")
source "$here/common.sh"
stateflow=$1 mpiexec=$2 P=$3
failures=0

check() {  # label, extra verify arguments...
  local label=$1
  shift
  local start out rc diffs
  start=$(now)
  out=$(timeout 60 "$mpiexec" "${MPI_FLAGS[@]}" -n "$P" "$stateflow" verify --transport mpi --stages "$P" \
    --config "$here/tiny_4_blocks.json" --batch 3 --timeout 30 "$@" 2>&1)
  rc=$?
  diffs=$(sed -n 's/^max_rel_grad_diff=//p' <<<"$out")
  if [[ $rc -eq 0 && $(wc -l <<<"$diffs") -eq 1 && -n $diffs ]] &&
    python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) <= 1e-10 else 1)' "$diffs"; then
    echo "ok   P=$P $label: max_rel_grad_diff=$diffs ($(seconds_since "$start") s)"
  else
    echo "FAIL P=$P $label: exit $rc, max_rel_grad_diff lines: '${diffs}' (want one, <= 1e-10)"
    echo "$out"
    failures=$((failures + 1))
  fi
}

for M in 1 3; do
  check "M=$M N=1" --microbatches "$M" --chunks 1
  check "M=$M built-in chunkings" --microbatches "$M"
done
exit $((failures > 0))
