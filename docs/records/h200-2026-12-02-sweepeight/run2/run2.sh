#!/usr/bin/env bash
# sweepeight run 2: tests with the new levers on; old vs new in one call; ncu of the new sweeps
set -u
cd "$(dirname "$0")"
mkdir -p bin && tar -C bin -xJf bin.tar.xz
mkdir -p ../.deps/root; for f in ../.deps/*.deb; do dpkg -x "$f" ../.deps/root; done
L=$PWD/../.deps/root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])')/lib:${LD_LIBRARY_PATH:-}
O=/tmp/logs-sweepeight; rm -rf $O; mkdir -p $O
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $O/gpu.txt 2>&1; date -u >> $O/gpu.txt
t0=$(date +%s); T() { echo "$1 rc $2 $(( $(date +%s)-t0 ))s" >> $O/times.txt; }
B=bin/gdn_core_bench
NEW=sweep_copy_lines,sweep_deep
STATEFLOW_LEVERS_ON=$NEW timeout 90 bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda*:GdnKeptSweepCuda*:*OpDefCuda*gdn_core*:*MixerConformanceCuda*gdn*' > $O/tests.log 2>&1; T tests $?
$B --len 32768,131072 --chunk-len 2048 --reps 10 > $O/old.log 2>&1; T old $?
STATEFLOW_LEVERS_ON=sweep_copy_lines $B --len 32768,131072 --chunk-len 2048 --reps 10 > $O/lines.log 2>&1; T lines $?
STATEFLOW_LEVERS_ON=$NEW $B --len 32768,131072 --chunk-len 2048 --reps 10 > $O/new.log 2>&1; T new $?
$B --len 32768 --reps 10 > $O/old2.log 2>&1; T old2 $?
STATEFLOW_LEVERS_ON=$NEW $B --len 32768 --reps 10 > $O/new2.log 2>&1; T new2 $?
if command -v ncu >/dev/null; then
  S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters --section InstructionStats"
  N="ncu --clock-control none --kernel-name-base demangled -c 1 $S"
  prof() {
    local name=$1 k=$2
    STATEFLOW_LEVERS_ON=$NEW timeout 40 $N -k "regex:$k" -o $O/$name $B --len 8192 --reps 1 --overlap off > $O/ncu_$name.txt 2>&1; T ncu_$name $?
    timeout 20 ncu -i $O/$name.ncu-rep --page source --csv --print-source sass > $O/sass_$name.csv 2>&1; T sass_$name $?
    timeout 20 ncu -i $O/$name.ncu-rep --page details > $O/details_$name.txt 2>&1
    rm -f $O/$name.ncu-rep
  }
  prof st 'row_forward_kernel<.int.1, .int.4, .bool.1, .int.0'
  prof b3ks 'row_backward_kernel<.int.1, .int.4, .bool.1, .int.0'
fi
tar -czf $OUT/sweepeight-run2.tgz -C /tmp logs-sweepeight
