# preeight run 2: Pre with V loaded late (pre_late_v), the lean B2 (b2_lean, now a default), the heads-first walk (core_walk)
mkdir -p bin .deps/root /tmp/logs-preeight2 && tar -C bin -xJf .gpu-preeight/bin2.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$LD_LIBRARY_PATH; T0=$SECONDS; G=/tmp/logs-preeight2
save() { tar -C /tmp -czf $OUT/logs.tgz logs-preeight2; }
STATEFLOW_LEVERS_ON=pre_late_v,core_walk timeout 60 bin/stateflow_cuda_tests --gtest_filter='GdnCoreCuda.*:GdnKeptSweepCuda.*:*OpDefCuda*gdn_core*:*MixerConformanceCuda*gdn*' > $G/tests-on.log 2>&1; echo "tests rc=$? $((SECONDS-T0)) s"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $G/tests-on.log | head; save
B="timeout 30 bin/gdn_core_bench --reps 10 --len 32768,131072"
for v in "old:b2_lean:" "default::" "latev::pre_late_v" "latewalk::pre_late_v,core_walk" "walk::core_walk" "old2:b2_lean:" "latev2::pre_late_v" "default2::"; do
  IFS=: read n off on <<< "$v"; STATEFLOW_LEVERS_OFF=$off STATEFLOW_LEVERS_ON=$on $B > $G/core-$n.log 2>&1; echo "$n rc=$? $((SECONDS-T0)) s"
done; save
for v in "default::" "latev::pre_late_v"; do
  IFS=: read n off on <<< "$v"; STATEFLOW_LEVERS_OFF=$off STATEFLOW_LEVERS_ON=$on timeout 30 bin/gdn_core_bench --reps 10 --len 32768 --chunk-len 2048 > $G/chunks-$n.log 2>&1; echo "chunks $n rc=$? $((SECONDS-T0)) s"
done; save
for f in old default latev latewalk walk old2 latev2 default2; do awk -v f=$f -F'|' 'NR>=4 && NR<=5 && NF>5 {split($2,a," "); split($4,kt," "); split($5,ks," "); split($7,st," "); split($8,b," "); split($9,sv," "); split($10,k1," "); printf "%-9s fwd=%s Pre=%s B1=%s kTB1=%s B2=%s svB2=%s fbkT=%s fbkS=%s\n", f, a[1], st[1], b[1], k1[1], b[2], sv[1], kt[1], ks[1]}' $G/core-$f.log; done
for n in default latev; do grep -A3 "In chunks" $G/chunks-$n.log | grep 2048; done
