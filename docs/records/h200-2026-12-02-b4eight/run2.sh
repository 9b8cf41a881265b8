#!/usr/bin/env bash
# b4eight's device run 2: prebuilt binaries (bin.tar.xz at the root of the carried copy, branch
# b4eight at 022dd79); the GDN core's CUDA tests with the lean B4 on (lever b4_lean), then
# gdn_core_bench old (early slabs, the default) vs lean in one call, two of each in turn, and Nsight
# Compute summaries of both kernels at 32K. Logs in $OUT/logs.tgz; the key lines on stdout.
set -u
cd "$(dirname "$0")"
R=$(cd ../../.. && pwd)
mkdir -p bin && tar -C bin -xJf "$R/bin.tar.xz"
mkdir -p $R/.deps/root; for f in $R/.deps/*.deb; do dpkg -x "$f" $R/.deps/root; done
L=$R/.deps/root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])')/lib:${LD_LIBRARY_PATH:-}
O=/tmp/logs-b4eight/w; rm -rf $O; mkdir -p $O; t0=$(date +%s)
lap() { echo "$1 rc $2 $(( $(date +%s)-t0 ))s" | tee -a $O/times.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $O/gpu.txt 2>&1; date -u >> $O/gpu.txt
STATEFLOW_LEVERS_ON=b4_lean timeout 150 bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda*:*OpDef*gdn*:*MixerConformanceCuda*gdn*:GdnKeptSweepCuda*' > $O/tests.log 2>&1; lap tests $?
B="--len 32768,131072 --chunk-len 2048 --reps 10"
for i in 1 2; do
  timeout 60 bin/gdn_core_bench $B > $O/bench_old$i.log 2>&1; lap old$i $?
  STATEFLOW_LEVERS_ON=b4_lean timeout 60 bin/gdn_core_bench $B > $O/bench_lean$i.log 2>&1; lap lean$i $?
done
STATEFLOW_LEVERS_ON=b4_lean timeout 60 bin/gdn_core_bench --len 32768,131072 --reps 10 --b4-slab 32 > $O/bench_lean32.log 2>&1; lap lean32 $?
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis"
timeout 60 ncu --clock-control none -k regex:'b4_ring' -c 1 $S bin/gdn_core_bench --len 32768 --reps 1 > $O/ncu_old.txt 2>&1; lap ncu_old $?
STATEFLOW_LEVERS_ON=b4_lean timeout 60 ncu --clock-control none -k regex:'b4_ring' -c 1 $S bin/gdn_core_bench --len 32768 --reps 1 > $O/ncu_lean.txt 2>&1; lap ncu_lean $?
tar -C $(dirname $O) -czf $OUT/logs.tgz w
grep -E "PASSED|FAILED|tests ran" $O/tests.log | head -20
for f in $O/bench_*.log; do echo "== $f"; grep -E "^ +(32768|131072) " $f | grep -v " 2048 |" | head -2; grep -E " 2048 \|" $f; done
grep -E "b4_ring_kernel|Duration|Executed Instructions  |Warp Cycles Per Issued|Spilling Requests  |DRAM Throughput" $O/ncu_old.txt $O/ncu_lean.txt | head -30
cat $O/times.txt
