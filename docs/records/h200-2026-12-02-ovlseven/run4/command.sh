# ovlseven run 4: the final overlap (backward only: B4 beside B3; the forward in sequence again), prebuilt
# at the landing candidate: its overlap tests, gdn_core_bench off vs on (defaults: segments of 64 on 2
# streams) at 32K and 128K in one call, and the chunk-tax line at N = 1 (the only N of 1, 16, 32 whose
# 32K chunk is long enough for the overlap) with the lever off and on.
mkdir -p bin .deps/root /tmp/logs-ovlseven4 && tar -C bin -xJf .gpu-ovlseven/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH
G=/tmp/logs-ovlseven4; T0=$SECONDS; save() { cp .gpu-ovlseven/run4.sh $G/command.sh; tar -C /tmp -czf $OUT/logs4.tgz logs-ovlseven4; }
timeout 40 bin/stateflow_cuda_tests --gtest_filter='StreamWaitCuda.*:GdnCoreCuda.Overlap*:GdnCoreCuda.RejectsUnsupportedSizes' > $G/tests-overlap.log 2>&1; echo "tests rc=$? $((SECONDS-T0)) s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $G/tests-overlap.log; save
timeout 50 bin/gdn_core_bench --len 32768,131072 --reps 5 --overlap off,on > $G/bench.log 2>&1; echo "bench rc=$? $((SECONDS-T0)) s"; grep -A5 "f+b ms" $G/bench.log | cut -c1-200; save
B="bench --device cuda --dtype f32 --preset gdn-1.3b --stages 1 --seq-len 32768 --batch 1 --microbatches 1 --schedules stateflow --warmup-steps 1 --steps 3 --chunk-sweep 1"
timeout 30 bin/stateflow $B > $G/tax-off.log 2>&1; echo "tax off rc=$? $((SECONDS-T0)) s"; grep -E "^stateflow +[0-9]" $G/tax-off.log; save
STATEFLOW_LEVERS_ON=core_overlap timeout 30 bin/stateflow $B > $G/tax-on.log 2>&1; echo "tax on rc=$? $((SECONDS-T0)) s"; grep -E "^stateflow +[0-9]" $G/tax-on.log; save
