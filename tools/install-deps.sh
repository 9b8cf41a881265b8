#!/usr/bin/env bash
# Installs the Debian packages stateflow builds with (skips the ones already present).
set -euo pipefail
pkgs=(cmake ninja-build g++ libopenblas-dev libcli11-dev nlohmann-json3-dev libgtest-dev libopenmpi-dev openmpi-bin python3-numpy
      python3-matplotlib  # bench/plot_losses.py draws the loss curves of docs/benchmarks.md
      clang libclang-rt-dev)  # clang + its runtimes: sanitizer and libFuzzer builds (tools/sanitize.sh)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  sudo_cmd=""; [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi
