#!/usr/bin/env bash
# Training over NCCL between 2 GPUs gives the losses of one GPU: 3 steps of a 2-block model
# (f32 master weights, batch 2 x 128 tokens, 2 chunks, 1 microbatch), each run's per-step
# losses (--metrics) within 1e-5 of the 1-stage run on GPU 0:
#   one process, two GPUs        --stages 2 --transport nccl
#   one process per GPU, env     RANK/WORLD_SIZE/LOCAL_RANK as torchrun sets them (id by TCP)
#   one process per GPU, mpirun  mpirun -n 2 (id by MPI when this build has MPI); when found
# Exits 77 (CTest's SKIP_RETURN_CODE) with fewer than 2 GPUs. NCCL_* variables are left as
# they are (on machines that need NCCL_NVLS_ENABLE=0, keep it exported).
# usage: train_2gpus.sh STATEFLOW [MPIEXEC]
set -uo pipefail
here=$(dirname "$0")
source "$here/common.sh"
stateflow=$1 mpiexec=${2:-}
require_gpus 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(train --device cuda --dtype f32 --config "$here/gpu_2_blocks.json" --steps 3 --batch 2 --seq-len 128
  --chunks 2 --microbatches 1 --log-every 1 --timeout 60)
failures=0

out=$(timeout 120 "$stateflow" "${args[@]}" --stages 1 --transport local --metrics "$work/ref.csv" 2>&1)
if [[ $? -ne 0 || ! -s $work/ref.csv ]]; then
  echo "FAIL reference run on one GPU"
  echo "$out"
  exit 1
fi

out=$(timeout 120 "$stateflow" "${args[@]}" --stages 2 --transport nccl --metrics "$work/one.csv" 2>&1)
check "one process, 2 GPUs" "$work/one.csv" $? "$out"

port=$((20000 + RANDOM % 20000))
pids=()
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 120 "$stateflow" "${args[@]}" \
    --stages 2 --transport nccl --metrics "$work/env$r.csv" >"$work/env$r.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
grep -q 'from torchrun' "$work/env1.log" || { echo "FAIL rank 1 did not say it took its rank from torchrun's variables"; failures=$((failures + 1)); }
check "2 processes (torchrun-style environment, TCP rendezvous)" "$work/env0.csv" $rc "$(cat "$work"/env*.log)"

if [[ -n $mpiexec ]] || mpiexec=$(command -v mpirun); then
  out=$(OMPI_MCA_btl_vader_single_copy_mechanism=none timeout 120 "$mpiexec" --allow-run-as-root --oversubscribe -n 2 \
    "$stateflow" "${args[@]}" --stages 2 --transport nccl --metrics "$work/mpi.csv" 2>&1)
  rc=$?
  grep -q 'from Open MPI' <<<"$out" || { echo "FAIL mpirun ranks did not say they took their rank from Open MPI"; failures=$((failures + 1)); }
  check "mpirun -n 2" "$work/mpi.csv" $rc "$out"
else
  echo "skip mpirun -n 2: no mpirun on this machine"
fi
exit $((failures > 0))
