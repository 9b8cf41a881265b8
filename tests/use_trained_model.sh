#!/usr/bin/env bash
# A new user's path end to end, on the CPU: the guide's text example runs as written (the
# preset's vocabulary follows the data); training reports held-out evaluation; `eval` gives
# the same loss whatever the chunk length; `generate` is repeatable by seed; `export` then
# `import` gives a checkpoint with the same eval loss; tools/prepare_data.py's manifest trains
# without --data-vocab and its tokenizer encodes prompts and decodes the output.
# Usage: use_trained_model.sh path/to/stateflow path/to/tools/prepare_data.py
set -euo pipefail
bin=$1
prepare=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAILED: $*"; for f in "$dir"/*.log; do echo "--- $f"; tail -20 "$f"; done; exit 1; }
run() { local log=$1; shift; "$@" >"$dir/$log.log" 2>&1 || fail "$log: exit $? from: $*"; }
# A small text corpus: training and held-out parts.
for i in $(seq 1 400); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7 % 13))."; done >"$dir/corpus.txt"
for i in $(seq 1 60); do echo "held out $i: a lazy dog sleeps while the fox runs $((i % 5))."; done >"$dir/heldout.txt"
cd "$dir"

# The guide's example, as written (one step).
run guide "$bin" train --data text --data-path corpus.txt --preset small --seq-len 256 --steps 1
grep -q "parameters, vocab 256," guide.log || fail "the guide's example did not take the data's vocabulary"

tiny=(--preset tiny --seq-len 32 --batch 4 --stages 2 --microbatches 2 --chunks 3 --log-every 1)
run train "$bin" train --data text --data-path corpus.txt "${tiny[@]}" --steps 4 --eval-data text \
  --eval-data-path heldout.txt --eval-every 2 --eval-tokens 256 --save-dir run --metrics metrics.csv
(( $(grep -c '^eval ' train.log) == 2 )) || fail "expected evaluations after steps 2 and 4"
head -1 metrics.csv | grep -q "eval_loss,eval_ppl,eval_accuracy" || fail "metrics header lacks the eval columns"
[[ $(sed -n 3p metrics.csv | cut -d, -f8) != "" && $(sed -n 2p metrics.csv | cut -d, -f8) == "" ]] ||
  fail "metrics: eval columns should be filled after step 2 only"

eval_loss() { grep '^eval_loss=' "$1.log" | cut -d= -f2; }
held=(--data text --data-path heldout.txt --seq-len 100 --eval-tokens 400)
run eval_whole "$bin" eval --resume run "${held[@]}" --chunk-len 0
run eval_chunks "$bin" eval --resume run "${held[@]}" --chunk-len 7
awk -v a="$(eval_loss eval_whole)" -v b="$(eval_loss eval_chunks)" \
  'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 1e-5 * a) }' ||
  fail "eval: chunked loss $(eval_loss eval_chunks) differs from unchunked $(eval_loss eval_whole)"

run gen1 "$bin" generate --resume run --prompt "the quick " --max-new-tokens 24 --seed 5 --top-k 10
run gen2 "$bin" generate --resume run --prompt "the quick " --max-new-tokens 24 --seed 5 --top-k 10 --prompt-chunk 3
cmp -s gen1.log gen2.log || fail "generate: the same seed gave different text with another prompt chunking"
grep -q "^the quick " gen1.log || fail "generate: the output does not start with the prompt"

run export "$bin" export --resume run --format hf hf
[[ -f hf/config.json && -f hf/model.safetensors ]] || fail "export wrote no config.json / model.safetensors"
run import "$bin" import --format hf hf --save-dir imported --data text --data-path corpus.txt
run eval_imported "$bin" eval --resume imported "${held[@]}" --chunk-len 0
[[ $(eval_loss eval_imported) == "$(eval_loss eval_whole)" ]] ||
  fail "the imported model's eval loss $(eval_loss eval_imported) is not the original's $(eval_loss eval_whole)"
run resume_imported "$bin" train --resume imported --seq-len 32 --batch 4 --chunks 3 --steps 2
grep -q "^step     2/2" resume_imported.log || fail "the imported model did not train on"

# Clear errors.
if "$bin" generate --resume run --max-new-tokens 3 >no_prompt.log 2>&1; then fail "generate without a prompt"; fi
grep -q "give a prompt" no_prompt.log || fail "generate without a prompt: unclear error"
echo '{"preset": "small", "vocab_size": 96}' >fixed_vocab.json
if "$bin" train --config fixed_vocab.json --data text --data-path corpus.txt --steps 1 >fixed.log 2>&1; then
  fail "a config's vocab_size 96 should not take 256 byte ids"; fi
grep -q "raise vocab_size" fixed.log || fail "a too-small vocab_size of the config: unclear error"
if "$bin" import --format hf corpus.txt --save-dir x >bad_import.log 2>&1; then fail "import of a non-folder"; fi
grep -q "no config.json" bad_import.log || fail "import of a non-folder: unclear error"

# Tokenized data (needs Debian's python3-sentencepiece; tools/install-deps.sh installs it).
run prepare /usr/bin/python3 "$prepare" build corpus.txt --out tok/corpus --vocab-size 300
run train_tokens "$bin" train --data tokens --data-path tok/corpus.json "${tiny[@]}" --steps 2 --save-dir tokrun
grep -q "parameters, vocab 300," train_tokens.log || fail "train did not take the manifest's vocabulary"
/usr/bin/python3 "$prepare" encode --manifest tok/corpus.json "the lazy dog" >prompt.ids
run gen_tokens "$bin" generate --resume tokrun --prompt-tokens prompt.ids --max-new-tokens 5 --temperature 0
(( $(tail -1 gen_tokens.log | wc -w) == 5 )) || fail "generate --prompt-tokens: expected 5 token ids"
run decode /usr/bin/python3 "$prepare" decode --manifest tok/corpus.json $(tail -1 gen_tokens.log)
if "$bin" generate --resume tokrun --prompt "text" >text_prompt.log 2>&1; then fail "--prompt on a token model"; fi
grep -q "prepare_data.py encode" text_prompt.log || fail "--prompt on a token model: unclear error"
echo "use_trained_model: all checks passed"
