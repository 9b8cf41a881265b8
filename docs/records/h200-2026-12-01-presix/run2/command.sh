#!/bin/bash
# presix, device run 2 (binaries at presix 2nd commit): GDN tests with pre_stages on (pre_mma default), bench old / default / staged, ncu of the staged Pre
mkdir -p bin .deps/root /tmp/logs-presix && tar -C bin -xJf .gpu-presix/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH
D=/tmp/logs-presix; save() { tar -C /tmp -czf $OUT/logs.tgz logs-presix; }
T0=$SECONDS
STATEFLOW_LEVERS_ON=pre_stages timeout 100 bin/stateflow_cuda_tests --gtest_filter='*Gdn*:*gdn*' > $D/tests-pre_stages.log 2>&1; echo "tests rc=$? $((SECONDS-T0)) s"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure|Expected|Which is" $D/tests-pre_stages.log | head -30
save
for v in "OFF=pre_mma" "OFF=" "ON=pre_stages"; do echo "== STATEFLOW_LEVERS_$v"; env STATEFLOW_LEVERS_$v timeout 40 bin/gdn_core_bench --len 32768,131072 --chunk-len 2048 --reps 10; done > $D/bench.log 2>&1; echo "bench $((SECONDS-T0)) s"
save
grep -E "^== |^ +(32768|131072) +rows" $D/bench.log | cut -c1-200
STATEFLOW_LEVERS_ON=pre_stages timeout 40 ncu --clock-control none --kernel-name regex:pre_mma_kernel --launch-count 1 --section SpeedOfLight --section WarpStateStats --section Occupancy --section SchedulerStats bin/gdn_core_bench --len 32768 --reps 1 > $D/ncu.log 2>&1; echo "ncu rc=$? $((SECONDS-T0)) s"
save
grep -E "Duration|DRAM Throughput|L2 Cache Throughput|Achieved Occupancy|Warp Cycles Per Issued|Issued Warp" $D/ncu.log | head -20
