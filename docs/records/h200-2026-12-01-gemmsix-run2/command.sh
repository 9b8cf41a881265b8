# gemmsix run 2: the two groups behind their own levers (fused_proj: GDN, fused_mlp: MLP), untried:
# the fixed checkpoint test and the fused test with both on; chunk-tax bench off / GDN / GDN + MLP;
# kernels_bench with the GDN group on and off. Prebuilt binaries.
mkdir -p bin .deps/root /tmp/logs && tar -C bin -xJf .gpu-gemmsix/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH
T0=$SECONDS
save() { tar -C /tmp -czf $OUT/logs.tgz logs; }
fits() { (( SECONDS - T0 + $1 <= 110 )); }
F='*Checkpoint*:*MixerConformanceCuda*Fused*:*MixerConformanceCuda*ChunksAtMultiples*gdn*'
STATEFLOW_LEVERS_ON=fused_proj,fused_mlp timeout 30 bin/stateflow_cuda_tests --gtest_filter="$F" > /tmp/logs/tests.log 2>&1; echo "tests rc=$? $((SECONDS-T0)) s"; save
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|fused vs separate" /tmp/logs/tests.log | head -20
B="bench --device cuda --dtype f32 --preset gdn-1.3b --stages 1 --seq-len 32768 --batch 1 --microbatches 1 --schedules stateflow --warmup-steps 1 --steps 2 --chunk-sweep 1,16,32"
for c in off:"" proj:fused_proj both:fused_proj,fused_mlp; do n=${c%%:*}; fits 25 || break
  STATEFLOW_LEVERS_ON=${c#*:} timeout 25 bin/stateflow $B > /tmp/logs/tax-$n.log 2>&1; echo "$n rc=$? $((SECONDS-T0)) s"; save
  grep -E "^stateflow +[0-9]" /tmp/logs/tax-$n.log; done
fits 20 && { STATEFLOW_LEVERS_ON=fused_proj timeout 20 bin/kernels_bench --reps 3 --train-steps 3 > /tmp/logs/kernels-proj.log 2>&1; echo "kb proj rc=$? $((SECONDS-T0)) s"; save; }
fits 20 && { STATEFLOW_LEVERS_ON= timeout 20 bin/kernels_bench --reps 3 --train-steps 3 > /tmp/logs/kernels-off.log 2>&1; echo "kb off rc=$? $((SECONDS-T0)) s"; save; }
for f in proj off; do echo "-- kb $f"; grep -E "^\| [0-9]" /tmp/logs/kernels-$f.log 2>/dev/null | tail -1; done
echo "total $((SECONDS-T0)) s"
