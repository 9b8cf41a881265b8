#!/bin/bash
# presix, device run 1: GdnCore tests with pre_mma on, gdn_core_bench old vs new, ncu of pre_mma_kernel
mkdir -p bin .deps/root /tmp/logs && tar -C bin -xJf .gpu-presix/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH
save() { tar -C /tmp -czf $OUT/logs.tgz logs; }
T0=$SECONDS
STATEFLOW_LEVERS_ON=pre_mma timeout 100 bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda.*:*OpDefCuda*gdn_core*' > /tmp/logs/tests-pre_mma.log 2>&1; echo "tests rc=$? $((SECONDS-T0)) s"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure|Expected|Which is|actual|rel_err" /tmp/logs/tests-pre_mma.log | head -40
save
for on in "" pre_mma; do echo "== STATEFLOW_LEVERS_ON=$on"; STATEFLOW_LEVERS_ON=$on timeout 40 bin/gdn_core_bench --len 32768,131072 --chunk-len 2048 --reps 10; done > /tmp/logs/bench.log 2>&1; echo "bench $((SECONDS-T0)) s"
save
grep -E "^== |^ +(32768|131072) +rows" /tmp/logs/bench.log
STATEFLOW_LEVERS_ON=pre_mma timeout 45 ncu --clock-control none --kernel-name regex:pre_mma_kernel --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section SchedulerStats bin/gdn_core_bench --len 32768 --reps 1 > /tmp/logs/ncu.log 2>&1; echo "ncu rc=$? $((SECONDS-T0)) s"
save
grep -E "Duration|Throughput|Achieved Occupancy|Theoretical Occupancy|Warp Cycles|Bank|Registers|Block Limit|Stall|Issued" /tmp/logs/ncu.log | head -40
