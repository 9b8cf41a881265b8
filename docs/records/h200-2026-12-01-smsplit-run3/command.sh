set -x
mkdir -p bin .deps/root && tar -C bin -xJf .gpu-bin/bin.tar.xz && for f in .deps/*.deb; do dpkg -x $f .deps/root; done
L=$PWD/.deps/root/usr/lib/x86_64-linux-gnu; N=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])'); C=$(python3 -c 'import nvidia.cudnn as n;print(n.__path__[0])')
export LD_LIBRARY_PATH=$L/openblas-pthread:$L:$N/lib:$C/lib:$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
timeout 270 bash bench/planner_protocol.sh --bin bin/stateflow --out $OUT/pp --sm-split --schedules stateflow --profile-models "" --chunk-counts 4,8 --alphas 0,0.5,1,1.25 --seq-lens 65536 --cost-profile docs/records/h200-2026-12-01-smsplit/costs-hybrid-1.3b-28af10b8.json
