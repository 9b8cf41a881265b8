#!/usr/bin/env bash
# gdnpar5's device run 1: prebuilt binaries (B4 on wgmma); tests + old/new measurements; logs to $OUT.
set -u
cd "$(dirname "$0")"
mkdir -p bin && tar -C bin -xJf bin.tar.xz
mkdir -p ../.deps/root; for f in ../.deps/*.deb; do dpkg -x "$f" ../.deps/root; done
L=$PWD/../.deps/root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])')/lib:${LD_LIBRARY_PATH:-}
O=$OUT; t0=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $O/gpu.txt 2>&1; date >> $O/gpu.txt
bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda*:*OpDef*gdn*:*MixerConformanceCuda*gdn*' > $O/tests.log 2>&1; echo "tests rc $? $(( $(date +%s)-t0 ))s" >> $O/times.txt
STATEFLOW_LEVERS_OFF=b4_wgmma bin/gdn_core_bench --len 32768,131072 --chunk-len 2048 --reps 10 > $O/bench_old.log 2>&1; echo "old rc $? $(( $(date +%s)-t0 ))s" >> $O/times.txt
bin/gdn_core_bench --len 32768,131072 --chunk-len 2048 --reps 10 > $O/bench_new.log 2>&1; echo "new rc $? $(( $(date +%s)-t0 ))s" >> $O/times.txt
bin/gdn_core_bench --len 32768 --reps 10 --b4-slab 32,64 > $O/bench_slabs.log 2>&1; echo "slabs rc $? $(( $(date +%s)-t0 ))s" >> $O/times.txt
timeout 120 ncu --clock-control none -k regex:b4_kernel -c 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section InstructionStats --section LaunchStats bin/gdn_core_bench --len 32768 --reps 1 > $O/ncu_b4_wgmma.txt 2>&1; echo "ncu rc $? $(( $(date +%s)-t0 ))s" >> $O/times.txt
tail -4 $O/tests.log; grep -E "FAILED|OK \]" $O/tests.log | head -60; cat $O/times.txt
