# keepsix run 2: 3ef6352 (17004c7 merged with main 0494a63) (the kept sweep also holds G and W, B1 skipped): its tests, gdn_core_bench 32K,
# then the chunk-tax bench with gdn.keep_sweep on and off, same call.
mkdir -p bin .deps/root /tmp/logs && tar -C bin -xJf .gpu-keepsix/bin2.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH
T0=$SECONDS; save() { cp .gpu-keepsix/run2.sh /tmp/logs/command.sh; tar -C /tmp -czf $OUT/logs2.tgz logs; }
echo '{"preset": "gdn-1.3b", "gdn": {"keep_sweep": true}}' > /tmp/logs/keep_sweep.json
bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda.BackwardFrom*:GdnCoreCuda.KeptSweep*:GdnKeptSweepCuda.*:*OpDefCuda*gdn_core*:*MixerConformanceCuda*kept_sweep*' > /tmp/logs/tests.log 2>&1; echo "tests rc=$? $((SECONDS-T0)) s"; grep -E "\[ stash|\[  PASSED|FAILED" /tmp/logs/tests.log; save
bin/gdn_core_bench --len 32768 --reps 10 > /tmp/logs/gdn_core_bench.log 2>&1; echo "core rc=$? $((SECONDS-T0)) s"; grep -A2 "f+b ms" /tmp/logs/gdn_core_bench.log | head -3 | cut -c1-250; save
B="bench --device cuda --dtype f32 --preset gdn-1.3b --stages 1 --seq-len 32768 --batch 1 --microbatches 1 --schedules stateflow --warmup-steps 1 --steps 2 --chunk-sweep 1,16"
bin/stateflow $B --config /tmp/logs/keep_sweep.json > /tmp/logs/tax-on.log 2>&1; echo "tax on rc=$? $((SECONDS-T0)) s"; save
grep -E "^stateflow +[0-9]|stage 0:" /tmp/logs/tax-on.log
bin/stateflow $B > /tmp/logs/tax-off.log 2>&1; echo "tax off rc=$? $((SECONDS-T0)) s"; save
grep -E "^stateflow +[0-9]|stage 0:" /tmp/logs/tax-off.log
