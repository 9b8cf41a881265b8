#!/usr/bin/env bash
# b4six's device run 3: prebuilt binaries (bin.tar.xz at the root of the carried copy); the GDN
# core's CUDA tests with the deep ring's early slabs on (lever b4_ring_early), then the deep ring
# (the default) against its early slabs in one call. Logs in $OUT/logs.tgz; the key lines on stdout.
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
STATEFLOW_LEVERS_ON=b4_ring_early timeout 150 bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda*:*OpDef*gdn*:*MixerConformanceCuda*gdn*' > $O/tests.log 2>&1; lap tests $?
B="--len 32768,131072 --chunk-len 2048 --reps 10"
for i in 1 2; do
  timeout 60 bin/gdn_core_bench $B > $O/bench_ring$i.log 2>&1; lap ring$i $?
  STATEFLOW_LEVERS_ON=b4_ring_early timeout 60 bin/gdn_core_bench $B > $O/bench_early$i.log 2>&1; lap early$i $?
done
tar -C $OUT -czf $OUT/logs.tgz w
grep -hE "PASSED|FAILED|tests ran" $O/tests.log | head -20
for f in $O/bench_*.log; do echo "== $f"; grep -E "^ +(32768|131072) " $f | grep -v " 2048 |" | head -2; grep " 2048 |" $f; done
cat $O/times.txt
