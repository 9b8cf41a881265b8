#!/usr/bin/env bash
# Data parallelism over MPI, float64, 2 stages x 2 replicas (mpirun -n 4), against one process
# that runs the same 2-stage pipeline on the whole global batch. Each check fails the test:
#  1. verify: gradients, loss and the weights after one AdamW step equal one stage, one chunk on
#     the whole batch (<= 1e-10), for verify's built-in chunkings, 2 microbatches per replica;
#  2. train, 3 steps, about one tensor per gradient bucket: weights and AdamW moments equal the
#     single-process run's (<= 1e-10);
#  3. the same DP run again gives bit-identical tensors (a fixed reduction order);
#  4. resumed under another D (the single run's step 2 under D = 2, the DP run's step 2 under
#     D = 1), the next step equals the uninterrupted runs' (<= 1e-10).
# About 6 s on 2 cores.
# usage: data_parallel.sh STATEFLOW MPIEXEC
set -uo pipefail
here=$(dirname "$0")
source "$here/common.sh"
stateflow=$1 mpiexec=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
report() {  # ok?, label, output
  if [[ $1 == 0 ]]; then echo "ok   $2"; else echo "FAIL $2"; echo "$3"; failures=$((failures + 1)); fi
}
dp() { timeout 90 "$mpiexec" "${MPI_FLAGS[@]}" -n 4 "$stateflow" "$@" --transport mpi --timeout 30 2>&1; }
single() { timeout 90 "$stateflow" "$@" --transport local 2>&1; }
compare() {  # label, step dir A, step dir B, tolerance
  local out
  out=$(python3 "$here/compare_checkpoints.py" "$2" "$3" "$4" 2>&1)
  report $? "$1: $out" "$out"
}

out=$(dp verify --stages 2 --data-parallel 2 --config "$here/tiny_4_blocks.json" --batch 4 --microbatches 2)
rc=$?
diff=$(sed -n 's/^max_rel_grad_diff=//p' <<<"$out")
ok=1
[[ $rc -eq 0 && -n $diff ]] && grep -q "^PASS" <<<"$out" && grep -q "rank 3: stage 1, replica 1" <<<"$out" && ok=0
report $ok "verify P=2 D=2 vs one process on the whole batch: max_rel_grad_diff=$diff, exit $rc" "$out"

train=(train --config "$here/tiny_4_blocks.json" --dtype f64 --stages 2 --microbatches 2 --batch 4 --seq-len 40
       --chunks 3 --recall-pairs 4 --recall-queries 4 --lr 1e-2 --warmup 0 --log-every 1 --save-every 1 --keep 0)
out=$(dp "${train[@]}" --steps 3 --data-parallel 2 --bucket-mb 0.0001 --save-dir "$dir/dp")
report $? "train P=2 D=2, 3 steps (one tensor per bucket)" "$out"
out=$(single "${train[@]}" --steps 3 --save-dir "$dir/single")
report $? "train P=2 in one process, 3 steps" "$out"
compare "DP vs single after 3 steps" "$dir/dp/step-000003" "$dir/single/step-000003" 1e-10
out=$(dp "${train[@]}" --steps 3 --data-parallel 2 --bucket-mb 0.0001 --save-dir "$dir/again")
report $? "train P=2 D=2 again" "$out"
compare "DP run repeated, bit for bit" "$dir/dp/step-000003" "$dir/again/step-000003" 0

out=$(dp train --resume "$dir/single/step-000002" --save-dir "$dir/to_dp")
ok=$?
grep -q "resumed at step 2 of 3" <<<"$out" || ok=1
report $ok "resume the single run's step 2 under D=2" "$out"
compare "resumed under D=2 vs uninterrupted" "$dir/to_dp/step-000003" "$dir/dp/step-000003" 1e-10
out=$(single train --resume "$dir/dp/step-000002" --save-dir "$dir/to_single")
report $? "resume the DP run's step 2 under D=1" "$out"
compare "resumed under D=1 vs uninterrupted" "$dir/to_single/step-000003" "$dir/single/step-000003" 1e-10
exit $((failures > 0))
