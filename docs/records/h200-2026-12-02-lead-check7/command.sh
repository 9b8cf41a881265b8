# Lead: check of main after the seventh round: every CUDA test (defaults), the mamba3 band seeds, the untried levers'
# GDN/mixer filters, the GDN core (overlap off/on), the chunk tax (old = this session's levers off, defaults, keep_sweep),
# the whole step (defaults, old, keep_sweep)
mkdir -p bin .deps/root /tmp/lead7 && tar -C bin -xJf .gpu-bin/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH; T0=$SECONDS; G=/tmp/lead7
save() { tar -C /tmp -czf $OUT/logs.tgz lead7; }
OLD=graphs,gemm_short,l2norm_pair,add_vectors,dw_beside,core_overlap
echo '{"preset": "gdn-1.3b", "gdn": {"keep_sweep": true}}' > $G/keep_sweep.json
nvidia-smi > $G/nvidia-smi.txt 2>&1
timeout 200 bin/stateflow_cuda_tests > $G/cuda-tests-defaults.log 2>&1; echo "1 rc=$? $((SECONDS-T0)) s"; save
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $G/cuda-tests-defaults.log | head -12
F='*MixerConformanceCuda.LossAndGradientsMatchTheCpuModelInTheBf16Band/*'
for s in 7316831977980715641 3303088979036768810 14690139011119604901; do STATEFLOW_TEST_SEED=$s timeout 60 bin/stateflow_cuda_tests --gtest_filter="$F" 2>&1 | grep -E "model on GPU|OK \]|FAILED"; done > $G/band-seeds.log
timeout 60 bin/stateflow_cuda_tests --gtest_filter="${F%/*}/mamba3*" --gtest_repeat=12 > $G/band-repeat.log 2>&1; echo "1b rc=$? $((SECONDS-T0)) s"; grep -c "FAILED  \]" $G/band-repeat.log; grep -c "OK \]" $G/band-repeat.log; save
UNTRIED=$(sed -n 's/.*kUntriedLevers\[\] = {\(.*\)};.*/\1/p' src/kernels/cuda/levers.h | tr -d '" '); echo "untried: $UNTRIED"
STATEFLOW_LEVERS_ON=$UNTRIED timeout 90 bin/stateflow_cuda_tests --gtest_filter='*Gdn*:*gdn*:*MixerConformanceCuda*:*OpDefCuda*:*Fused*:*Graphs*' > $G/cuda-tests-untried.log 2>&1; echo "2 rc=$? $((SECONDS-T0)) s"; save
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $G/cuda-tests-untried.log | head
timeout 60 bin/gdn_core_bench --len 32768,131072 --chunk-len 2048 --reps 10 --overlap off,on > $G/gdn-core.log 2>&1; echo "3 rc=$? $((SECONDS-T0)) s"; save
for c in old defaults keep_sweep; do
  a=(); [[ $c == keep_sweep ]] && a=(--config $G/keep_sweep.json); off=; [[ $c == old ]] && off=$OLD
  STATEFLOW_LEVERS_OFF=$off timeout 70 bin/stateflow bench --device cuda --dtype f32 --preset gdn-1.3b --stages 1 --seq-len 32768 --batch 1 --microbatches 1 --schedules stateflow --warmup-steps 1 --steps 2 --chunk-sweep 1,16,32 "${a[@]}" > $G/tax-$c.log 2>&1; echo "4 $c rc=$? $((SECONDS-T0)) s"; save
  grep -E "^stateflow +[0-9]" $G/tax-$c.log | head -4
done
for c in defaults old keep_sweep; do
  a=(); [[ $c == keep_sweep ]] && a=(--train-config $G/keep_sweep.json); off=; [[ $c == old ]] && off=$OLD
  STATEFLOW_LEVERS_OFF=$off timeout 60 bin/kernels_bench --reps 3 --train-steps 3 "${a[@]}" > $G/kb-$c.log 2>&1; echo "5 $c rc=$? $((SECONDS-T0)) s"; save
  grep -E "tokens/s|best GEMM" $G/kb-$c.log | tail -3
done
