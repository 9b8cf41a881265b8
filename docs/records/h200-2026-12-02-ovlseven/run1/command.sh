# ovlseven run 1: the GDN core overlap (untried lever core_overlap) on the H200: its tests (stream
# waits; overlap bitwise the sequential stages; the GDN tests with the lever on), then gdn_core_bench
# overlap off vs on in one call (segments 8-64 at 32K, 128K, sweep_warps 8, 2048-token chunks).
mkdir -p bin .deps/root /tmp/logs-ovlseven && tar -C bin -xJf .gpu-ovlseven/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH
G=/tmp/logs-ovlseven; T0=$SECONDS; save() { cp .gpu-ovlseven/run1.sh $G/command.sh; tar -C /tmp -czf $OUT/logs1.tgz logs-ovlseven; }
nvidia-smi --query-gpu=name,driver_version --format=csv > $G/gpu.txt 2>&1
timeout 120 bin/stateflow_cuda_tests --gtest_filter='StreamWaitCuda.*:GdnCoreCuda.Overlap*:GdnCoreCuda.RejectsUnsupportedSizes:GdnCoreCuda.Default*' > $G/tests-overlap.log 2>&1; echo "overlap tests rc=$? $((SECONDS-T0)) s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $G/tests-overlap.log; save
STATEFLOW_LEVERS_ON=core_overlap timeout 200 bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda*:*OpDefCuda*gdn_core*:*MixerConformanceCuda*gdn*:GdnKeptSweepCuda*' > $G/tests-lever-on.log 2>&1; echo "lever-on tests rc=$? $((SECONDS-T0)) s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $G/tests-lever-on.log; save
timeout 150 bin/gdn_core_bench --len 32768 --reps 10 --overlap off,on --overlap-segment 8,16,32,64 > $G/bench-32k.log 2>&1; echo "bench 32K rc=$? $((SECONDS-T0)) s"; grep -A7 "f+b ms" $G/bench-32k.log | cut -c1-200; save
timeout 100 bin/gdn_core_bench --len 131072 --reps 5 --overlap off,on --overlap-segment 32 > $G/bench-128k.log 2>&1; echo "bench 128K rc=$? $((SECONDS-T0)) s"; grep -A3 "f+b ms" $G/bench-128k.log | cut -c1-200; save
timeout 100 bin/gdn_core_bench --len 32768 --reps 10 --sweep-warps 8 --overlap off,on --overlap-segment 16,32 > $G/bench-warps8.log 2>&1; echo "bench warps 8 rc=$? $((SECONDS-T0)) s"; grep -A4 "f+b ms" $G/bench-warps8.log | cut -c1-200; save
timeout 100 bin/gdn_core_bench --len 32768 --reps 10 --chunk-len 2048 --overlap off,on --overlap-segment 4,8 > $G/bench-chunks.log 2>&1; echo "bench chunks rc=$? $((SECONDS-T0)) s"; grep -A7 "In chunks" $G/bench-chunks.log | cut -c1-200; save
