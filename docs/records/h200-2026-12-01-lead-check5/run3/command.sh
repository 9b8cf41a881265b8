# Lead: the final tree (graphs guard, six levers promoted): CUDA tests with graphs on and with the defaults; the 128K hybrid step
mkdir -p bin .deps/root /tmp/logs && tar -C bin -xJf .gpu-bin/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH; T0=$SECONDS
save() { tar -C /tmp -czf $OUT/logs.tgz logs; }
STATEFLOW_LEVERS_ON=graphs timeout 150 bin/stateflow_cuda_tests > /tmp/logs/cuda-tests-graphs.log 2>&1; echo "1 rc=$? $((SECONDS-T0)) s"; save
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Skipped" /tmp/logs/cuda-tests-graphs.log | sort | uniq -c | head
timeout 150 bin/stateflow_cuda_tests > /tmp/logs/cuda-tests-defaults.log 2>&1; echo "2 rc=$? $((SECONDS-T0)) s"; save
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" /tmp/logs/cuda-tests-defaults.log | head
STATEFLOW_LEVERS_ON=graphs timeout 60 bin/stateflow bench --device cuda --dtype f32 --preset hybrid-1.3b --stages 2 --transport local --batch 1 --microbatches 1 --seq-len 16384 --schedules stateflow --chunks 4 --warmup-steps 1 --steps 1 > /tmp/logs/local2-graphs.log 2>&1; echo "3 rc=$? $((SECONDS-T0)) s"; save
grep -E "^stateflow +[0-9]|error" /tmp/logs/local2-graphs.log | head -3
timeout 150 bin/kernels_bench --tokens 131072 --reps 2 --train-preset hybrid-1.3b --train-chunks 16 --train-recompute --train-steps 2 > /tmp/logs/hybrid-128k.log 2>&1; echo "4 rc=$? $((SECONDS-T0)) s"; save
grep -E "tokens/s|MFU|peak memory" /tmp/logs/hybrid-128k.log | tail -4
