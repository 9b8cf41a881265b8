#!/usr/bin/env bash
# gdnpar5's device run 2: prebuilt binaries (B4 on wgmma, async pairs); tests + old/new + ncu; logs to $OUT.
set -u
cd "$(dirname "$0")"
R=$(cd ../../.. && pwd)
mkdir -p bin && tar -C bin -xJf bin.tar.xz
mkdir -p $R/.deps/root; for f in $R/.deps/*.deb; do dpkg -x "$f" $R/.deps/root; done
L=$R/.deps/root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])')/lib:${LD_LIBRARY_PATH:-}
O=$OUT; t0=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $O/gpu.txt 2>&1; date >> $O/gpu.txt
bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda*:*OpDef*gdn*:*MixerConformanceCuda*gdn*' > $O/tests.log 2>&1; echo "tests rc $? $(( $(date +%s)-t0 ))s" >> $O/times.txt
for i in 1 2; do
STATEFLOW_LEVERS_OFF=b4_wgmma bin/gdn_core_bench --len 32768,131072 --chunk-len 2048 --reps 10 > $O/bench_old$i.log 2>&1; echo "old rc $? $(( $(date +%s)-t0 ))s" >> $O/times.txt
bin/gdn_core_bench --len 32768,131072 --chunk-len 2048 --reps 10 > $O/bench_new$i.log 2>&1; echo "new rc $? $(( $(date +%s)-t0 ))s" >> $O/times.txt
done
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section InstructionStats --section SchedulerStats"
timeout 100 ncu --clock-control none -k regex:'b4_kernel|pre_kernel|out_kernel|dvloc_kernel' -c 5 $S bin/gdn_core_bench --len 32768 --reps 1 > $O/ncu_new.txt 2>&1; echo "ncu rc $? $(( $(date +%s)-t0 ))s" >> $O/times.txt
STATEFLOW_LEVERS_OFF=b4_wgmma timeout 60 ncu --clock-control none -k regex:b4_kernel -c 1 $S bin/gdn_core_bench --len 32768 --reps 1 > $O/ncu_old_b4.txt 2>&1; echo "ncu old rc $? $(( $(date +%s)-t0 ))s" >> $O/times.txt
tail -3 $O/tests.log; grep -E "FAILED" $O/tests.log | head; cat $O/times.txt
