# gemmseven run 1: prebuilt binaries of gemmseven (short-row GEMM algorithm, lever gemm_short, untried).
# (1) CUDA tests of the GEMMs and the mixers with gemm_short on; (2) gemm_bench: the heuristic's
# candidates at 1K/2K/32K rows for gdn-1.3b's projections; (3) chunk tax gdn-1.3b 32K: defaults at
# N = 1, 16, 32, then gemm_short on at N = 32, and the breakdown of N = 32 with gemm_short on.
L=/tmp/logs-gemmseven; rm -rf $L; mkdir -p bin .deps/root $L && tar -C bin -xJf .gpu-gemmseven/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
D=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$D/openblas-pthread:$D:$N/lib:$C/lib:$LD_LIBRARY_PATH
T0=$SECONDS
save() { tar -C /tmp -czf $OUT/logs.tgz logs-gemmseven; }
fits() { (( SECONDS - T0 + $1 <= ${BUDGET:-150} )); }
F='GemmCuda*:*OpDefCuda*linear*:*OpDefCuda*lm_head*:*MixerConformanceCuda*:*CrossEntropy*'
STATEFLOW_LEVERS_ON=gemm_short timeout 60 bin/stateflow_cuda_tests --gtest_filter="$F" > $L/tests.log 2>&1; echo "tests rc=$? $((SECONDS-T0)) s"; save
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran|rms rel error" $L/tests.log | head -30
fits 25 && { timeout 25 bin/gemm_bench --count 6 --reps 10 > $L/gemm_bench.log 2>&1; echo "gemm_bench rc=$? $((SECONDS-T0)) s"; save; grep -E "^\|" $L/gemm_bench.log; }
B="bench --device cuda --dtype f32 --preset gdn-1.3b --stages 1 --seq-len 32768 --batch 1 --microbatches 1 --schedules stateflow --warmup-steps 1 --steps 2"
fits 30 && { timeout 30 bin/stateflow $B --chunk-sweep 1,16,32 > $L/tax-defaults.log 2>&1; echo "tax defaults rc=$? $((SECONDS-T0)) s"; save; grep -E "^stateflow +[0-9]" $L/tax-defaults.log; }
fits 15 && { STATEFLOW_LEVERS_ON=gemm_short timeout 15 bin/stateflow $B --chunk-sweep 32 > $L/tax-short.log 2>&1; echo "tax short rc=$? $((SECONDS-T0)) s"; save; grep -E "^stateflow +[0-9]" $L/tax-short.log; }
fits 20 && { STATEFLOW_LEVERS_ON=gemm_short timeout 20 bin/stateflow $B --chunk-sweep 32 --breakdown > $L/tax-short-breakdown.log 2>&1; echo "tax short breakdown rc=$? $((SECONDS-T0)) s"; save; grep -E "^stateflow +[0-9]|proj" $L/tax-short-breakdown.log; }
echo "total $((SECONDS-T0)) s"
