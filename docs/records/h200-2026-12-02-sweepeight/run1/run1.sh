#!/usr/bin/env bash
# sweepeight run 1: where the quarter sweeps' steps wait (ncu), contention vs heads, 4 copy stages for ST
set -u
cd "$(dirname "$0")"
mkdir -p bin && tar -C bin -xJf bin.tar.xz
mkdir -p ../.deps/root; for f in ../.deps/*.deb; do dpkg -x "$f" ../.deps/root; done
L=$PWD/../.deps/root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])')/lib:${LD_LIBRARY_PATH:-}
O=/tmp/logs-sweepeight; rm -rf $O; mkdir -p $O
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv > $O/gpu.txt 2>&1; date -u >> $O/gpu.txt
t0=$(date +%s); T() { echo "$1 rc $2 $(( $(date +%s)-t0 ))s" >> $O/times.txt; }
B=bin/gdn_core_bench
timeout 40 bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda.DeeperForward*:GdnCoreCuda.QuarterSweep*' > $O/tests.log 2>&1; T tests $?
$B --len 32768,131072 --reps 10 > $O/base.log 2>&1; T base $?
STATEFLOW_LEVERS_ON=sweep_deep $B --len 32768,131072 --reps 10 > $O/deep.log 2>&1; T deep $?
for h in 8 4 1; do $B --len 32768 --heads $h --reps 10 > $O/heads$h.log 2>&1; T heads$h $?; done
$B --len 32768 --reps 10 > $O/base2.log 2>&1; T base2 $?
if command -v ncu >/dev/null; then
  S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats --section Occupancy --section SourceCounters --section InstructionStats"
  N="ncu --clock-control none --kernel-name-base demangled -c 1 $S"
  prof() {  # name, kernel regex, env..., then bench args
    local name=$1 k=$2; shift 2
    timeout 60 env "$@" $N -k "regex:$k" -o $O/$name $B --len 8192 --reps 1 --overlap off > $O/ncu_$name.txt 2>&1; T ncu_$name $?
    timeout 20 ncu -i $O/$name.ncu-rep --page source --csv --print-source sass > $O/sass_$name.csv 2>&1; T sass_$name $?
  }
  prof st 'row_forward_kernel<1, 4, true, 0' STATEFLOW_X=1
  prof b3ks 'row_backward_kernel<1, 4, true, 0' STATEFLOW_X=1
  prof stmc 'row_forward_kernel<1, 4, true, 8' STATEFLOW_LEVERS_ON=sweep_multicast
fi
rm -f $O/*.ncu-rep.tmp
tar -czf $OUT/sweepeight-run1.tgz -C /tmp logs-sweepeight
