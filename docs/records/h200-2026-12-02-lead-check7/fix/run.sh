mkdir -p bin .deps/root /tmp/lead7b && tar -C bin -xJf .gpu-fix/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH; G=/tmp/lead7b
timeout 60 bin/stateflow_cuda_tests --gtest_filter='StreamWaitCuda.*:GdnCoreCuda.Overlap*:GdnCoreCuda.TheOverlap*:GdnKeptSweepCuda.*:*MixerConformanceCuda*kept_sweep*' > $G/tests.log 2>&1; echo "tests rc=$?"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $G/tests.log
timeout 40 bin/gdn_core_bench --len 32768,131072 --reps 10 --overlap off,on > $G/core.log 2>&1; echo "bench rc=$?"
cp $G/*.log $OUT/
