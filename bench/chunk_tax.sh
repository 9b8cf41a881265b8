#!/usr/bin/env bash
# The chunk tax of issue 12 and its levers' ablation, on one GPU: gdn-1.3b, one stage, T = 32K,
# B = 1, stateflow at several chunk counts N, each bench a process of its own (the levers are
# read from STATEFLOW_LEVERS_OFF at start, kernels/cuda/levers.h; the untried ones run only where
# STATEFLOW_LEVERS_ON names them, which this sets to all of them unless it is set already):
#   1. every lever on, 2. every lever off (the code before them), both with --breakdown (layer
#      and named-part device times per N: each lever's kernels on and off, side by side)
#   3. with --single LIST: each lever off alone, at those N
# The tax is step(N) / step(first N, 1 by default) of the same process, printed per run. Logs:
# one file per bench in --out.
#
#   usage: bench/chunk_tax.sh [--bin PATH] [--out DIR] [--sweep LIST] [--single LIST]
#            [--levers LIST] [--dry-run]
#   --bin     the stateflow binary (default build-gpu/stateflow)
#   --out     where the logs go (default chunk-tax-logs)
#   --sweep   chunk counts of runs 1 and 2 (default 1,16,32; N = 1 is the baseline)
#   --single  chunk counts of run 3 (default none: no run 3)
#   --levers  the levers (default: all of kernels/cuda/levers.h)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build-gpu/stateflow out=chunk-tax-logs sweep=1,16,32 single= levers= dry=0
while (($#)); do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --sweep) sweep=$2; shift 2 ;;
    --single) single=$2; shift 2 ;;
    --levers) levers=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "chunk_tax.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $dry == 1 || -x $bin ]] || { echo "chunk_tax.sh: no binary at '$bin'; build it or pass --bin" >&2; exit 2; }
mkdir -p "$out"
# Default: every lever kernels/cuda/levers.h names (kLeverNames).
[[ -n $levers ]] || levers=$(sed -n '/kLeverNames\[\] = {/,/};/p' src/kernels/cuda/levers.h | tr -d '\n' |
                             sed 's/.*{\(.*\)};.*/\1/' | tr -d '" ')
# Untried levers (kernels/cuda/levers.h) run only where STATEFLOW_LEVERS_ON names them: every run
# here names them all (unless the caller set it), so that "all on" is on for them too.
untried=$(sed -n 's/.*kUntriedLevers\[\] = {\(.*\)};.*/\1/p' src/kernels/cuda/levers.h | tr -d '" ')
export STATEFLOW_LEVERS_ON=${STATEFLOW_LEVERS_ON-$untried}
common=(bench --device cuda --dtype f32 --preset gdn-1.3b --stages 1 --seq-len 32768 --batch 1 --microbatches 1
        --schedules stateflow --warmup-steps 1 --steps 2)

run() {  # run NAME LEVERS_OFF ARGS...
  local name=$1 off=$2; shift 2
  echo "== $name: STATEFLOW_LEVERS_ON=$STATEFLOW_LEVERS_ON STATEFLOW_LEVERS_OFF=$off $bin ${common[*]} $*"
  ((dry)) && return 0
  STATEFLOW_LEVERS_OFF=$off "$bin" "${common[@]}" "$@" >"$out/$name.log" 2>&1 || echo "chunk_tax.sh: $name failed"
  # N, step seconds and the tax step(N) / step(first N) of this process
  awk '/^stateflow +[0-9]/ { if (!base) base = $5; printf "  N=%-3s step %s s  tax %.3f\n", $2, $5, $5 / base }' \
    "$out/$name.log"
}

run all-on "" --chunk-sweep "$sweep" --breakdown
run all-off "$levers" --chunk-sweep "$sweep" --breakdown
[[ -n $single ]] || exit 0
IFS=, read -ra each <<<"$levers"
for lever in "${each[@]}"; do run "$lever-off" "$lever" --chunk-sweep "$single"; done
