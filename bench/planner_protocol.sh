#!/usr/bin/env bash
# The planner's GPU protocol (issue 15) on one GPU, and the cost profiles from which the
# simulator predicts the 2-GPU rows (issue 18):
#   1. hybrid-1.3b, P = 2 with both stages on GPU 0 (--transport local), B = 1, M = 1,
#      --recompute full (one GPU holds both stages), at each T: `bench --chunks auto` runs the
#      planner's choice, equal and balanced chunks at its N, 1f1b and the best of each schedule
#      over the planner's space, each measured beside its predicted step time and peak memory.
#      The planner's memory limit is 130 GiB (--gpu-memory): the H200's 139.8 GiB less what our
#      allocator does not count (CUDA context, cuBLAS workspaces, size-class rounding, cache).
#      The first T profiles the model (cached in OUT/profiles; the later ones reuse it).
#   2. `plan --auto` of each --profile-models model at 32K (profiles it into OUT/profiles):
#      `plan --auto --cost-profile OUT/profiles/costs-MODEL-*.json` then predicts anywhere.
#   With --sm-split, step 1 runs each stage on its own half of GPU 0's SMs (CUDA green contexts):
#   the stages work side by side as on two smaller GPUs (memory bandwidth and L2 shared), so the
#   partition changes the step; the profile is then made on one half.
# Each step's output goes to OUT as it ends (a time-out loses only the run in progress); at the
# end the planned-runs tables are printed together.
#
#   usage: bench/planner_protocol.sh [--bin PATH] [--out DIR] [--seq-lens LIST] [--schedules LIST]
#            [--profile-models LIST] [--steps N] [--sm-split] [--chunk-counts LIST] [--alphas LIST]
#            [--cost-profile FILE] [--dry-run]
#
#   --bin             the stateflow binary (default build-gpu/stateflow, else build/stateflow)
#   --out             where logs, JSON records and profiles go (default planner-protocol/)
#   --seq-lens        hybrid-1.3b's T (default 65536,131072)
#   --schedules       bench's --schedules: stateflow's runs and these baselines (default stateflow,1f1b)
#   --profile-models  presets profiled for predictions (default gdn-1.3b,mamba3-1.3b; "" for none)
#   --steps           timed steps per run, after one warm-up step (default 1)
#   --sm-split        step 1 with bench --sm-split (stages side by side on halves of the SMs)
#   --chunk-counts    the N the planner may choose in step 1 (bench --chunk-counts; default all)
#   --alphas          the partition grid of step 1, every one run (default 0,1)
#   --cost-profile    step 1 plans on this recorded profile instead of profiling (e.g. the half-GPU
#                     one in docs/records/h200-2026-12-01-smsplit/ with --sm-split: saves ~106 s)
#   --dry-run         print the commands, run nothing
set -euo pipefail
cd "$(dirname "$0")/.."

bin="" out=planner-protocol seq_lens=65536,131072 models=gdn-1.3b,mamba3-1.3b schedules=stateflow,1f1b steps=1 dry=0
alphas=0,1 split=() counts=() recorded=()
while (($#)); do
  case $1 in
    --bin) bin=$2; shift ;;
    --out) out=$2; shift ;;
    --seq-lens) seq_lens=$2; shift ;;
    --schedules) schedules=$2; shift ;;
    --profile-models) models=$2; shift ;;
    --steps) steps=$2; shift ;;
    --sm-split) split=(--sm-split) ;;
    --chunk-counts) counts=(--chunk-counts "$2"); shift ;;
    --alphas) alphas=$2; shift ;;
    --cost-profile) recorded=(--cost-profile "$2"); shift ;;
    --dry-run) dry=1 ;;
    *) echo "planner_protocol.sh: unknown option '$1' (see the usage at the top of the script)" >&2; exit 2 ;;
  esac
  shift
done
if [[ -z $bin ]]; then bin=build-gpu/stateflow; [[ -x $bin ]] || bin=build/stateflow; fi
mkdir -p "$out/profiles"

run() {  # run LOG command...: the command's output to LOG (and said first)
  local log=$1; shift
  echo "+ $*" | tee "$log"
  ((dry)) && return 0
  local t0=$SECONDS rc=0
  "$@" >>"$log" 2>&1 || rc=$?
  echo "  (exit $rc, $((SECONDS - t0)) s) -> $log"
}

for T in ${seq_lens//,/ }; do
  run "$out/hybrid-$T.log" "$bin" bench --device cuda --dtype f32 --preset hybrid-1.3b --stages 2 --transport local \
    --batch 1 --microbatches 1 --seq-len "$T" --recompute full --chunks auto --alphas "$alphas" --every-alpha \
    --gpu-memory 130 "${split[@]}" "${counts[@]}" "${recorded[@]}" \
    --schedules "$schedules" --warmup-steps 1 --steps "$steps" --profile-dir "$out/profiles" --json "$out/hybrid-$T.json"
done
for m in ${models//,/ }; do
  run "$out/plan-$m.log" "$bin" plan --auto --device cuda --preset "$m" --stages 2 --batch 1 --seq-len 32768 \
    --profile-dir "$out/profiles" --top 5
done
((dry)) && exit 0
echo "== planned runs (measured beside predicted) =="
for T in ${seq_lens//,/ }; do
  echo "-- hybrid-1.3b, T = $T"
  sed -n '/^planned runs/,/^peak bytes per stage/p' "$out/hybrid-$T.log" | grep -v '^peak bytes' || true
done
