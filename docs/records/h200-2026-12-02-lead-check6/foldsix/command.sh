# Lead: branch foldsix (9547646, pure refactoring of the GDN core's B4/Pre helpers and tests): the GDN tests, defaults and with the untried levers on, and gdn_core_bench
mkdir -p bin .deps/root /tmp/lead6f && tar -C bin -xJf .gpu-bin/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH; T0=$SECONDS; G=/tmp/lead6f
save() { tar -C /tmp -czf $OUT/logs.tgz lead6f; }
F='GdnCoreCuda.*:GdnKeptSweepCuda.*:*OpDefCuda*gdn_core*:*MixerConformanceCuda*gdn*:*ModelCuda*'
STATEFLOW_LEVERS_ON= timeout 90 bin/stateflow_cuda_tests --gtest_filter="$F" > $G/tests-defaults.log 2>&1; echo "1 rc=$? $((SECONDS-T0)) s"; save
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $G/tests-defaults.log | head
STATEFLOW_LEVERS_OFF=b4_ring STATEFLOW_LEVERS_ON=sweep_multicast timeout 60 bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda.*' > $G/tests-b4-two-slots.log 2>&1; echo "2 rc=$? $((SECONDS-T0)) s"; save
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $G/tests-b4-two-slots.log | head
timeout 40 bin/gdn_core_bench --len 32768 --chunk-len 2048 --reps 10 > $G/gdn-core.log 2>&1; echo "3 rc=$? $((SECONDS-T0)) s"; save
sed -n '/fwd ms/,+1p' $G/gdn-core.log; grep -A1 "bytes differing" $G/gdn-core.log | tail -1
