#!/usr/bin/env bash
# gdnsweep5's device run: prebuilt binaries; GDN core tests + quarter vs split-key sweeps; logs to $OUT
set -u
cd "$(dirname "$0")"
mkdir -p bin && tar -C bin -xJf bin.tar.xz
mkdir -p ../.deps/root; for f in ../.deps/*.deb; do dpkg -x "$f" ../.deps/root; done
L=$PWD/../.deps/root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])')/lib:${LD_LIBRARY_PATH:-}
O=$OUT/logs; mkdir -p $O
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $O/gpu.txt 2>&1; date -u >> $O/gpu.txt
t0=$(date +%s); T() { echo "$1 rc $2 $(( $(date +%s)-t0 ))s" >> $O/times.txt; }
B=bin/gdn_core_bench
$B --len 32768,131072 --chunk-len 2048 --reps 10 --json $O/new.json > $O/new.log 2>&1; T new $?
STATEFLOW_LEVERS_OFF=sweep_quarters $B --len 32768,131072 --chunk-len 2048 --reps 10 --json $O/old.json > $O/old.log 2>&1; T old $?
$B --len 32768 --reps 10 --sweep-key-split 4 --sweep-warps 8 > $O/q8.log 2>&1; T q8 $?
$B --len 32768 --reps 10 --sweep-key-split 4 --sweep-warps 4 > $O/q4.log 2>&1; T q4 $?
bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda*:*OpDefCuda*gdn_core*:*MixerConformanceCuda*gdn*' > $O/tests.log 2>&1; T tests $?
if command -v ncu >/dev/null; then
  S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section InstructionStats --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
  timeout 60 ncu --clock-control none -k regex:row_forward_kernel -c 1 $S $B --len 32768 --reps 1 > $O/ncu_fwd.txt 2>&1; T ncu_fwd $?
  timeout 60 ncu --clock-control none -k regex:row_backward_kernel -c 1 $S $B --len 32768 --reps 1 > $O/ncu_bwd.txt 2>&1; T ncu_bwd $?
fi
tar -czf $OUT/gdnsweep5-runN.tgz -C $OUT logs && rm -rf $O
