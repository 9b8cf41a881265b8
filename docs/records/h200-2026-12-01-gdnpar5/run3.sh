#!/usr/bin/env bash
# gdnpar5's device run 3: prebuilt binaries of main (bin/main_gdn_core_bench) and of the branch;
# tests + old/new twice + wgmma variants; logs to $OUT.
set -u
cd "$(dirname "$0")"
R=$(cd ../../.. && pwd)
mkdir -p bin && tar -C bin -xJf bin.tar.xz
mkdir -p $R/.deps/root; for f in $R/.deps/*.deb; do dpkg -x "$f" $R/.deps/root; done
L=$R/.deps/root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])')/lib:${LD_LIBRARY_PATH:-}
O=$OUT; t0=$(date +%s); log() { echo "$1 rc $2 $(( $(date +%s)-t0 ))s" >> $O/times.log; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $O/gpu.log 2>&1; date >> $O/gpu.log
bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda*:*OpDef*gdn*:*MixerConformanceCuda*gdn*' > $O/tests.log 2>&1; log tests $?
A="--len 32768,131072 --chunk-len 2048 --reps 10"
for i in 1 2; do
bin/main_gdn_core_bench $A > $O/bench_main$i.log 2>&1; log main$i $?
bin/gdn_core_bench $A > $O/bench_new$i.log 2>&1; log new$i $?
done
STATEFLOW_GDN_B4=wgmma bin/gdn_core_bench $A > $O/bench_wgmma.log 2>&1; log wgmma $?
STATEFLOW_GDN_B4=wgmma bin/gdn_core_bench --len 32768 --reps 10 --b4-slab 32,64 >> $O/bench_wgmma.log 2>&1; log wgmma_slabs $?
tail -3 $O/tests.log; grep -E "FAILED" $O/tests.log | head; cat $O/times.log
