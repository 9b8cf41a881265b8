#!/usr/bin/env bash
# Options given on the command line are used or refused, never silently replaced:
#  * verify: --chunks -3 / 0, an empty --chunk-lengths, --tolerance -1 / 0 / nan are errors
#    naming the option (they used to run the built-in chunkings and default tolerance);
#    plan --seq-len 0 likewise; --chunks auto where it cannot run, and a missing plan file;
#    --sm-split without a GPU to split;
#  * plan --auto profiles once and then uses its cache, or a recorded profile of a model with
#    the same layers and device (--cost-profile), and finds the longest sequence that fits; train runs a plan file's chunks and
#    --chunks auto says what it chose and tunes;
#  * train --resume: --recompute and --metrics given again apply (they used to be dropped),
#    a data option that differs from the checkpoint's is refused saying why, and a bare
#    relative step directory (`cd RUN && train --resume step-000002`) keeps saving into RUN.
# Usage: cli_options.sh path/to/stateflow
set -euo pipefail
bin=$(realpath "$1")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAILED: $*"; exit 1; }

# refused "what" "expected message" command...: must exit non-zero, printing the message.
refused() {
  local what=$1 want=$2 rc=0; shift 2
  "$@" >"$dir/out" 2>&1 || rc=$?
  ((rc != 0)) || fail "$what: accepted (exit 0): $(tail -3 "$dir/out")"
  grep -qF -- "$want" "$dir/out" || fail "$what: exit $rc without '$want': $(cat "$dir/out")"
  echo "refused as it should be: $what"
}

refused "verify --chunks -3" "--chunks: -3 is not a number of chunks: give a whole number, at least 1" "$bin" verify --chunks -3
refused "verify --chunks 0" "--chunks: 0 is not a number of chunks" "$bin" verify --chunks 0
refused "verify --chunk-lengths ''" "--chunk-lengths: it is empty: give lengths a,b,c" "$bin" verify --chunk-lengths ""
refused "train --chunk-lengths ''" "--chunk-lengths: it is empty: give lengths a,b,c" "$bin" train --chunk-lengths ""
refused "plan --seq-len 0" "--seq-len 0 must be >= 1" "$bin" plan --preset hybrid-1.3b --stages 2 --seq-len 0
# --sm-split shares one GPU: refused where there is none to share or the plan cannot use it.
refused "train --sm-split on the cpu" "--sm-split splits one GPU's multiprocessors" \
  "$bin" train --sm-split --stages 2 --steps 1 --seq-len 16
refused "plan --auto --sm-split on the cpu" "--sm-split plans stages side by side on parts of one GPU" \
  "$bin" plan --auto --sm-split --stages 2 --seq-len 16
refused "plan --auto --sm-split --shared-gpu" "--shared-gpu and --sm-split are two ways of sharing one GPU" \
  "$bin" plan --auto --sm-split --shared-gpu --device cuda --stages 2 --seq-len 16
refused "bench --chunk-counts without --chunks auto" "--alphas, --every-alpha and --chunk-counts choose runs of --chunks auto" \
  "$bin" bench --chunk-counts 4
# --chunks auto and plan files.
refused "verify --chunks auto" "verify --chunks auto: verify compares given chunkings" "$bin" verify --chunks auto
refused "train --chunks many" "many is not a number of chunks: give a whole number, at least 1, or auto" \
  "$bin" train --chunks many
refused "train --chunks auto --chunk-lengths" "--chunks auto and --chunk-lengths both choose the chunks" \
  "$bin" train --chunks auto --chunk-lengths 8,8 --seq-len 16
refused "train --chunks auto --transport mpi" "--chunks auto runs in one process" \
  "$bin" train --chunks auto --transport mpi
refused "train --chunk-lengths FILE (missing)" "cannot read the plan file 'nosuch.json'" \
  "$bin" train --chunk-lengths nosuch.json
auto=(--preset tiny --pattern "GA|AG" --batch 2 --seq-len 64 --stages 2 --profile-dir "$dir/profiles")
"$bin" plan --auto "${auto[@]}" --write-plan "$dir/plan.json" >"$dir/plan.log" 2>&1 || fail "plan --auto: $(cat "$dir/plan.log")"
grep -q "^chosen: stateflow train" "$dir/plan.log" || fail "plan --auto printed no command line: $(cat "$dir/plan.log")"
grep -q "(cached)" "$dir/plan.log" && fail "plan --auto: a fresh profile directory had a cached profile"
"$bin" plan --auto "${auto[@]}" >"$dir/plan2.log" 2>&1 || fail "plan --auto again: $(cat "$dir/plan2.log")"
grep -q "(cached)" "$dir/plan2.log" || fail "plan --auto again did not use the cached profile: $(cat "$dir/plan2.log")"
"$bin" train --preset tiny --pattern "GA|AG" --batch 2 --seq-len 64 --stages 2 --microbatches 1 --steps 1 \
  --chunk-lengths "$dir/plan.json" >"$dir/planned.log" 2>&1 || fail "train --chunk-lengths plan.json: $(cat "$dir/planned.log")"
grep -qF "chunks $(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["chunk_lengths"])))' "$dir/plan.json")" \
  "$dir/planned.log" || fail "train --chunk-lengths plan.json did not run the plan's chunks: $(cat "$dir/planned.log")"
"$bin" train "${auto[@]}" --chunks auto --steps 3 --log-every 1 >"$dir/auto.log" 2>&1 || fail "train --chunks auto: $(cat "$dir/auto.log")"
grep -q "^--chunks auto: N " "$dir/auto.log" || fail "train --chunks auto said nothing of its choice: $(cat "$dir/auto.log")"
grep -q "chunk tuning: step measured" "$dir/auto.log" || fail "train --chunks auto did not tune: $(cat "$dir/auto.log")"
# A recorded profile plans without profiling, for its own model only; --longest-seq-len searches T.
profile=$(ls "$dir"/profiles/costs-*.json | head -1)
recorded=(--preset tiny --pattern "GA|AG" --batch 2 --seq-len 64 --stages 2 --cost-profile "$profile")
"$bin" plan --auto "${recorded[@]}" --profile-dir "$dir/none" >"$dir/plan3.log" 2>&1 ||
  fail "plan --auto --cost-profile: $(cat "$dir/plan3.log")"
grep -q "^chosen: stateflow train" "$dir/plan3.log" || fail "plan --auto --cost-profile chose nothing: $(cat "$dir/plan3.log")"
[[ ! -e $dir/none ]] || fail "plan --auto --cost-profile profiled again"
refused "plan --cost-profile of another model" "was measured on model 'tiny', whose layers are not this one's" \
  "$bin" plan --auto --preset small --cost-profile "$profile" --batch 2 --seq-len 64 --stages 2
"$bin" plan --auto --preset tiny --pattern "GG|GG" --cost-profile "$profile" --batch 2 --seq-len 64 --stages 2 \
  >"$dir/plan4.log" 2>&1 || fail "plan --cost-profile of a hybrid for its GDN-only model: $(cat "$dir/plan4.log")"
refused "plan --cost-profile of another device" "give --device cpu" \
  "$bin" plan --auto "${recorded[@]}" --device cuda
"$bin" train "${recorded[@]}" --chunks auto --steps 1 --profile-dir "$dir/none" >"$dir/recorded.log" 2>&1 ||
  fail "train --chunks auto --cost-profile: $(cat "$dir/recorded.log")"
grep -q "(recorded: cpu" "$dir/recorded.log" && [[ ! -e $dir/none ]] ||
  fail "train --chunks auto --cost-profile profiled instead: $(cat "$dir/recorded.log")"
"$bin" plan --auto "${recorded[@]}" --recompute none --memory-gib 0.01 --chunk-multiple 64 \
  --longest-seq-len --max-seq-len 65536 >"$dir/longest.log" 2>&1 || fail "plan --longest-seq-len: $(cat "$dir/longest.log")"
grep -q "^  1f1b: .*(stateflow's is" "$dir/longest.log" || fail "plan --longest-seq-len: $(cat "$dir/longest.log")"
echo "plan --auto, plan files and train --chunks auto run"
for t in -1 0 nan; do
  refused "verify --tolerance $t" "--tolerance: $t is not a positive, finite relative difference" \
    "$bin" verify --tolerance "$t"
done

tiny=(--preset tiny --batch 2 --seq-len 16 --recall-pairs 2 --recall-queries 2 --stages 2 --chunks 2 --log-every 1)
"$bin" train "${tiny[@]}" --steps 2 --save-dir "$dir/run" --save-every 2 >"$dir/first.log" 2>&1 ||
  fail "first run: $(cat "$dir/first.log")"

# A bare relative step directory: new checkpoints go into the directory it is in, with the
# inherited --save-every 2 as with --save-every 0.
(cd "$dir/run" && "$bin" train --resume step-000002 --steps 4 >"$dir/relative.log" 2>&1) ||
  fail "resume from a bare relative name: $(cat "$dir/relative.log")"
[[ -f $dir/run/step-000004/manifest.json ]] || fail "no checkpoint step-000004 in the run directory"
(cd "$dir/run" && "$bin" train --resume step-000004/ --steps 5 --save-every 0 >"$dir/relative0.log" 2>&1) ||
  fail "resume with --save-every 0: $(cat "$dir/relative0.log")"
[[ -f $dir/run/step-000005/manifest.json ]] || fail "--save-every 0: no checkpoint at the end, in the run directory"
echo "a bare relative --resume name saves beside it"

# --recompute and --metrics given on resuming apply, and the new metrics file has its header.
"$bin" train --resume "$dir/run" --steps 7 --recompute full --metrics "$dir/m.csv" >"$dir/recompute.log" 2>&1 ||
  fail "resume with --recompute full: $(cat "$dir/recompute.log")"
grep -q "full recomputation" "$dir/recompute.log" || fail "--recompute full was not applied: $(head -5 "$dir/recompute.log")"
[[ $(head -1 "$dir/m.csv") == step,loss,* ]] || fail "the new --metrics file has no header: $(head -2 "$dir/m.csv")"
(($(wc -l <"$dir/m.csv") == 3)) || fail "--metrics: expected a header and 2 rows: $(cat "$dir/m.csv")"
# ... and the next resume, without them, inherits them from the checkpoint and appends.
"$bin" train --resume "$dir/run" --steps 8 >"$dir/inherit.log" 2>&1 || fail "resume: $(cat "$dir/inherit.log")"
grep -q "full recomputation" "$dir/inherit.log" || fail "--recompute full was not saved with the checkpoint"
(($(wc -l <"$dir/m.csv") == 4)) || fail "--metrics: the inherited file was not appended to: $(cat "$dir/m.csv")"
echo "--recompute and --metrics apply on resuming and are inherited after"

refused "train --resume with another --data-seed" "--data-seed differs from the checkpoint's" \
  "$bin" train --resume "$dir/run" --steps 9 --data-seed 12345
refused "train --resume with another --preset" "--preset differs from the checkpoint's (checkpoint vs command line: d_model 24 vs 128" \
  "$bin" train --resume "$dir/run" --steps 9 --preset small
echo "all command-line checks passed"
