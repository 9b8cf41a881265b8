#!/usr/bin/env bash
# Builds stateflow and runs every test (CTest + GoogleTest). GPU tests skip visibly without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)"
ctest --test-dir build --output-on-failure -j "$(nproc)"
