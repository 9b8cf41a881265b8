#!/usr/bin/env bash
# b4eight's device run 1: prebuilt binaries (bin.tar.xz at the root of the carried copy, branch
# b4eight at 00488ac); the GDN core's CUDA tests with the persistent B4 on (lever b4_persist), then
# gdn_core_bench old (early slabs, the default) vs persistent with each L2 prefetch stage in one
# call, and Nsight Compute of both kernels at 32K. Logs in $OUT/logs.tgz; the key lines on stdout.
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
STATEFLOW_LEVERS_ON=b4_persist timeout 150 bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda*:*OpDef*gdn*:*MixerConformanceCuda*gdn*:GdnKeptSweepCuda*' > $O/tests.log 2>&1; lap tests $?
B="--len 32768,131072 --chunk-len 2048 --reps 10"
P=STATEFLOW_LEVERS_ON=b4_persist
for i in 1 2; do
  timeout 60 bin/gdn_core_bench $B > $O/bench_old$i.log 2>&1; lap old$i $?
  env $P STATEFLOW_GDN_B4_PREFETCH=pass1 timeout 60 bin/gdn_core_bench $B > $O/bench_pass1_$i.log 2>&1; lap pass1_$i $?
done
for at in none start dvb; do
  env $P STATEFLOW_GDN_B4_PREFETCH=$at timeout 60 bin/gdn_core_bench $B > $O/bench_$at.log 2>&1; lap $at $?
done
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section InstructionStats --section SourceCounters --section MemoryWorkloadAnalysis"
timeout 60 ncu --clock-control none -k regex:'b4_ring' -c 1 $S bin/gdn_core_bench --len 32768 --reps 1 > $O/ncu_old.txt 2>&1; lap ncu_old $?
env $P timeout 60 ncu --clock-control none -k regex:'b4_persist' -c 1 $S -o $O/ncu_new bin/gdn_core_bench --len 32768 --reps 1 > $O/ncu_new_run.txt 2>&1; lap ncu_new $?
ncu -i $O/ncu_new.ncu-rep > $O/ncu_new.txt 2>&1
ncu -i $O/ncu_new.ncu-rep --page source --csv --print-source sass > $O/ncu_new_sass.csv 2>&1; lap source $?
rm -f $O/ncu_new.ncu-rep
tar -C $(dirname $O) -czf $OUT/logs.tgz w
grep -E "PASSED|FAILED|tests ran" $O/tests.log | head -20
for f in $O/bench_*.log; do echo "== $f"; grep -E "^ +(32768|131072) " $f | grep -v " 2048 |" | head -2; grep -E " 2048 \|" $f; done
grep -E "Duration|Executed Instructions  |Warp Cycles Per Issued|Achieved Occupancy|Spilling Requests  |DRAM Throughput|L2 Hit Rate" $O/ncu_old.txt $O/ncu_new.txt | head -30
cat $O/times.txt
