# normseven run 1 (prebuilt, sm_90a Release): the untried levers norm_tickets, gate_tickets,
# conv_tickets, l2norm_pair: their tests (and the GDN's chunked-bitwise conformance) with them on,
# the chunk-tax bench (gdn-1.3b, 32K, N = 1, 16, 32, --breakdown) off and on, and kernels_bench's
# per-op rows back to back at 1K, 2K and 32K tokens, off and on. One log tar in $OUT.
mkdir -p bin .deps/root /tmp/logs-normseven && tar -C bin -xJf .gpu-normseven/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH
G=/tmp/logs-normseven; T0=$SECONDS
save() { tar -C /tmp -czf $OUT/logs.tgz logs-normseven; }
ON=norm_tickets,gate_tickets,conv_tickets,l2norm_pair
nvidia-smi > $G/nvidia-smi.txt 2>&1
F='*NormsCuda*:*GdnGatesCuda*:*ShortConvCuda*:*OpDefCuda*norm*:*OpDefCuda*conv*:*OpDefCuda*gates*:*MixerConformanceCuda*gdn*ChunksAtMultiples*:*MixerConformanceCuda*gdn*LossAndGradients*'
STATEFLOW_LEVERS_ON=$ON timeout 60 bin/stateflow_cuda_tests --gtest_filter="$F" > $G/tests-on.log 2>&1; echo "tests rc=$? $((SECONDS-T0)) s"; save
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" $G/tests-on.log | head -20
B="bench --device cuda --dtype f32 --preset gdn-1.3b --stages 1 --seq-len 32768 --batch 1 --microbatches 1 --schedules stateflow --warmup-steps 1 --steps 2 --chunk-sweep 1,16,32 --breakdown"
STATEFLOW_LEVERS_ON= timeout 45 bin/stateflow $B > $G/tax-off.log 2>&1; echo "tax off rc=$? $((SECONDS-T0)) s"; save
STATEFLOW_LEVERS_ON=$ON timeout 45 bin/stateflow $B > $G/tax-on.log 2>&1; echo "tax on rc=$? $((SECONDS-T0)) s"; save
for f in off on; do echo "-- $f"; grep -E "^stateflow +[0-9]" $G/tax-$f.log; grep -E "^ +(block.rmsnorm|gdn.out_norm|gdn.conv|gdn.gates|gdn.l2norm) +backward|^ +(gdn.l2norm) +forward" $G/tax-$f.log; done
K="--ops rmsnorm,gated_rmsnorm,l2norm,short_conv,gdn_gates --back-to-back --reps 20 --train-steps 0"
for T in 1024 2048 32768; do for f in off on; do
  if [ $f = on ]; then L_ON=$ON; else L_ON=; fi
  STATEFLOW_LEVERS_ON=$L_ON timeout 20 bin/kernels_bench --tokens $T $K > $G/kb-$T-$f.log 2>&1; echo "kb $T $f rc=$? $((SECONDS-T0)) s"
done; done; save
for T in 1024 2048 32768; do for f in off on; do echo "-- kb $T $f"; grep -E "bwd|fwd" $G/kb-$T-$f.log | grep -v "^|"; done; done
echo "total $((SECONDS-T0)) s"
