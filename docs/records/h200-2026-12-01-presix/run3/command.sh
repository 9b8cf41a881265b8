#!/bin/bash
# presix, device run 3: main 07fca0f's gdn_core_bench vs presix ab7... (diagonal warps invert their own blocks, staged W/U stores); GDN core tests of the new binary
mkdir -p bin .deps/root /tmp/logs-presix3 && tar -C bin -xJf .gpu-presix/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH
D=/tmp/logs-presix3; save() { tar -C /tmp -czf $OUT/logs.tgz logs-presix3; }
T0=$SECONDS
timeout 60 bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda.*:*OpDefCuda*gdn_core*' > $D/tests.log 2>&1; echo "tests rc=$? $((SECONDS-T0)) s"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure|Expected|Which is" $D/tests.log | head -20
save
for b in gdn_core_bench_main gdn_core_bench; do echo "== $b"; timeout 30 bin/$b --len 32768,131072 --chunk-len 2048 --reps 10; done > $D/bench.log 2>&1; echo "bench $((SECONDS-T0)) s"
save
grep -E "^== |^ +(32768|131072) +rows +off auto \|" $D/bench.log | cut -c1-230
