# taxeight run 1 (prebuilt, sm_90a Release): the untried levers gates_beside and residual_epilogue:
# their tests (GEMM residual epilogue, conformance within twice the old error, side stream with the
# gates beside, graphs and chunked-bitwise with both on), then the chunk tax (gdn-1.3b, 32K,
# N = 1, 16, 32) with the defaults and with both on (the latter with --breakdown-overlapped).
mkdir -p bin .deps/root /tmp/logs-taxeight1 && tar -C bin -xJf .gpu-taxeight/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH
G=/tmp/logs-taxeight1; T0=$SECONDS
save() { tar -C /tmp -czf $OUT/logs.tgz logs-taxeight1; }
ON=gates_beside,residual_epilogue
F='GemmCuda*Residual*:*MixerConformanceCuda*ResidualInTheEpilogue*:*MixerConformanceCuda*SideStream*/gdn*:*MixerConformanceCuda*GraphsGiveBitwise*/gdn:*MixerConformanceCuda*ChunksAtMultiples*/gdn*'
STATEFLOW_LEVERS_ON=$ON timeout 70 bin/stateflow_cuda_tests --gtest_filter="$F" > $G/tests-on.log 2>&1; echo "tests rc=$? $((SECONDS-T0)) s"; save
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|first difference|rms rel error|against fp64" $G/tests-on.log | head -40
B="bench --device cuda --dtype f32 --preset gdn-1.3b --stages 1 --seq-len 32768 --batch 1 --microbatches 1 --schedules stateflow --warmup-steps 1 --steps 2 --chunk-sweep 1,16,32"
STATEFLOW_LEVERS_ON= timeout 40 bin/stateflow $B > $G/tax-defaults.log 2>&1; echo "tax defaults rc=$? $((SECONDS-T0)) s"; save
STATEFLOW_LEVERS_ON=$ON timeout 60 bin/stateflow $B --breakdown-overlapped > $G/tax-on.log 2>&1; echo "tax on rc=$? $((SECONDS-T0)) s"; save
for f in defaults on; do echo "-- $f"; grep -E "^stateflow +[0-9]" $G/tax-$f.log; done
echo "total $((SECONDS-T0)) s"
