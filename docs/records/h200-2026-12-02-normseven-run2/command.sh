# normseven run 2 (prebuilt, sm_90a Release): the untried levers l2norm_pair, add_vectors and
# dw_beside as landed: their tests and the model-level side-stream and chunked-bitwise
# conformance (dw_beside on and off inside the side-stream test), then the chunk-tax bench
# (gdn-1.3b, 32K, N = 1, 16, 32) with the levers off and on in the same call. One log tar in $OUT.
mkdir -p bin .deps/root /tmp/logs-normseven2 && tar -C bin -xJf .gpu-normseven/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH
G=/tmp/logs-normseven2; T0=$SECONDS
save() { tar -C /tmp -czf $OUT/logs.tgz logs-normseven2; }
ON=l2norm_pair,add_vectors,dw_beside
F='AddInplaceCuda*:NormsCuda*TwoL2*:NormsCuda*DwReduction*:*MixerConformanceCuda*SideStream*:*MixerConformanceCuda*gdn*ChunksAtMultiples*'
STATEFLOW_LEVERS_ON=$ON timeout 50 bin/stateflow_cuda_tests --gtest_filter="$F" > $G/tests-on.log 2>&1; echo "tests rc=$? $((SECONDS-T0)) s"; save
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|first difference" $G/tests-on.log | head -30
B="bench --device cuda --dtype f32 --preset gdn-1.3b --stages 1 --seq-len 32768 --batch 1 --microbatches 1 --schedules stateflow --warmup-steps 1 --steps 2 --chunk-sweep 1,16,32"
STATEFLOW_LEVERS_ON= timeout 30 bin/stateflow $B > $G/tax-off.log 2>&1; echo "tax off rc=$? $((SECONDS-T0)) s"; save
STATEFLOW_LEVERS_ON=$ON timeout 30 bin/stateflow $B > $G/tax-on.log 2>&1; echo "tax on rc=$? $((SECONDS-T0)) s"; save
for f in off on; do echo "-- $f"; grep -E "^stateflow +[0-9]" $G/tax-$f.log; done
echo "total $((SECONDS-T0)) s"
