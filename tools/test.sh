#!/usr/bin/env bash
# Builds stateflow and runs every test (CTest + GoogleTest). GPU tests skip visibly without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
# In CI (no GPU) the CUDA code only has to compile: one target architecture is enough.
cuda_args=()
[[ -n ${CI:-} ]] && cuda_args=(-DCMAKE_CUDA_ARCHITECTURES=90a-real)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_args[@]}" >/dev/null
cmake --build build -j "$(nproc)"
ctest --test-dir build --output-on-failure -j "$(nproc)"
