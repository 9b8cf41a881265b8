#!/usr/bin/env bash
# b4six's device run 1: prebuilt binaries (bin.tar.xz at the root of the carried copy); the GDN
# core's CUDA tests with the deep-ring B4 on, old vs new gdn_core_bench in one call, Nsight
# Compute of both B4 kernels. Logs in $OUT/logs.tgz; the key lines on stdout.
set -u
cd "$(dirname "$0")"
R=$(cd ../../.. && pwd)
mkdir -p bin && tar -C bin -xJf "$R/bin.tar.xz"
mkdir -p $R/.deps/root; for f in $R/.deps/*.deb; do dpkg -x "$f" $R/.deps/root; done
L=$R/.deps/root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])')/lib:${LD_LIBRARY_PATH:-}
O=$OUT/w; mkdir -p $O; t0=$(date +%s)
lap() { echo "$1 rc $2 $(( $(date +%s)-t0 ))s" | tee -a $O/times.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $O/gpu.txt 2>&1; date -u >> $O/gpu.txt
STATEFLOW_LEVERS_ON=b4_ring bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda*:*OpDef*gdn*:*MixerConformanceCuda*gdn*' > $O/tests.log 2>&1; lap tests $?
B="--len 32768,131072 --chunk-len 2048 --reps 10"
for i in 1 2; do
  bin/gdn_core_bench $B > $O/bench_old$i.log 2>&1; lap old$i $?
  STATEFLOW_LEVERS_ON=b4_ring bin/gdn_core_bench $B --b4-slab 16,32 > $O/bench_new$i.log 2>&1; lap new$i $?
done
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section InstructionStats --section SourceCounters --section MemoryWorkloadAnalysis"
timeout 90 ncu --clock-control none -k regex:'b4_kernel' -c 1 $S bin/gdn_core_bench --len 32768 --reps 1 > $O/ncu_old.txt 2>&1; lap ncu_old $?
STATEFLOW_LEVERS_ON=b4_ring timeout 90 ncu --clock-control none -k regex:'b4_ring' -c 1 $S -o $O/ncu_new bin/gdn_core_bench --len 32768 --reps 1 > $O/ncu_new_run.txt 2>&1; lap ncu_new $?
ncu -i $O/ncu_new.ncu-rep > $O/ncu_new.txt 2>&1
ncu -i $O/ncu_new.ncu-rep --page source --csv --print-source sass > $O/ncu_new_sass.csv 2>&1; lap source $?
tar -C $OUT -czf $OUT/logs.tgz w
grep -E "PASSED|FAILED|tests ran" $O/tests.log | head -20
for f in $O/bench_*.log; do echo "== $f"; grep -E "^ +(32768|131072) " $f | head -8; done
grep -E "Duration|Executed Instructions  |Warp Cycles Per Issued|Achieved Occupancy|Registers Per|spill|Stall" $O/ncu_old.txt $O/ncu_new.txt | head -40
cat $O/times.txt
