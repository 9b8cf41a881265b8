#!/usr/bin/env bash
# On a GPU machine: configure with CUDA (sm_90a + compute_80 PTX), build with ninja, run the CUDA
# tests and then every test through CTest, then the GDN, Mamba-3 and attention kernel benchmarks, the benchmark of
# the other kernels (GEMM ceiling, fused kernels' bandwidth) and the pinned GEMM algorithms' (gemm_bench). cuDNN comes from the nvidia-cudnn
# wheel where the image has it (STATEFLOW_ATTENTION picks the attention). Logs go to $OUT when set (else
# build-gpu/logs); a summary table is printed last.
#   SANITIZE=1  also runs one small GPU test under compute-sanitizer (memcheck, racecheck);
#               SANITIZE=auto (default) does so when the CUDA tests fail
#   BENCH_ARGS  extra arguments for gdn_core_bench (e.g. "--len 32768 --reps 50")
#   MAMBA3_BENCH_ARGS  extra arguments for mamba3_core_bench (e.g. "--len 32768 --rank 1")
#   ATTENTION_BENCH_ARGS  extra arguments for attention_bench (e.g. "--len 32768 --chunk-len 4096")
#   KERNELS_BENCH_ARGS  extra arguments for kernels_bench (e.g. "--tokens 8192 --reps 50")
#   TARGETS     build only these ninja targets (e.g. "stateflow_cuda_tests kernels_bench" for a
#               short lease); steps whose program was not built are skipped
#   STATEFLOW_LEVERS_ON  the untried levers the CUDA tests run with (default: all of them, read from
#               kUntriedLevers in src/kernels/cuda/levers.h: new paths not yet run on a GPU; their
#               tests passing here is what lets them become defaults). The benchmarks run the defaults.
#   GTEST_FILTER  run only these CUDA tests (googletest reads it; e.g. "GdnCoreCuda*:*OpDef*")
#   CTEST=0     skip CTest (the CPU tests also run in CI; the CUDA tests ran just before)
#   CUDA_ARCHS  CMAKE_CUDA_ARCHITECTURES (default "90a-real;80-virtual"; "90a-real" builds faster)
#   PREBUILT=DIR  run the programs in DIR instead of configuring and building (a short lease:
#               build them with the same CUDA toolkit elsewhere, e.g. `cmake -DSTATEFLOW_CUDA=ON
#               -DCMAKE_CUDA_ARCHITECTURES=90a-real`, and carry them); their libraries are
#               found as a build's would be (.deps, the NCCL wheel); CTest is skipped
#   MATRIX=quick  also runs bench/pipeline_matrix.sh --quick (needs 2 GPUs; made by hand, its runs
#               took about 5 min): rows in $LOG/bench-matrix.md, each run's log and JSON in $LOG/matrix/
# Where the Debian dev packages the CPU build needs are missing (a bare GPU image), .deb files
# in .deps/ (apt-get download libgtest-dev libopenblas0-pthread libopenblas-pthread-dev
# libopenblas-dev libgfortran5 libcli11-dev nlohmann-json3-dev) are unpacked and used instead.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=build-gpu
LOG=${OUT:-$BUILD/logs}
mkdir -p "$LOG"
declare -A status

nvidia-smi 2>&1 | tee "$LOG/nvidia-smi.txt"

cmake_args=(-S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS:-90a-real;80-virtual}")
missing=0
for h in gtest/gtest.h CLI/CLI.hpp nlohmann/json.hpp x86_64-linux-gnu/openblas-pthread/cblas.h; do
  [[ -f /usr/include/$h ]] || missing=1
done
if ((missing)) && compgen -G ".deps/*.deb" >/dev/null; then
  root=$PWD/.deps/root
  mkdir -p "$root"
  for f in .deps/*.deb; do dpkg -x "$f" "$root"; done
  lib=$root/usr/lib/x86_64-linux-gnu
  export LD_LIBRARY_PATH=$lib/openblas-pthread:$lib:${LD_LIBRARY_PATH:-}
  cmake_args+=("-DCMAKE_PREFIX_PATH=$root/usr" "-DCBLAS_INCLUDE_DIR=$root/usr/include/x86_64-linux-gnu/openblas-pthread")
  echo "gpu-check: using the packages unpacked from .deps/"
fi

# NCCL: the GPU image here ships it only inside the Python nvidia-nccl wheel, not beside CUDA.
if [[ -z ${NCCL_ROOT:-} && ! -f /usr/include/nccl.h && ! -f /usr/local/cuda/include/nccl.h ]]; then
  NCCL_ROOT=$(python3 -c 'import nvidia.nccl as n; print(n.__path__[0])' 2>/dev/null) && export NCCL_ROOT &&
    echo "gpu-check: NCCL from $NCCL_ROOT"
fi

# cuDNN (the attention's fused kernels): the image ships it in the Python nvidia-cudnn wheel. Its
# headers serve the build where the CUDA tree has none; its lib/ must be on the loader path at run
# time (the library is loaded then; without it attention runs on our kernels and says so).
CUDNN_WHEEL=$(python3 -c 'import nvidia.cudnn as n; print(n.__path__[0])' 2>/dev/null) || CUDNN_WHEEL=
if [[ -n $CUDNN_WHEEL ]]; then
  export LD_LIBRARY_PATH=$CUDNN_WHEEL/lib:${LD_LIBRARY_PATH:-}
  [[ -z ${CUDNN_ROOT:-} && ! -f /usr/local/cuda/include/cudnn_graph.h ]] && export CUDNN_ROOT=$CUDNN_WHEEL
  echo "gpu-check: cuDNN from $CUDNN_WHEEL"
fi

if [[ -n ${PREBUILT:-} ]]; then
  BUILD=$PREBUILT CTEST=0
  [[ -n ${NCCL_ROOT:-} ]] && export LD_LIBRARY_PATH=$NCCL_ROOT/lib:${LD_LIBRARY_PATH:-}
  ls -l "$BUILD" | tee "$LOG/build.log"
  status[build]=$([[ -x $BUILD/stateflow_cuda_tests || -x $BUILD/stateflow ]] && echo ok || echo FAILED)
else
  # shellcheck disable=SC2086
  { cmake "${cmake_args[@]}" && ninja -C "$BUILD" -j "$(nproc)" ${TARGETS:-}; } 2>&1 | tee "$LOG/build.log"
  status[build]=$([[ ${PIPESTATUS[0]} == 0 ]] && echo ok || echo FAILED)
fi

if [[ ${status[build]} == ok && -x $BUILD/stateflow_cuda_tests ]]; then  # not built with other TARGETS
  untried=$(sed -n 's/.*kUntriedLevers\[\] = {\(.*\)};.*/\1/p' src/kernels/cuda/levers.h | tr -d '" ')
  echo "gpu-check: CUDA tests with STATEFLOW_LEVERS_ON=${STATEFLOW_LEVERS_ON-$untried}" | tee "$LOG/cuda_tests.log"
  STATEFLOW_LEVERS_ON=${STATEFLOW_LEVERS_ON-$untried} timeout 300 "$BUILD/stateflow_cuda_tests" 2>&1 | tee -a "$LOG/cuda_tests.log"
  status[cuda_tests]=$([[ ${PIPESTATUS[0]} == 0 ]] && echo ok || echo FAILED)
fi
if [[ ${status[build]} == ok ]]; then
  if [[ -n ${status[cuda_tests]:-} && (${SANITIZE:-auto} == 1 || (${SANITIZE:-auto} == auto && ${status[cuda_tests]} != ok)) ]]; then
    for tool in memcheck racecheck; do
      timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 9 "$BUILD/stateflow_cuda_tests" \
        --gtest_filter='*Repeatable*' 2>&1 | tail -40 | tee -a "$LOG/sanitizer.log"
      status[$tool]=$([[ ${PIPESTATUS[0]} == 0 ]] && echo ok || echo FAILED)
    done
  fi
  if [[ ${CTEST:-1} != 0 ]]; then
    ctest --test-dir "$BUILD" --output-on-failure --timeout 300 -j "$(nproc)" 2>&1 | tee "$LOG/ctest.log"
    status[ctest]=$([[ ${PIPESTATUS[0]} == 0 ]] && echo ok || echo FAILED)
  fi
  if [[ -x $BUILD/gdn_core_bench ]]; then
    # shellcheck disable=SC2086
    timeout 300 "$BUILD/gdn_core_bench" --json "$LOG/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$LOG/bench.log"
    status[bench]=$([[ ${PIPESTATUS[0]} == 0 ]] && echo ok || echo FAILED)
  fi
  if [[ -x $BUILD/mamba3_core_bench ]]; then
    # shellcheck disable=SC2086
    timeout 300 "$BUILD/mamba3_core_bench" --json "$LOG/mamba3_bench.json" ${MAMBA3_BENCH_ARGS:-} 2>&1 |
      tee "$LOG/mamba3_bench.log"
    status[mamba3_bench]=$([[ ${PIPESTATUS[0]} == 0 ]] && echo ok || echo FAILED)
  fi
  if [[ -x $BUILD/attention_bench ]]; then
    # shellcheck disable=SC2086
    timeout 300 "$BUILD/attention_bench" ${ATTENTION_BENCH_ARGS:-} 2>&1 | tee "$LOG/attention_bench.log"
    status[attention_bench]=$([[ ${PIPESTATUS[0]} == 0 ]] && echo ok || echo FAILED)
  fi
  if [[ -x $BUILD/kernels_bench ]]; then
    # shellcheck disable=SC2086
    timeout 300 "$BUILD/kernels_bench" ${KERNELS_BENCH_ARGS:-} 2>&1 | tee "$LOG/kernels_bench.log"
    status[kernels_bench]=$([[ ${PIPESTATUS[0]} == 0 ]] && echo ok || echo FAILED)
  fi
  if [[ -x $BUILD/gemm_bench ]]; then
    timeout 120 "$BUILD/gemm_bench" 2>&1 | tee "$LOG/gemm_bench.log"
    status[gemm_bench]=$([[ ${PIPESTATUS[0]} == 0 ]] && echo ok || echo FAILED)
  fi
fi

if [[ ${MATRIX:-} == quick && ${status[build]} == ok && -x $BUILD/stateflow ]]; then
  if (($(nvidia-smi -L 2>/dev/null | wc -l) >= 2)); then
    bash bench/pipeline_matrix.sh --quick --bin "$BUILD/stateflow" --out "$LOG/bench-matrix.md" --logs "$LOG/matrix"
    status[matrix]=$([[ $? == 0 ]] && echo ok || echo FAILED)
  else
    echo "gpu-check: MATRIX=quick needs 2 GPUs; skipped"
  fi
fi

echo
echo "================ gpu-check summary ================"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
for step in build cuda_tests memcheck racecheck ctest bench mamba3_bench attention_bench kernels_bench gemm_bench matrix; do
  [[ -n ${status[$step]:-} ]] && printf '%-12s %s\n' "$step" "${status[$step]}"
done
grep -E '^\[  (PASSED|FAILED) |tests passed|rel err|unsplit' "$LOG/cuda_tests.log" "$LOG/ctest.log" 2>/dev/null | sed 's|^.*/||'
[[ -f $LOG/bench.log ]] && sed -n '/^ *T .*fwd ms/,$p' "$LOG/bench.log"
[[ -f $LOG/mamba3_bench.log ]] && sed -n '/^ *R  *T |/,$p' "$LOG/mamba3_bench.log"
[[ -f $LOG/kernels_bench.log ]] && sed -n '/^| kernel |/,$p' "$LOG/kernels_bench.log"
[[ -f $LOG/gemm_bench.log ]] && sed -n '/^| product |/,$p' "$LOG/gemm_bench.log"
[[ -f $LOG/bench-matrix.md ]] && cat "$LOG/bench-matrix.md"
for step in "${!status[@]}"; do [[ ${status[$step]} == ok ]] || exit 1; done
