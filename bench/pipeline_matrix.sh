#!/usr/bin/env bash
# The PP = 2 benchmark matrix of issue 7 on a 2-GPU machine: for every model, sequence length T
# and global batch B, one `stateflow bench --device cuda --json` run that compares 1f1b with
# stateflow over a list of chunk counts N (same weights, same batches), M = B microbatches of
# one sequence. A configuration where either schedule runs out of memory is run again with
# --recompute full. Every result is appended as a markdown row to the output file as soon as
# its run ends (a crash or a time-out loses that configuration only), together with the
# simulator's predictions for deeper pipelines (issue 6) from the same run's measured costs.
#
#   usage: bench/pipeline_matrix.sh [--quick] [--dry-run] [--bin PATH] [--out FILE] [--logs DIR]
#            [--models LIST] [--seq-lens LIST] [--batches LIST] [--limit SECONDS]
#            [--transport NAME] [--steps N] [--warmup-steps N] [--] [extra bench options...]
#
#   --quick        gdn-1.3b only, the configurations docs/benchmarks.md reports against issue 7's
#                  targets: T = 32K at B = 1 (the full sweep) and B = 2, T = 64K at B = 2 (only
#                  stateflow fits without recomputation), T = 128K at B = 1 and 2 (with
#                  recomputation after the out-of-memory runs); run by hand, each took 0.5-1.5 min
#                  (the binary must be built already)
#   --dry-run      print the commands, run nothing
#   --bin          the stateflow binary (default build-gpu/stateflow, else build/stateflow)
#   --out          markdown file the rows are appended to (default bench-matrix.md)
#   --logs         where each run's stdout/stderr and JSON go (default bench-matrix-logs/)
#   --models       comma-separated presets (default gdn-1.3b; add gdn-3b where time allows)
#   --seq-lens     comma-separated T (default 32768,131072,262144)
#   --batches      comma-separated global batches (default 1,2,8)
#   --limit        seconds one run may take before it is killed and marked TIMEOUT (default 300)
#   --transport    bench's --transport (default nccl: one GPU per stage)
#   --steps, --warmup-steps   timed and untimed steps per schedule and N (default 2 and 1)
# The chunk counts: the full sweep 2,4,8,16,32 at two configurations (first model, T = 32K
# and T = 128K at B = 1), else a per-T list (see chunks_for). This script sets no NCCL_*
# variable: whatever the environment has is what the run uses.
set -euo pipefail
invocation="bench/pipeline_matrix.sh $*"
cd "$(dirname "$0")/.."

quick=0 dry=0 bin="" out=bench-matrix.md logs=bench-matrix-logs
models=gdn-1.3b seq_lens=32768,131072,262144 batches=1,2,8 limit=300 transport=nccl steps=2 warmup=1
extra=()
while (($#)); do
  case $1 in
    --quick) quick=1 ;;
    --dry-run) dry=1 ;;
    --bin) bin=$2; shift ;;
    --out) out=$2; shift ;;
    --logs) logs=$2; shift ;;
    --models) models=$2; shift ;;
    --seq-lens) seq_lens=$2; shift ;;
    --batches) batches=$2; shift ;;
    --limit) limit=$2; shift ;;
    --transport) transport=$2; shift ;;
    --steps) steps=$2; shift ;;
    --warmup-steps) warmup=$2; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "pipeline_matrix.sh: unknown option '$1' (see the usage at the top of the script)" >&2; exit 2 ;;
  esac
  shift
done
if [[ -z $bin ]]; then bin=build-gpu/stateflow; [[ -x $bin ]] || bin=build/stateflow; fi

full_sweep=2,4,8,16,32
# stateflow's chunk counts per T: chunks of 2K-16K tokens.
chunks_for() {
  case $1 in
    32768) echo 4,8,16 ;;
    65536) echo 8,16,32 ;;
    131072) echo 8,16,32 ;;
    *) echo 16,32 ;;
  esac
}

# The configurations, one line each: model T B chunk-list.
configs=()
if ((quick)); then
  configs=("gdn-1.3b 32768 1 $full_sweep" "gdn-1.3b 32768 2 8,16" "gdn-1.3b 65536 2 16" "gdn-1.3b 131072 1 16,32"
           "gdn-1.3b 131072 2 8,16")
else
  first_model=${models%%,*}
  for model in ${models//,/ }; do
    for T in ${seq_lens//,/ }; do
      for B in ${batches//,/ }; do
        list=$(chunks_for "$T")
        [[ $model == "$first_model" && $B == 1 && ($T == 32768 || $T == 131072) ]] && list=$full_sweep
        configs+=("$model $T $B $list")
      done
    done
  done
fi

bench_command() {  # model T B chunk-list recompute -> the array cmd
  cmd=(timeout "$limit" "$bin" bench --device cuda --dtype f32 --preset "$1" --seq-len "$2" --batch "$3"
       --microbatches "$3" --stages 2 --transport "$transport" --schedules 1f1b,stateflow --chunk-sweep "$4"
       --recompute "$5" --warmup-steps "$warmup" --steps "$steps" --simulate-stages 4,8
       --simulate-model "$1,gdn-3b,gdn-7b" --json "$logs/$1-T$2-B$3-$5.json" "${extra[@]}")
}

if ((dry)); then
  for c in "${configs[@]}"; do
    read -r model T B list <<<"$c"
    bench_command "$model" "$T" "$B" "$list" none
    echo "${cmd[*]}"
    echo "# if a schedule runs out of memory:"
    bench_command "$model" "$T" "$B" "$list" full
    echo "${cmd[*]}"
  done
  exit 0
fi

mkdir -p "$logs"
{
  echo
  echo "### Run of $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo
  echo "Command: \`$invocation\` (binary $bin; each run: \`$bin bench --device cuda --stages 2 --transport $transport --microbatches B --warmup-steps $warmup --steps $steps ...\`, limit ${limit} s; see $logs/ for every command line)"
  echo "GPUs (\`nvidia-smi --query-gpu=name,memory.total --format=csv,noheader\`): $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1 | paste -sd ';' -)"
  echo
  echo "| model | T | B = M | recompute | schedule | N | tokens/s | x 1f1b | bubble measured | bubble simulated | peak per stage, allocator (GiB) | x 1f1b | driver per GPU (GiB) | note |"
  echo "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---|---:|---|---|"
} >>"$out"
predictions=$logs/predictions.md
rm -f "$predictions"

# Appends the rows of one run's JSON to $out and its predictions to $predictions; prints
# "oom" when a row ran out of memory.
append_rows() {  # json model T B recompute
  python3 - "$@" "$out" "$predictions" <<'EOF'
import json, sys
path, model, T, B, recompute, out, pred_out = sys.argv[1:8]
j = json.load(open(path))
gib = lambda b: f"{b / 2**30:.2f}"
oom = False
with open(out, "a") as f:
    for r in j["results"]:
        head = f"| {model} | {T} | {B} | {recompute} | {r['schedule']} | {r['chunks']} |"
        if r["oom"]:
            oom = True
            f.write(f"{head} OOM | | | | | | | {r['oom_message'].replace('|', '/')} |\n")
            continue
        stages = " / ".join(gib(s["total"]) for s in r["peak_bytes"])
        gpus = " / ".join(gib(b) for b in r["gpu_used_bytes"]) or "-"
        ratio = lambda k: f"{r[k]:.3f}" if k in r else ""
        f.write(f"{head} {r['tokens_per_s']:.0f} | {ratio('throughput_vs_1f1b')} | {r['bubble_measured']:.3f} | "
                f"{r['bubble_simulated']:.3f} | {stages} | {ratio('peak_bytes_vs_1f1b')} | {gpus} | "
                f"{'best N' if r.get('best') else ''} |\n")
with open(pred_out, "a") as f:
    for p in j.get("predictions", []):
        for r in p["rows"]:
            f.write(f"| {p['model']['name']} | {r['stages']} | {T} | {B} | {recompute} | {r['schedule']} | "
                    f"{r['chunks']} | {r['tokens_per_s']:.0f} | {r['bubble']:.3f} | "
                    f"{gib(r['peak_bytes_max'])} | {'OOM' if r['oom'] else ''}{' best N' if r['best'] else ''} | "
                    f"{model} |\n")
print("oom" if oom else "ok")
EOF
}

run_config() {  # model T B chunk-list recompute; prints "oom" when a row ran out of memory
  local json=$logs/$1-T$2-B$3-$5.json log=$logs/$1-T$2-B$3-$5.log rc=0
  rm -f "$json"
  bench_command "$@"
  echo "${cmd[*]}" >"$log"
  "${cmd[@]}" >>"$log" 2>&1 || rc=$?
  if [[ -s $json ]]; then
    append_rows "$json" "$1" "$2" "$3" "$5" || echo failed
  else
    local what="FAILED (exit $rc)"
    ((rc == 124)) && what="TIMEOUT after ${limit}s"
    grep -qi "out of .*memory" "$log" && what="OOM (exit $rc)"
    echo "| $1 | $2 | $3 | $5 | all | $4 | $what | | | | | | | $(tail -n 1 "$log" | tr '|' '/' | cut -c1-160) |" >>"$out"
    [[ $what == OOM* ]] && echo oom || echo failed
  fi
}

for c in "${configs[@]}"; do
  read -r model T B list <<<"$c"
  echo "== $model T=$T B=$B N in {$list}" >&2
  status=$(run_config "$model" "$T" "$B" "$list" none)
  if [[ $status == oom ]]; then
    echo "   out of memory: again with --recompute full" >&2
    run_config "$model" "$T" "$B" "$list" full >/dev/null
  fi
done
{
  echo
  echo "Predictions of the simulator (not measured) from the runs above, P = 4 and 8 (model, P, T, B, recompute, schedule, N, tokens/s, bubble, peak per stage GiB, note, measured on):"
  echo
  echo "| model | P | T | B = M | recompute | schedule | N | tokens/s | bubble | peak/stage GiB | note | measured on |"
  echo "|---|---:|---:|---:|---|---|---:|---:|---:|---:|---|---|"
  cat "$predictions" 2>/dev/null || true
} >>"$out"
rm -f "$predictions"
echo "appended to $out (logs and JSON in $logs/)" >&2
