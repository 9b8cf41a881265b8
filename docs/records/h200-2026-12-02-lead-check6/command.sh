# Lead: check of main after the sixth round: every CUDA test (defaults; then the untried levers on, GDN/mixer filters),
# the GDN core old vs new, the chunk tax (defaults, keep_sweep), the whole step (defaults, keep_sweep)
mkdir -p bin .deps/root /tmp/lead6 && tar -C bin -xJf .gpu-bin/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH; T0=$SECONDS; G=/tmp/lead6
save() { tar -C /tmp -czf $OUT/logs.tgz lead6; }
echo '{"preset": "gdn-1.3b", "gdn": {"keep_sweep": true}}' > $G/keep_sweep.json
nvidia-smi > $G/nvidia-smi.txt 2>&1
STATEFLOW_LEVERS_ON= timeout 170 bin/stateflow_cuda_tests > $G/cuda-tests-defaults.log 2>&1; echo "1 rc=$? $((SECONDS-T0)) s"; save
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $G/cuda-tests-defaults.log | head
timeout 40 bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda.QuarterSweepCopyWarpGivesTheSameBits' > $G/multicast-test.log 2>&1; MC=$?; echo "1b multicast test rc=$MC $((SECONDS-T0)) s"; save
UNTRIED=$(sed -n 's/.*kUntriedLevers\[\] = {\(.*\)};.*/\1/p' src/kernels/cuda/levers.h | tr -d '" '); [[ $MC == 0 ]] || UNTRIED=${UNTRIED/sweep_multicast/}; echo "untried: $UNTRIED"
STATEFLOW_LEVERS_ON=$UNTRIED timeout 90 bin/stateflow_cuda_tests --gtest_filter='*Gdn*:*gdn*:*MixerConformanceCuda*:*OpDefCuda*:*Fused*:*Graphs*' > $G/cuda-tests-untried.log 2>&1; echo "2 rc=$? $((SECONDS-T0)) s"; save
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $G/cuda-tests-untried.log | head
for v in "old:pre_mma,b4_ring,b4_ring_early" "new:"; do
  STATEFLOW_LEVERS_OFF=${v#*:} timeout 60 bin/gdn_core_bench --len 32768,131072 --chunk-len 2048 --reps 10 > $G/gdn-core-${v%%:*}.log 2>&1; echo "3 ${v%%:*} rc=$? $((SECONDS-T0)) s"
done; save
if [[ $MC == 0 ]]; then
  STATEFLOW_LEVERS_ON=sweep_multicast timeout 60 bin/gdn_core_bench --len 32768,131072 --chunk-len 2048 --reps 10 > $G/gdn-core-multicast8.log 2>&1; echo "3 mc8 rc=$? $((SECONDS-T0)) s"
  STATEFLOW_GDN_CLUSTER=4 STATEFLOW_LEVERS_ON=sweep_multicast timeout 40 bin/gdn_core_bench --len 32768 --reps 10 > $G/gdn-core-multicast4.log 2>&1; echo "3 mc4 rc=$? $((SECONDS-T0)) s"
  timeout 30 bin/gdn_core_bench --len 32768 --reps 10 > $G/gdn-core-new-again.log 2>&1; echo "3 new again rc=$? $((SECONDS-T0)) s"; save
fi
for c in defaults keep_sweep; do
  a=(); e=(); [[ $c == keep_sweep ]] && a=(--config $G/keep_sweep.json); [[ $c == graphs ]] && e=(STATEFLOW_LEVERS_ON=graphs)
  env "${e[@]}" timeout 70 bin/stateflow bench --device cuda --dtype f32 --preset gdn-1.3b --stages 1 --seq-len 32768 --batch 1 --microbatches 1 --schedules stateflow --warmup-steps 1 --steps 2 --chunk-sweep 1,16,32 "${a[@]}" > $G/tax-$c.log 2>&1; echo "4 $c rc=$? $((SECONDS-T0)) s"; save
  grep -E "^stateflow +[0-9]" $G/tax-$c.log | head -4
done
for c in defaults keep_sweep; do
  a=(); [[ $c == keep_sweep ]] && a=(--train-config $G/keep_sweep.json)
  timeout 60 bin/kernels_bench --reps 3 --train-steps 3 "${a[@]}" > $G/kb-$c.log 2>&1; echo "5 $c rc=$? $((SECONDS-T0)) s"; save
  grep -E "tokens/s|best GEMM" $G/kb-$c.log | tail -3
done
