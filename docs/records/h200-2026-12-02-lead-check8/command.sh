# Run from the repository root on the device with carry [".gpu-bin", ".deps"]: bash .gpu-bin/check8.sh (bin.tar.xz: stateflow, stateflow_cuda_tests, gdn_core_bench, kernels_bench, gemm_bench of main at 3ce646a, Release, sm_90a, built on the development machine)
# Lead: check of main after the eighth round: every CUDA test (defaults), flakeeight's band seeds and repeats,
# the untried levers' GDN filters, the sweep warps' shared copies (copy warp off), the GDN core (old = the
# seventh session's defaults, vs defaults; overlap off/on; 2K chunks), the chunk tax (old, defaults), the whole step.
mkdir -p bin .deps/root /tmp/lead8 && tar -C bin -xJf .gpu-bin/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH; T0=$SECONDS; G=/tmp/lead8
save() { tar -C /tmp -czf $OUT/logs.tgz lead8; }
OLD=sweep_copy_lines,sweep_deep,b2_lean,pre_late_v,b4_lean,gates_beside,residual_epilogue
echo '{"preset": "gdn-1.3b", "gdn": {"keep_sweep": true}}' > $G/keep_sweep.json
nvidia-smi > $G/nvidia-smi.txt 2>&1
timeout 230 bin/stateflow_cuda_tests > $G/cuda-tests-defaults.log 2>&1; echo "1 rc=$? $((SECONDS-T0)) s"; save
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $G/cuda-tests-defaults.log | head -12
F='Mixers/MixerConformanceCuda.LossAndGradientsMatchTheCpuModelInTheBf16Band/*:Mixers/MixerConformanceCuda.ChunksElsewhereStayWithinTwiceTheUnchunkedError/*:Mixers/MixerConformanceCuda.FusedProjectionsStayWithinTwiceTheSeparateError/*'
STATEFLOW_TEST_SEED=7316831977980715641 timeout 50 bin/stateflow_cuda_tests --gtest_filter="$F" > $G/band-seed.log 2>&1; echo "1b rc=$? $((SECONDS-T0)) s"
grep -E "per-head scalars|PASSED|FAILED" $G/band-seed.log | grep -E "gdn|PASSED|FAILED" | head -8
timeout 50 bin/stateflow_cuda_tests --gtest_filter="$F" --gtest_repeat=2 > $G/band-repeat.log 2>&1; echo "1c rc=$? $((SECONDS-T0)) s"; grep -c "FAILED  \]" $G/band-repeat.log; grep -c "OK \]" $G/band-repeat.log; save
STATEFLOW_TEST_SEED=18242146499805860504 timeout 30 bin/stateflow_cuda_tests --gtest_filter=GdnCoreCuda.RowSweepsMatchFloat64RecurrenceAsTheTileSweepsDo > $G/rowsweep-seed.log 2>&1; echo "1d rc=$? $((SECONDS-T0)) s"
UNTRIED=$(sed -n 's/.*kUntriedLevers\[\] = {\(.*\)};.*/\1/p' src/kernels/cuda/levers.h | tr -d '" '); echo "untried: $UNTRIED"
STATEFLOW_LEVERS_ON=$UNTRIED timeout 90 bin/stateflow_cuda_tests --gtest_filter='*Gdn*:*gdn*:*MixerConformanceCuda*:*OpDefCuda*:*Fused*:*Graphs*' > $G/cuda-tests-untried.log 2>&1; echo "2 rc=$? $((SECONDS-T0)) s"; save
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $G/cuda-tests-untried.log | head
STATEFLOW_LEVERS_OFF=sweep_copy_warp timeout 60 bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda.*:GdnKeptSweepCuda.*:-GdnCoreCuda.TheOverlapRuns*' > $G/nocw-tests.log 2>&1; echo "3 rc=$? $((SECONDS-T0)) s"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $G/nocw-tests.log | head -5
for c in defaults old nocw; do
  off=; [[ $c == old ]] && off=$OLD; [[ $c == nocw ]] && off=sweep_copy_warp
  STATEFLOW_LEVERS_OFF=$off timeout 45 bin/gdn_core_bench --len 32768,131072 --chunk-len 2048 --reps 10 --overlap off,on > $G/gdn-core-$c.log 2>&1; echo "4 $c rc=$? $((SECONDS-T0)) s"; save
done
for c in old defaults; do
  off=; [[ $c == old ]] && off=$OLD
  STATEFLOW_LEVERS_OFF=$off timeout 70 bin/stateflow bench --device cuda --dtype f32 --preset gdn-1.3b --stages 1 --seq-len 32768 --batch 1 --microbatches 1 --schedules stateflow --warmup-steps 1 --steps 2 --chunk-sweep 1,16,32 > $G/tax-$c.log 2>&1; echo "5 $c rc=$? $((SECONDS-T0)) s"; save
  grep -E "^stateflow +[0-9]" $G/tax-$c.log | head -4
done
for c in defaults keep_sweep; do
  a=(); [[ $c == keep_sweep ]] && a=(--train-config $G/keep_sweep.json)
  timeout 60 bin/kernels_bench --reps 3 --train-steps 3 "${a[@]}" > $G/kb-$c.log 2>&1; echo "6 $c rc=$? $((SECONDS-T0)) s"; save
  grep -E "tokens/s|best GEMM" $G/kb-$c.log | tail -3
done
echo "total $((SECONDS-T0)) s"
