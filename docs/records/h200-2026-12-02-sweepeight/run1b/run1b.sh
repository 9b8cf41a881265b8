#!/usr/bin/env bash
# sweepeight run 1b: ncu source-level stalls of ST and B3 kS (quarter sweeps, copy warp)
set -u
cd "$(dirname "$0")"
mkdir -p bin && tar -C bin -xJf bin.tar.xz
mkdir -p ../.deps/root; for f in ../.deps/*.deb; do dpkg -x "$f" ../.deps/root; done
L=$PWD/../.deps/root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])')/lib:${LD_LIBRARY_PATH:-}
O=/tmp/logs-sweepeight; rm -rf $O; mkdir -p $O
t0=$(date +%s); T() { echo "$1 rc $2 $(( $(date +%s)-t0 ))s" >> $O/times.txt; }
B=bin/gdn_core_bench
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section SourceCounters --section InstructionStats"
N="ncu --clock-control none --kernel-name-base demangled -c 1 $S"
prof() {  # name, kernel regex, env
  local name=$1 k=$2 e=$3
  timeout 50 env $e $N -k "regex:$k" -o $O/$name $B --len 8192 --reps 1 --overlap off > $O/ncu_$name.txt 2>&1; T ncu_$name $?
  timeout 20 ncu -i $O/$name.ncu-rep --page source --csv --print-source sass > $O/sass_$name.csv 2>$O/sass_$name.err ||
    timeout 20 ncu -i $O/$name.ncu-rep --page source --csv > $O/sass_$name.csv 2>>$O/sass_$name.err; T sass_$name $?
  timeout 20 ncu -i $O/$name.ncu-rep --page details --print-details all > $O/details_$name.txt 2>&1
}
prof st 'row_forward_kernel<.int.1, .int.4, .bool.1, .int.0' X=1
prof b3ks 'row_backward_kernel<.int.1, .int.4, .bool.1, .int.0' X=1
ls -la $O >> $O/times.txt
tar -czf $OUT/sweepeight-run1b.tgz -C /tmp logs-sweepeight
