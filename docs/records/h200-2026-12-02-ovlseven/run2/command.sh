# ovlseven run 2: the GDN core overlap with its launches on 1, 2 or 4 streams and B3 from a kept sweep
# on two row groups a block (B4 on the other SMs): tests (lever on), gdn_core_bench off vs on in one
# call at 32K (segments 32, 64 x streams 1, 2, 4; main's binary (4829fef, kernels as 9547646) first) and 128K,
# then the chunk-tax line on vs off.
mkdir -p bin .deps/root /tmp/logs-ovlseven2 && tar -C bin -xJf .gpu-ovlseven/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH
G=/tmp/logs-ovlseven2; T0=$SECONDS; save() { cp .gpu-ovlseven/run2.sh $G/command.sh; tar -C /tmp -czf $OUT/logs2.tgz logs-ovlseven2; }
STATEFLOW_LEVERS_ON=core_overlap timeout 100 bin/stateflow_cuda_tests --gtest_filter='StreamWaitCuda.*:GdnCoreCuda*:*MixerConformanceCuda*gdn*:GdnKeptSweepCuda*' > $G/tests-lever-on.log 2>&1; echo "tests rc=$? $((SECONDS-T0)) s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $G/tests-lever-on.log; save
timeout 30 bin/gdn_core_bench_main --len 32768 --reps 5 > $G/bench-32k-main.log 2>&1; echo "bench 32K main rc=$? $((SECONDS-T0)) s"; grep -A2 "f+b ms" $G/bench-32k-main.log | cut -c1-200; save
timeout 100 bin/gdn_core_bench --len 32768 --reps 5 --overlap off,on --overlap-segment 32,64 --overlap-streams 1,2,4 > $G/bench-32k.log 2>&1; echo "bench 32K rc=$? $((SECONDS-T0)) s"; grep -A8 "f+b ms" $G/bench-32k.log | cut -c1-200; save
timeout 60 bin/gdn_core_bench --len 131072 --reps 3 --overlap off,on --overlap-segment 64 --overlap-streams 2 > $G/bench-128k.log 2>&1; echo "bench 128K rc=$? $((SECONDS-T0)) s"; grep -A3 "f+b ms" $G/bench-128k.log | cut -c1-200; save
B="bench --device cuda --dtype f32 --preset gdn-1.3b --stages 1 --seq-len 32768 --batch 1 --microbatches 1 --schedules stateflow --warmup-steps 1 --steps 2 --chunk-sweep 1,16,32"
timeout 80 bin/stateflow $B > $G/tax-off.log 2>&1; echo "tax off rc=$? $((SECONDS-T0)) s"; grep -E "^stateflow +[0-9]|stage 0:" $G/tax-off.log; save
STATEFLOW_LEVERS_ON=core_overlap timeout 80 bin/stateflow $B > $G/tax-on.log 2>&1; echo "tax on rc=$? $((SECONDS-T0)) s"; grep -E "^stateflow +[0-9]|stage 0:" $G/tax-on.log; save
