#!/usr/bin/env bash
# Same training, same losses: trains one model from one seed under `1f1b` (whole sequences)
# and under `stateflow` (chunked), on a text file read as bytes, and overlays the two loss
# curves in one SVG, printing their largest difference.
#   usage: bench/loss_curves.sh [STATEFLOW_BINARY] [TEXT_FILE] [OUT_SVG] [extra train args...]
# Defaults: build/stateflow, the repository's own documentation as the corpus, docs/loss_curves.svg.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/stateflow}
corpus=${2:-}
out=${3:-docs/loss_curves.svg}
shift $(( $# < 3 ? $# : 3 ))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ -z $corpus ]]; then
  corpus=$work/corpus.txt
  cat README.md docs/*.md > "$corpus"
fi
echo '{"preset": "small", "vocab_size": 256}' > "$work/model.json"
common=(--config "$work/model.json" --data text --data-path "$corpus" --seq-len 128 --batch 8 --steps 200
        --stages 2 --microbatches 4 --lr 2e-3 --warmup 10 --log-every 50 "$@")
"$bin" train "${common[@]}" --schedule 1f1b --chunks 1 --metrics "$work/1f1b.csv"
"$bin" train "${common[@]}" --schedule stateflow --chunks 4 --metrics "$work/stateflow.csv"
python3 bench/plot_losses.py "$out" "1f1b=$work/1f1b.csv" "stateflow (N=4)=$work/stateflow.csv"
echo "wrote $out"
