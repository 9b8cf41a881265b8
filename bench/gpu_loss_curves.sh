#!/usr/bin/env bash
# Same losses on the GPU: trains one small GPU model (d_model 256, 4 GDN blocks of 2 heads of
# 128, the shapes the CUDA kernels take) from one seed on the same batches three ways, every
# stage on GPU 0 (--transport local): conventional 1f1b on whole sequences, and stateflow with
# N = 4 and N = 8 chunks. Each run writes its per-step metrics CSV into OUT_DIR; overlay them
# (on any machine) with
#   python3 bench/plot_losses.py docs/gpu_loss_curves.svg 1f1b=OUT_DIR/gpu-1f1b.csv \
#     "stateflow N=4=OUT_DIR/gpu-stateflow-n4.csv" "stateflow N=8=OUT_DIR/gpu-stateflow-n8.csv"
#   usage: bench/gpu_loss_curves.sh STATEFLOW_BINARY OUT_DIR [STEPS (default 200)]
set -euo pipefail
bin=$1 out=$2 steps=${3:-200}
mkdir -p "$out"
echo '{"preset": "small", "d_model": 256, "pattern": "GGGG", "mlp_hidden": 512,
       "gdn": {"heads": 2, "head_dk": 128, "head_dv": 128, "block_size": 64}}' >"$out/gpu-model.json"
common=(--device cuda --transport local --config "$out/gpu-model.json" --stages 2 --microbatches 4 --batch 16
        --seq-len 512 --steps "$steps" --lr 3e-3 --warmup 20 --log-every 50)
"$bin" train "${common[@]}" --schedule 1f1b --chunks 1 --metrics "$out/gpu-1f1b.csv"
for n in 4 8; do
  "$bin" train "${common[@]}" --schedule stateflow --chunks "$n" --metrics "$out/gpu-stateflow-n$n.csv"
done
