# keepsix: gdn.keep_sweep (the GDN core's forward sweep kept from forward to backward) on the H200.
# Prebuilt binaries (bin.tar.xz); logs in $OUT/logs.tgz, saved after each step.
mkdir -p bin .deps/root /tmp/logs && tar -C bin -xJf .gpu-keepsix/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH
T0=$SECONDS
save() { cp .gpu-keepsix/run.sh /tmp/logs/command.sh; tar -C /tmp -czf $OUT/logs.tgz logs; }
echo '{"preset": "gdn-1.3b", "gdn": {"keep_sweep": true}}' > /tmp/logs/keep_sweep.json
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > /tmp/logs/gpu.txt 2>&1
timeout 90 bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda*:*OpDefCuda*gdn_core*:*MixerConformanceCuda*gdn*:GdnKeptSweepCuda*' > /tmp/logs/tests.log 2>&1; echo "tests rc=$? $((SECONDS-T0)) s"; save
tail -3 /tmp/logs/tests.log; grep -E "FAILED|\[  PASSED" /tmp/logs/tests.log | head
timeout 60 bin/gdn_core_bench --len 32768,131072 --chunk-len 2048 --reps 10 > /tmp/logs/gdn_core_bench.log 2>&1; echo "core rc=$? $((SECONDS-T0)) s"; save
grep -A4 "f+b ms" /tmp/logs/gdn_core_bench.log | cut -c1-200; grep -A3 "In chunks" /tmp/logs/gdn_core_bench.log | cut -c1-200
B="bench --device cuda --dtype f32 --preset gdn-1.3b --stages 1 --seq-len 32768 --batch 1 --microbatches 1 --schedules stateflow --warmup-steps 1 --steps 2 --chunk-sweep 1,16"
timeout 50 bin/stateflow $B > /tmp/logs/tax-off.log 2>&1; echo "tax off rc=$? $((SECONDS-T0)) s"; save
timeout 50 bin/stateflow $B --config /tmp/logs/keep_sweep.json > /tmp/logs/tax-on.log 2>&1; echo "tax on rc=$? $((SECONDS-T0)) s"; save
for f in off on; do echo "-- $f"; grep -E "^stateflow +[0-9]|stage 0:" /tmp/logs/tax-$f.log; done
# kernels_bench (whole step with the optimizer, MFU) with --train-config keep_sweep.json vs without: left to the lead's check (device share)
