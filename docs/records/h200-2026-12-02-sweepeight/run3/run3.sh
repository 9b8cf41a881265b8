#!/usr/bin/env bash
# sweepeight run 3: the sweep warps sharing whole-tile copies (copy warp off) vs the copy warp by lines.
# BIN=dir with gdn_core_bench and stateflow_cuda_tests of main (>= ac64bb8), libraries already on
# LD_LIBRARY_PATH (as after gpu-check's set-up); else the binaries in bin.tar.xz beside this script.
# Logs to ${LOGS:-/tmp/logs-sweepeight} (and a tar of them to $OUT when set).
set -u
cd "$(dirname "$0")"
if [[ -z ${BIN:-} ]]; then
  mkdir -p bin && tar -C bin -xJf bin.tar.xz && BIN=$PWD/bin
  mkdir -p ../.deps/root; for f in ../.deps/*.deb; do dpkg -x "$f" ../.deps/root; done
  L=$PWD/../.deps/root/usr/lib/x86_64-linux-gnu
  export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])')/lib:${LD_LIBRARY_PATH:-}
fi
O=${LOGS:-/tmp/logs-sweepeight}; rm -rf $O; mkdir -p $O
t0=$(date +%s); T() { echo "$1 rc $2 $(( $(date +%s)-t0 ))s" >> $O/times.txt; }
B=$BIN/gdn_core_bench
STATEFLOW_LEVERS_OFF=sweep_copy_warp timeout 90 $BIN/stateflow_cuda_tests --gtest_filter='GdnCoreCuda.*:GdnKeptSweepCuda.*:-GdnCoreCuda.TheOverlapRuns*' > $O/tests.log 2>&1; T tests $?
$B --len 32768,131072 --reps 10 > $O/cw.log 2>&1; T cw $?
STATEFLOW_LEVERS_OFF=sweep_copy_warp $B --len 32768,131072 --reps 10 > $O/nocw.log 2>&1; T nocw $?
STATEFLOW_LEVERS_OFF=sweep_copy_warp,sweep_copy_lines $B --len 32768 --reps 10 > $O/nocw_old.log 2>&1; T nocw_old $?
$B --len 32768 --reps 10 --overlap off > $O/cw2.log 2>&1; T cw2 $?
STATEFLOW_LEVERS_OFF=sweep_copy_warp $B --len 32768 --reps 10 --overlap off > $O/nocw2.log 2>&1; T nocw2 $?
if [[ -n ${OUT:-} ]]; then tar -czf $OUT/sweepeight-run3.tgz -C "$(dirname $O)" "$(basename $O)"; fi
grep -hE "^ +[0-9]+ +rows" $O/cw.log $O/nocw.log $O/nocw_old.log $O/cw2.log $O/nocw2.log; grep -E "PASSED|FAILED" $O/tests.log
