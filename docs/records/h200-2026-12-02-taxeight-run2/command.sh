# taxeight run 2 (prebuilt, sm_90a Release, branch taxeight at effff70 = main 3c691a0 + its levers):
# graph_priority (graph kernel nodes keep their stream's priority: main greatest, side least) with
# gates_beside and residual_epilogue: the graph conformance tests with all three on, then the chunk
# tax (gdn-1.3b, 32K, N = 1, 16, 32) for the defaults and the lever sets, one call.
mkdir -p bin .deps/root /tmp/logs-taxeight2 && tar -C bin -xJf .gpu-taxeight/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH
G=/tmp/logs-taxeight2; T0=$SECONDS
save() { tar -C /tmp -czf $OUT/logs.tgz logs-taxeight2; }
ALL=gates_beside,residual_epilogue,graph_priority
STATEFLOW_LEVERS_ON=$ALL timeout 30 bin/stateflow_cuda_tests --gtest_filter='*MixerConformanceCuda*GraphsGiveBitwise*' > $G/tests-all.log 2>&1; echo "tests rc=$? $((SECONDS-T0)) s"; save
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran|graphs launched" $G/tests-all.log | head -40
B="bench --device cuda --dtype f32 --preset gdn-1.3b --stages 1 --seq-len 32768 --batch 1 --microbatches 1 --schedules stateflow --warmup-steps 1 --steps 2 --chunk-sweep 1,16,32"
run() { STATEFLOW_LEVERS_ON=$2 timeout 30 bin/stateflow $B > $G/tax-$1.log 2>&1; echo "tax $1 rc=$? $((SECONDS-T0)) s"; save; }
run defaults ""
run all $ALL
run gates-epilogue gates_beside,residual_epilogue
(( SECONDS - T0 < 45 )) && run epilogue-priority residual_epilogue,graph_priority
for f in defaults all gates-epilogue epilogue-priority; do echo "-- $f"; grep -E "^stateflow +[0-9]" $G/tax-$f.log 2>/dev/null; done
echo "total $((SECONDS-T0)) s"
