#!/usr/bin/env bash
# CI's sanitizer and fuzz jobs, each build in its own directory:
#   build-asan  clang, AddressSanitizer + UndefinedBehaviorSanitizer: the whole CTest suite,
#               then each libFuzzer harness in fuzz/ for FUZZ_SECONDS (default 20) from its
#               seed corpus; a crash leaves its input as build-asan/fuzz-<target>-crash-*
#               (add it under tests/fuzz_regressions/<target>/ once fixed)
#   build-tsan  ThreadSanitizer: the threaded pipeline engine's tests (Pipeline*)
# Both at -O1 (quick to compile, still fast enough to run) and with assertions on.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
fuzz_seconds=${FUZZ_SECONDS:-20}

cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS=-O1 -DCMAKE_CXX_COMPILER=clang++ \
  -DSTATEFLOW_SANITIZE=address,undefined -DSTATEFLOW_FUZZ=ON -DSTATEFLOW_MPI=OFF -DSTATEFLOW_CUDA=OFF >/dev/null
cmake --build build-asan -j "$jobs"
ctest --test-dir build-asan --output-on-failure -j "$jobs"

for target in safetensors model_config schedule_text; do
  grown=$(mktemp -d)  # new corpus entries go here, not into the repository
  log=build-asan/fuzz-$target.log
  if ! ./build-asan/fuzz_"$target" -max_total_time="$fuzz_seconds" -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix=build-asan/fuzz-"$target"- "$grown" fuzz/corpus/"$target" >"$log" 2>&1; then
    tail -40 "$log"
    echo "fuzz_$target found a bug; the input is build-asan/fuzz-$target-*"
    exit 1
  fi
  rm -rf "$grown"
  echo "fuzz_$target: $(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "$log"), no crash"
done

cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS=-O1 -DSTATEFLOW_SANITIZE=thread \
  -DSTATEFLOW_MPI=OFF -DSTATEFLOW_CUDA=OFF -DSTATEFLOW_TEST_FILTER='test_pipeline|sanitizer_options' >/dev/null
cmake --build build-tsan -j "$jobs" --target stateflow_tests
# One BLAS thread: OpenBLAS's own (uninstrumented) worker handoffs would read as races.
OPENBLAS_NUM_THREADS=1 ./build-tsan/stateflow_tests --gtest_filter='Pipeline*'
