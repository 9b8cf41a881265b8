#!/usr/bin/env bash
# gdnkeep's device run: prebuilt binaries; tests + measurements; logs into $OUT/gdnkeep.tar.gz
set -u
cd "$(dirname "$0")"
mkdir -p bin && ln -sfn "$OUT" logs && tar -C bin -xJf bin.tar.xz
mkdir -p ../.deps/root; for f in ../.deps/*.deb; do dpkg -x "$f" ../.deps/root; done
L=$PWD/../.deps/root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])')/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > logs/gpu.txt 2>&1
t0=$(date +%s)
bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda*:*OpDef*:*MixerConformanceCuda*ChunksAtMultiples*:*MixerConformanceCuda*LossAndGradients*:*MixerConformanceCuda*SideStream*' > logs/tests.log 2>&1; echo "tests rc $? $(( $(date +%s)-t0 ))s" >> logs/times.txt
bin/gdn_core_bench --len 32768,131072 --chunk-len 2048 --reps 10 --json logs/core.json > logs/core.log 2>&1; echo "core rc $? $(( $(date +%s)-t0 ))s" >> logs/times.txt
B="bench --device cuda --dtype f32 --preset gdn-1.3b --stages 1 --seq-len 32768 --batch 1 --microbatches 1 --schedules stateflow --warmup-steps 1 --steps 2"
bin/stateflow $B --chunk-sweep 1,16 > logs/bench_on.log 2>&1; echo "bench on rc $? $(( $(date +%s)-t0 ))s" >> logs/times.txt
STATEFLOW_LEVERS_OFF=keep_t bin/stateflow $B --chunk-sweep 1,16 > logs/bench_off.log 2>&1; echo "bench off rc $? $(( $(date +%s)-t0 ))s" >> logs/times.txt
tail -5 logs/tests.log; cat logs/times.txt
