# Lead: the six levers promoted to defaults (run with the 6955758 binaries, where they are untried: LEVERS_ON = the new defaults)
mkdir -p bin .deps/root /tmp/logs && tar -C bin -xJf .gpu-bin/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH
P=conv_narrow,reduce_deep,norm_staged,reduce_group,sweep_copy_warp,tile_copies; T0=$SECONDS
save() { tar -C /tmp -czf $OUT/logs.tgz logs; }
B="bench --device cuda --dtype f32 --preset gdn-1.3b --stages 1 --seq-len 32768 --batch 1 --microbatches 1 --schedules stateflow --warmup-steps 1 --steps 2 --chunk-sweep 1,16,32"
STATEFLOW_LEVERS_ON= timeout 60 bin/stateflow $B > /tmp/logs/tax-before.log 2>&1; save; echo "1 rc=$? $((SECONDS-T0)) s"
STATEFLOW_LEVERS_ON=$P timeout 60 bin/stateflow $B > /tmp/logs/tax-promoted.log 2>&1; save; echo "2 rc=$? $((SECONDS-T0)) s"
STATEFLOW_LEVERS_ON=$P,graphs timeout 60 bin/stateflow $B > /tmp/logs/tax-promoted-graphs.log 2>&1; save; echo "3 rc=$? $((SECONDS-T0)) s"
for f in before promoted promoted-graphs; do echo "-- $f"; grep -E "^stateflow +[0-9]" /tmp/logs/tax-$f.log; done
STATEFLOW_LEVERS_ON=$P timeout 90 bin/kernels_bench --reps 3 --train-steps 3 > /tmp/logs/kernels-promoted.log 2>&1; save; echo "4 rc=$? $((SECONDS-T0)) s"
grep -E "^\| [0-9]+ \| 0\." /tmp/logs/kernels-promoted.log; grep "MFU" /tmp/logs/kernels-promoted.log
