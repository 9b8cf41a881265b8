# Lead's check of main (fifth session): defaults, then every untried lever, then the measurements
mkdir -p bin .deps/root /tmp/logs && tar -C bin -xJf .gpu-bin/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH
UNTRIED=$(sed -n 's/.*kUntriedLevers\[\] = {\(.*\)};.*/\1/p' src/kernels/cuda/levers.h | tr -d '" ')
save() { tar -C /tmp -czf $OUT/logs.tgz logs; }
echo "untried: $UNTRIED"; T0=$SECONDS
# 1. main as users get it: every CUDA test and the GDN/kernels benches with the defaults
STATEFLOW_LEVERS_ON= OUT=/tmp/logs PREBUILT=$PWD/bin SANITIZE=0 timeout 200 bash tools/gpu-check.sh > /tmp/logs/gpu-check.log 2>&1
save; echo "1 done $((SECONDS-T0)) s"; tail -8 /tmp/logs/gpu-check.log
# 2. every CUDA test with all untried levers on
STATEFLOW_LEVERS_ON=$UNTRIED timeout 150 bin/stateflow_cuda_tests > /tmp/logs/cuda-tests-untried.log 2>&1; save; echo "2 rc=$? $((SECONDS-T0)) s"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" /tmp/logs/cuda-tests-untried.log | head -20
# 3. GDN core: untried levers on vs off, same call
for on in "" tile_copies sweep_copy_warp tile_copies,sweep_copy_warp; do
  echo "== STATEFLOW_LEVERS_ON=$on"; STATEFLOW_LEVERS_ON=$on timeout 35 bin/gdn_core_bench --len 32768,131072 --chunk-len 2048 --reps 10
done > /tmp/logs/gdn-core-levers.log 2>&1; save; echo "3 done $((SECONDS-T0)) s"
# 4. chunk tax: defaults, chunktax5's levers, then graphs
B="bench --device cuda --dtype f32 --preset gdn-1.3b --stages 1 --seq-len 32768 --batch 1 --microbatches 1 --schedules stateflow --warmup-steps 1 --steps 2 --chunk-sweep 1,16,32"
STATEFLOW_LEVERS_ON= timeout 70 bin/stateflow $B --breakdown > /tmp/logs/tax-default.log 2>&1; save; echo "4a rc=$? $((SECONDS-T0)) s"
STATEFLOW_LEVERS_ON=conv_narrow,reduce_deep,norm_staged,reduce_group timeout 70 bin/stateflow $B --breakdown > /tmp/logs/tax-ct5.log 2>&1; save; echo "4b rc=$? $((SECONDS-T0)) s"
STATEFLOW_LEVERS_ON=graphs timeout 50 bin/stateflow $B > /tmp/logs/tax-graphs.log 2>&1; save; echo "4c rc=$? $((SECONDS-T0)) s"
STATEFLOW_LEVERS_ON=$UNTRIED timeout 50 bin/stateflow $B > /tmp/logs/tax-all-untried.log 2>&1; save; echo "4d rc=$? $((SECONDS-T0)) s"
for f in default ct5 graphs all-untried; do echo "-- $f"; grep -E "^stateflow +[0-9]" /tmp/logs/tax-$f.log; done
# 5. whole step with every untried lever on (gpu-check ran it with the defaults)
STATEFLOW_LEVERS_ON=$UNTRIED timeout 80 bin/kernels_bench --reps 3 --train-steps 3 > /tmp/logs/kernels-untried.log 2>&1; save; echo "5 rc=$? $((SECONDS-T0)) s"
grep -iE "tok.*s|best GEMM|graph" /tmp/logs/kernels_bench.log /tmp/logs/kernels-untried.log | tail -12
tar -C /tmp -czf $OUT/logs.tgz logs
