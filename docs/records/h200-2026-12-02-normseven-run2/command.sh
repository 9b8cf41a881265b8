# normseven run 2 (prebuilt, sm_90a Release): the untried levers l2norm_pair and add_vectors as
# landed: their tests and the GDN's chunked-bitwise conformance with them on, the chunk-tax bench
# (gdn-1.3b, 32K, N = 1, 16, 32) off and on (on with --breakdown), and the norms' kernels_bench rows
# at 32K (median of single calls, as the sixth check). One log tar in $OUT.
mkdir -p bin .deps/root /tmp/logs-normseven2 && tar -C bin -xJf .gpu-normseven/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH
G=/tmp/logs-normseven2; T0=$SECONDS
save() { tar -C /tmp -czf $OUT/logs.tgz logs-normseven2; }
ON=l2norm_pair,add_vectors
F='AddInplaceCuda*:NormsCuda*:*OpDefCuda*norm*:*MixerConformanceCuda*gdn*ChunksAtMultiples*'
STATEFLOW_LEVERS_ON=$ON timeout 40 bin/stateflow_cuda_tests --gtest_filter="$F" > $G/tests-on.log 2>&1; echo "tests rc=$? $((SECONDS-T0)) s"; save
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" $G/tests-on.log | head -20
B="bench --device cuda --dtype f32 --preset gdn-1.3b --stages 1 --seq-len 32768 --batch 1 --microbatches 1 --schedules stateflow --warmup-steps 1 --steps 2 --chunk-sweep 1,16,32"
STATEFLOW_LEVERS_ON= timeout 30 bin/stateflow $B > $G/tax-off.log 2>&1; echo "tax off rc=$? $((SECONDS-T0)) s"; save
STATEFLOW_LEVERS_ON=$ON timeout 40 bin/stateflow $B --breakdown > $G/tax-on.log 2>&1; echo "tax on rc=$? $((SECONDS-T0)) s"; save
for f in off on; do echo "-- $f"; grep -E "^stateflow +[0-9]" $G/tax-$f.log; done
grep -E "^ +(block.residual_add|gdn.l2norm|block.rmsnorm|gdn.out_norm) " $G/tax-on.log
timeout 15 bin/kernels_bench --ops rmsnorm,gated_rmsnorm,l2norm --reps 20 --train-steps 0 > $G/kb-32768.log 2>&1; echo "kb rc=$? $((SECONDS-T0)) s"; save
grep -E "fwd|bwd" $G/kb-32768.log | grep -v "^|"
echo "total $((SECONDS-T0)) s"
