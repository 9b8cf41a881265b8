# gemmsix run 1: fused projections (lever fused_proj, untried): tests with it on, then the chunk-tax
# bench (--breakdown) with it off and on, and kernels_bench's whole step with it on (off if time is left).
mkdir -p bin .deps/root /tmp/logs && tar -C bin -xJf .gpu-gemmsix/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH
T0=$SECONDS
save() { tar -C /tmp -czf $OUT/logs.tgz logs; }
fits() { (( SECONDS - T0 + $1 <= 170 )); }
nvidia-smi > /tmp/logs/nvidia-smi.txt 2>&1
F='*ColumnBlock*:*AdamWCuda*:*MixerConformanceCuda*Fused*:*MixerConformanceCuda*ChunksAtMultiples*:*MixerConformanceCuda*LossAndGradients*:*MixerConformanceCuda*SideStream*:*GemmCuda*:*WeightGrad*:*Checkpoint*:*OpDefCuda*swiglu*'
STATEFLOW_LEVERS_ON=fused_proj timeout 55 bin/stateflow_cuda_tests --gtest_filter="$F" > /tmp/logs/tests-fused.log 2>&1; echo "tests rc=$? $((SECONDS-T0)) s"; save
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran" /tmp/logs/tests-fused.log | head -20
grep -E "fused vs separate" /tmp/logs/tests-fused.log | head -12
B="bench --device cuda --dtype f32 --preset gdn-1.3b --stages 1 --seq-len 32768 --batch 1 --microbatches 1 --schedules stateflow --warmup-steps 1 --steps 2 --chunk-sweep 1,16,32 --breakdown"
STATEFLOW_LEVERS_ON= timeout 45 bin/stateflow $B > /tmp/logs/tax-off.log 2>&1; echo "off rc=$? $((SECONDS-T0)) s"; save
STATEFLOW_LEVERS_ON=fused_proj timeout 45 bin/stateflow $B > /tmp/logs/tax-on.log 2>&1; echo "on rc=$? $((SECONDS-T0)) s"; save
for f in off on; do echo "-- $f"; grep -E "^stateflow +[0-9]" /tmp/logs/tax-$f.log; done
fits 40 && { STATEFLOW_LEVERS_ON=fused_proj timeout 40 bin/kernels_bench --reps 3 --train-steps 3 > /tmp/logs/kernels-on.log 2>&1; echo "kb on rc=$? $((SECONDS-T0)) s"; save; }
fits 40 && { STATEFLOW_LEVERS_ON= timeout 40 bin/kernels_bench --reps 3 --train-steps 3 > /tmp/logs/kernels-off.log 2>&1; echo "kb off rc=$? $((SECONDS-T0)) s"; save; }
for f in on off; do echo "-- kb $f"; grep -E "MFU|best GEMM|tokens/s" /tmp/logs/kernels-$f.log 2>/dev/null | tail -4; done
echo "total $((SECONDS-T0)) s"
