#!/usr/bin/env bash
# Data parallelism over NCCL (one process per GPU, stage groups split from the world's
# communicator) gives the losses of one GPU on the whole batch: 3 steps of a 2-block model,
# global batch 2 x 128 tokens, one sequence per microbatch everywhere (so each replica runs
# exactly one of the single GPU's microbatches), per-step losses (--metrics) within 1e-5:
#   1 stage x 2 replicas, mpirun -n 2                       (2 GPUs; when mpirun is found)
#   1 stage x 2 replicas, torchrun-style environment (TCP)  (2 GPUs)
#   2 stages x 2 replicas, mpirun -n 4                      (4 GPUs; when mpirun is found)
# Each run must print the process grid. Exits 77 (CTest's SKIP_RETURN_CODE) with fewer than 2
# GPUs; says which runs it skipped for want of GPUs or mpirun. NCCL_* variables are left as
# they are (on machines that need NCCL_NVLS_ENABLE=0, keep it exported).
# usage: data_parallel.sh STATEFLOW [MPIEXEC]
set -uo pipefail
here=$(dirname "$0")
source "$here/common.sh"
stateflow=$1 mpiexec=${2:-}
require_gpus 2
[[ -n $mpiexec ]] || mpiexec=$(command -v mpirun) || mpiexec=""
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(train --device cuda --dtype f32 --config "$here/gpu_2_blocks.json" --steps 3 --batch 2 --seq-len 128
  --chunks 2 --log-every 1 --timeout 60)
failures=0

out=$(timeout 120 "$stateflow" "${args[@]}" --stages 1 --microbatches 2 --transport local --metrics "$work/ref.csv" 2>&1)
if [[ $? -ne 0 || ! -s $work/ref.csv ]]; then
  echo "FAIL reference run on one GPU"
  echo "$out"
  exit 1
fi

mpi() {  # ranks, metrics file, more arguments
  local n=$1 metrics=$2
  shift 2
  OMPI_MCA_btl_vader_single_copy_mechanism=none timeout 120 "$mpiexec" --allow-run-as-root --oversubscribe -n "$n" \
    "$stateflow" "${args[@]}" --transport nccl --microbatches 1 --metrics "$metrics" "$@" 2>&1
}

if [[ -n $mpiexec ]]; then
  out=$(mpi 2 "$work/mpi2.csv" --stages 1 --data-parallel 2)
  check "1 stage x 2 replicas, mpirun -n 2" "$work/mpi2.csv" $? "$out" "process grid"
else
  echo "skip the mpirun runs: no mpirun on this machine"
fi

port=$((20000 + RANDOM % 20000))
pids=()
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 120 "$stateflow" "${args[@]}" \
    --stages 1 --data-parallel 2 --microbatches 1 --transport nccl --metrics "$work/env$r.csv" >"$work/env$r.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
check "1 stage x 2 replicas, torchrun-style environment" "$work/env0.csv" $rc "$(cat "$work"/env*.log)" "process grid"

if ((gpus < 4)); then
  echo "skip 2 stages x 2 replicas: needs 4 GPUs, found $gpus"
elif [[ -n $mpiexec ]]; then
  out=$(mpi 4 "$work/mpi4.csv" --stages 2 --data-parallel 2)
  check "2 stages x 2 replicas, mpirun -n 4" "$work/mpi4.csv" $? "$out" "process grid"
fi
exit $((failures > 0))
