# preeight run 1: tests of the walk (heads first + L2 prefetch) and the lean B2, then the GDN core old vs new in one call
mkdir -p bin .deps/root /tmp/logs-preeight && tar -C bin -xJf .gpu-preeight/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$LD_LIBRARY_PATH; T0=$SECONDS; G=/tmp/logs-preeight
save() { tar -C /tmp -czf $OUT/logs.tgz logs-preeight; }
STATEFLOW_LEVERS_ON=core_walk,b2_lean timeout 60 bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda.*:GdnKeptSweepCuda.*:*OpDefCuda*gdn_core*:*MixerConformanceCuda*gdn*' > $G/tests-on.log 2>&1; echo "tests rc=$? $((SECONDS-T0)) s"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $G/tests-on.log | head; save
B="timeout 30 bin/gdn_core_bench --reps 10"
for v in "old:" "walk:core_walk" "lean:b2_lean" "both:core_walk,b2_lean" "old2:"; do
  STATEFLOW_LEVERS_ON=${v#*:} $B --len 32768,131072 > $G/core-${v%%:*}.log 2>&1; echo "${v%%:*} rc=$? $((SECONDS-T0)) s"
done; save
for w in 0 0.5 2; do
  STATEFLOW_GDN_PREFETCH_WAVES=$w STATEFLOW_LEVERS_ON=core_walk,b2_lean $B --len 32768 > $G/core-both-w$w.log 2>&1; echo "w$w rc=$? $((SECONDS-T0)) s"
done; save
for v in "old:" "both:core_walk,b2_lean"; do
  STATEFLOW_LEVERS_ON=${v#*:} $B --len 32768 --chunk-len 2048 > $G/chunks-${v%%:*}.log 2>&1; echo "chunks ${v%%:*} rc=$? $((SECONDS-T0)) s"
done; save
for v in old both; do echo "== $v"; sed -n '/Per stage/,/^$/p' $G/core-$v.log; done
for v in walk lean old2; do echo "== $v"; sed -n '/Per stage/,/^$/p' $G/core-$v.log | tail -n +3; done
for w in 0 0.5 2; do echo "== w$w"; sed -n '/Per stage/,/^$/p' $G/core-both-w$w.log | tail -n +3; done
for v in old both; do echo "== chunks $v"; grep -A3 "In chunks" $G/chunks-$v.log | tail -2; done
