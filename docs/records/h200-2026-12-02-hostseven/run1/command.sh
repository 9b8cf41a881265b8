# hostseven run 1: graphs (untried lever) with today's defaults: the graph-relevant CUDA tests with graphs on,
# then the chunk-tax bench off vs on (8 and 48 layers per graph), with and without gdn.keep_sweep, one call.
mkdir -p bin .deps/root && tar -C bin -xJf .gpu-hostseven/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH
G=/tmp/logs-hostseven; rm -rf $G; mkdir -p $G; T0=$SECONDS
save() { tar -C /tmp -czf $OUT/logs.tgz logs-hostseven; }
fits() { (( SECONDS - T0 + $1 <= ${BUDGET:-150} )); }
echo '{"preset": "gdn-1.3b", "gdn": {"keep_sweep": true}}' > $G/keep_sweep.json
F='*MixerConformanceCuda*:*PipelineCuda*:*CheckpointCuda*:*DeviceMemory*:*TrainStep*:*GdnKeptSweepCuda*:*LmHead*:*EmbeddingCuda*'
STATEFLOW_LEVERS_ON=graphs timeout 60 bin/stateflow_cuda_tests --gtest_filter="$F" > $G/tests-graphs.log 2>&1; echo "tests rc=$? $((SECONDS-T0)) s"; save
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran|SKIPPED \] [0-9]" $G/tests-graphs.log | head -20
B="bench --device cuda --dtype f32 --preset gdn-1.3b --stages 1 --seq-len 32768 --batch 1 --microbatches 1 --schedules stateflow --warmup-steps 1 --steps 2 --chunk-sweep 1,16,32"
run() { local name=$1; shift; env "$@" timeout 40 bin/stateflow $B $EXTRA > $G/tax-$name.log 2>&1; echo "$name rc=$? $((SECONDS-T0)) s"; save; grep -E "^bench \[" $G/tax-$name.log; }
EXTRA=--breakdown run off STATEFLOW_LEVERS_ON=
EXTRA= run graphs8 STATEFLOW_LEVERS_ON=graphs
EXTRA= run graphs48 STATEFLOW_LEVERS_ON=graphs STATEFLOW_GRAPH_LAYERS=48
EXTRA="--config $G/keep_sweep.json" run ks-off STATEFLOW_LEVERS_ON=
EXTRA="--config $G/keep_sweep.json" run ks-graphs8 STATEFLOW_LEVERS_ON=graphs
fits 35 && { STATEFLOW_LEVERS_ON=graphs timeout 35 bin/kernels_bench --reps 3 --train-steps 3 > $G/kb-graphs.log 2>&1; echo "kb graphs rc=$? $((SECONDS-T0)) s"; save; grep -E "tokens/s|best GEMM|graphs" $G/kb-graphs.log | tail -4; }
echo "total $((SECONDS-T0)) s"
