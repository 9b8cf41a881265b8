#!/usr/bin/env bash
# b4six's device run 2: prebuilt binaries (bin.tar.xz at the root of the carried copy); the GDN
# core's CUDA tests with the hand-over B4 on, two-slot vs deep ring vs hand-over in one call, Nsight
# Compute of the hand-over B4. Logs in $OUT/logs.tgz; the key lines on stdout.
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
# A hand-over that hangs costs 30 s here, not the whole call: the rest then skips it.
timeout 30 bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda.B4DeepRing*' > $O/tests_first.log 2>&1; hand=$?; lap first $hand
[ $hand -eq 0 ] && STATEFLOW_LEVERS_ON=b4_hand_over timeout 150 bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda*:*OpDef*gdn*:*MixerConformanceCuda*gdn*' > $O/tests.log 2>&1; lap tests $?
B="--len 32768,131072 --chunk-len 2048 --reps 10"
for i in 1 2; do
  STATEFLOW_LEVERS_OFF=b4_ring timeout 60 bin/gdn_core_bench $B > $O/bench_two$i.log 2>&1; lap two$i $?
  timeout 60 bin/gdn_core_bench $B > $O/bench_ring$i.log 2>&1; lap ring$i $?
  [ $hand -eq 0 ] && STATEFLOW_LEVERS_ON=b4_hand_over timeout 60 bin/gdn_core_bench $B > $O/bench_hand$i.log 2>&1; lap hand$i $?
done
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section InstructionStats --section SourceCounters --section MemoryWorkloadAnalysis"
[ $hand -eq 0 ] && STATEFLOW_LEVERS_ON=b4_hand_over timeout 90 ncu --clock-control none -k regex:'b4_ring' -c 1 $S -o $O/ncu_hand bin/gdn_core_bench --len 32768 --reps 1 > $O/ncu_hand_run.txt 2>&1; lap ncu_hand $?
ncu -i $O/ncu_hand.ncu-rep > $O/ncu_hand.txt 2>&1
ncu -i $O/ncu_hand.ncu-rep --page source --csv --print-source sass > $O/ncu_hand_sass.csv 2>&1; lap source $?
rm -f $O/ncu_hand.ncu-rep
tar -C $OUT -czf $OUT/logs.tgz w
grep -hE "PASSED|FAILED|tests ran" $O/tests_first.log $O/tests.log | head -20
for f in $O/bench_*.log; do echo "== $f"; grep -E "^ +(32768|131072) " $f | grep -v " 2048 |" | head -2; grep " 2048 |" $f; done
grep -E "Duration|Executed Instructions  |Warp Cycles Per Issued|Achieved Occupancy|Local Memory Spilling Requests  " $O/ncu_hand.txt | head -20
cat $O/times.txt
