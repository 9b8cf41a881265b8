# gemmseven run 2: prebuilt binaries of gemmseven (gemm_short default; gemm_short_split untried: the
# short-row pin with K split where its tiles fill under half a wave). (1) GEMM tests with
# gemm_short_split on; (2) gemm_bench with it on (the pins it makes); (3) chunk tax gdn-1.3b 32K:
# defaults N = 1, 16, 32; gemm_short off at N = 32; gemm_short_split on at N = 32, and its breakdown;
# (4) kernels_bench whole step with the defaults, if time allows.
L=/tmp/logs-gemmseven; rm -rf $L; mkdir -p bin .deps/root $L && tar -C bin -xJf .gpu-gemmseven/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
D=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$D/openblas-pthread:$D:$N/lib:$C/lib:$LD_LIBRARY_PATH
T0=$SECONDS
save() { tar -C /tmp -czf $OUT/logs.tgz logs-gemmseven; }
fits() { (( SECONDS - T0 + $1 <= ${BUDGET:-100} )); }
F='GemmCuda*:*OpDefCuda*linear*:*OpDefCuda*lm_head*'
STATEFLOW_LEVERS_ON=gemm_short_split timeout 30 bin/stateflow_cuda_tests --gtest_filter="$F" > $L/tests.log 2>&1; echo "tests rc=$? $((SECONDS-T0)) s"; save
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran|rms rel error" $L/tests.log | head -30
STATEFLOW_LEVERS_ON=gemm_short_split timeout 20 bin/gemm_bench --count 3 --reps 10 > $L/gemm_bench.log 2>&1; echo "gemm_bench rc=$? $((SECONDS-T0)) s"; save
grep -E "^\||pinned" $L/gemm_bench.log | grep -E "^\||short" | head -40
B="bench --device cuda --dtype f32 --preset gdn-1.3b --stages 1 --seq-len 32768 --batch 1 --microbatches 1 --schedules stateflow --warmup-steps 1 --steps 2"
fits 25 && { timeout 25 bin/stateflow $B --chunk-sweep 1,16,32 > $L/tax-defaults.log 2>&1; echo "tax defaults rc=$? $((SECONDS-T0)) s"; save; grep -E "^stateflow +[0-9]" $L/tax-defaults.log; }
fits 15 && { STATEFLOW_LEVERS_ON=gemm_short_split timeout 15 bin/stateflow $B --chunk-sweep 32 > $L/tax-split.log 2>&1; echo "tax split rc=$? $((SECONDS-T0)) s"; save; grep -E "^stateflow +[0-9]" $L/tax-split.log; }
fits 15 && { STATEFLOW_LEVERS_OFF=gemm_short timeout 15 bin/stateflow $B --chunk-sweep 32 > $L/tax-short-off.log 2>&1; echo "tax short off rc=$? $((SECONDS-T0)) s"; save; grep -E "^stateflow +[0-9]" $L/tax-short-off.log; }
fits 15 && { STATEFLOW_LEVERS_ON=gemm_short_split timeout 15 bin/stateflow $B --chunk-sweep 32 --breakdown > $L/tax-split-breakdown.log 2>&1; echo "tax split breakdown rc=$? $((SECONDS-T0)) s"; save; grep -E "^stateflow +[0-9]|proj" $L/tax-split-breakdown.log; }
fits 25 && { timeout 25 bin/kernels_bench --reps 3 --train-steps 3 > $L/kernels.log 2>&1; echo "kb rc=$? $((SECONDS-T0)) s"; save; grep -E "^\| [0-9]" $L/kernels.log | tail -1; }
echo "total $((SECONDS-T0)) s"
