#!/usr/bin/env bash
# Predictions, not measurements: issue 18's 2-GPU rows from cost profiles measured on one GPU
# (bench/planner_protocol.sh writes them), priced by `stateflow plan --auto --cost-profile` on
# any machine: one H200 per stage (P = 2, --transport nccl), memory limit --memory-gib per GPU.
# Prints markdown tables:
#   1. gdn-1.3b, T in {32K, 128K, 256K}, B in {1, 2, 8}, M = B: 1f1b and stateflow at each N of
#      the sweep, without and with --recompute full;
#   2. mamba3-1.3b and hybrid-1.3b at 32K and 128K, B in {1, 2}: stateflow with equal chunks and
#      with the planner's partition at its N, and the best of stateflow and of 1f1b, each tuned
#      over the same space (M, recompute, N, alpha);
#   3. the longest T each schedule trains without recomputation (gdn-1.3b, B = 2).
#
#   usage: bench/predict_pp2.sh --profiles DIR [--bin PATH] [--memory-gib G]
set -euo pipefail
cd "$(dirname "$0")/.."
profiles="" bin=build/stateflow gib=130
while (($#)); do
  case $1 in
    --profiles) profiles=$2; shift ;;
    --bin) bin=$2; shift ;;
    --memory-gib) gib=$2; shift ;;
    *) echo "predict_pp2.sh: unknown option '$1' (see the usage at the top of the script)" >&2; exit 2 ;;
  esac
  shift
done
[[ -d $profiles ]] || { echo "predict_pp2.sh: --profiles DIR (the cost profiles of bench/planner_protocol.sh)" >&2; exit 2; }
# The recorded profile that prices a preset: its own, else another model's with its layers
# (a hybrid's prices its GDN-only model); empty when none does.
declare -A profile_for
for m in gdn-1.3b mamba3-1.3b hybrid-1.3b; do
  profile_for[$m]=""
  for f in "$profiles"/costs-"$m"-*.json "$profiles"/costs-*.json; do
    [[ -f $f ]] || continue
    if "$bin" plan --auto --device cuda --preset "$m" --stages 2 --batch 1 --seq-len 32768 --cost-profile "$f" \
         --top 1 >/dev/null 2>&1; then profile_for[$m]=$f; break; fi
  done
  echo "predict_pp2.sh: $m priced by ${profile_for[$m]:-no profile (its rows are left out)}" >&2
done
profile_of() { echo "${profile_for[$1]}"; }
# plan MODEL T B [plan options...]: the ranked table of one space (P = 2, one GPU per stage);
# its error when nothing fits goes to stderr.
plan() {
  local model=$1 T=$2 B=$3; shift 3
  "$bin" plan --auto --device cuda --preset "$model" --stages 2 --batch "$B" --seq-len "$T" --memory-gib "$gib" \
    --cost-profile "$(profile_of "$model")" --top 1000 "$@" || true  # nothing fits: rows marked over the limit
}
# A ranked row as table cells: step, tokens/s, bubble, peak, chunks (or OOM when over the limit).
cells() {
  awk '{ over = ($0 ~ /over the memory limit/);
         printf "%s | %.3f s | %d | %.3f | %s %s%s", $5, $7, $8, $9, $10, $11, over ? " (OOM)" : "" }'
}
first_row() { awk '$1 == 1'; }  # reads to the end: an early exit would fail the pipeline

echo "| T | B | recompute | schedule | N | step | tokens/s | bubble | peak/GPU | x 1f1b |"
echo "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|"
[[ -n $(profile_of gdn-1.3b) ]] && for T in 32768 131072 262144; do
  for B in 1 2 8; do
    for rec in none full; do
      base=$(plan gdn-1.3b "$T" "$B" --schedule 1f1b --microbatches "$B" --recompute "$rec" | first_row)
      base_tps=$(awk '{print $8}' <<<"$base")
      echo "| $T | $B | $rec | 1f1b | $(cells <<<"$base") | 1.000 |"
      for N in 2 4 8 16 32; do
        # Nearly equal chunks of 1024-token multiples, as the measured matrix cut them.
        row=$(plan gdn-1.3b "$T" "$B" --schedule stateflow --microbatches "$B" --recompute "$rec" --chunks "$N" \
          --chunk-multiple 1024 | first_row)
        ratio=$(awk -v b="$base_tps" '{printf "%.3f", $8 / b}' <<<"$row")
        echo "| $T | $B | $rec | stateflow | $(cells <<<"$row") | $ratio |"
      done
    done
  done
done

echo
echo "| model | T | B | run | M | rec | N | alpha | step | tokens/s | bubble | peak/GPU |"
echo "|---|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---:|"
for model in mamba3-1.3b hybrid-1.3b; do
  [[ -n $(profile_of "$model") ]] || continue
  for T in 32768 131072; do
    for B in 1 2; do
      all=$(plan "$model" "$T" "$B")
      # The first match only (no head: its early exit would fail the pipeline under pipefail).
      best=$(awk '$2 == "stateflow" && !/over the memory/ { print; exit }' <<<"$all")
      base=$(awk '$2 == "1f1b" && !/over the memory/ { print; exit }' <<<"$all")
      read -r _ _ M rec N _ <<<"$best"
      equal=$(plan "$model" "$T" "$B" --schedule stateflow --microbatches "$M" --chunks "$N" \
        --recompute "$([[ $rec == full ]] && echo full || echo none)" | awk '$6 == "0.00" { print; exit }')
      for pair in "equal chunks at its N:$equal" "best stateflow (tuned):$best" "best 1f1b (tuned):$base"; do
        r=${pair#*:}
        [[ -n $r ]] || { echo "| $model | $T | $B | ${pair%%:*} | nothing fits | | | | | | | |"; continue; }
        awk -v m="$model" -v T="$T" -v B="$B" -v what="${pair%%:*}" \
          '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s | %.3f s | %d | %.3f | %s %s |\n",
                    m, T, B, what, $3, $4, $5, $6, $7, $8, $9, $10, $11 }' <<<"$r"
      done
    done
  done
done

echo
[[ -n $(profile_of gdn-1.3b) ]] && plan gdn-1.3b 32768 2 --recompute none --longest-seq-len --max-seq-len 4194304
