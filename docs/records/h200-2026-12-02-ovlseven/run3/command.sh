# ovlseven run 3: the overlap with the sweeps' counting as a template parameter (the sequential path is
# the old code again) and segments of 64 by default: its tests with the lever on, then gdn_core_bench in
# one call: main's binary (4829fef) and this build with the overlap off and on (64x2, 32x2), 32K and
# 128K, and 32K in 2048-token chunks (bytes differing from one call; the overlap does not engage there).
mkdir -p bin .deps/root /tmp/logs-ovlseven3 && tar -C bin -xJf .gpu-ovlseven/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH
G=/tmp/logs-ovlseven3; T0=$SECONDS; save() { cp .gpu-ovlseven/run3.sh $G/command.sh; tar -C /tmp -czf $OUT/logs3.tgz logs-ovlseven3; }
STATEFLOW_LEVERS_ON=core_overlap timeout 100 bin/stateflow_cuda_tests --gtest_filter='StreamWaitCuda.*:GdnCoreCuda*:*MixerConformanceCuda*gdn*:GdnKeptSweepCuda*:*OpDefCuda*gdn_core*' > $G/tests-lever-on.log 2>&1; echo "tests rc=$? $((SECONDS-T0)) s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $G/tests-lever-on.log; save
timeout 40 bin/gdn_core_bench_main --len 32768,131072 --reps 5 > $G/bench-main.log 2>&1; echo "bench main rc=$? $((SECONDS-T0)) s"; grep -A3 "f+b ms" $G/bench-main.log | cut -c1-200; save
timeout 80 bin/gdn_core_bench --len 32768,131072 --reps 5 --overlap off,on --overlap-segment 64,32 --overlap-streams 2 > $G/bench-new.log 2>&1; echo "bench new rc=$? $((SECONDS-T0)) s"; grep -A7 "f+b ms" $G/bench-new.log | cut -c1-200; save
timeout 40 bin/gdn_core_bench --len 32768 --reps 5 --chunk-len 2048 --overlap off,on > $G/bench-chunks.log 2>&1; echo "bench chunks rc=$? $((SECONDS-T0)) s"; grep -A4 "In chunks" $G/bench-chunks.log | cut -c1-200; save
