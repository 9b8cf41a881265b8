#!/usr/bin/env bash
# The dependency rule of the code (docs/design.md, "Layers of the code"): a file under src/
# includes only files of its own layer or of the layers below it. Lowest first:
#   core < kernels < model < mixers < pipeline < train < cli
# Prints each include that points up a layer and exits 1 if there is any.
set -euo pipefail
cd "$(dirname "$0")/.."
layers=(core kernels model mixers pipeline train cli)
rank() {
  local i
  for i in "${!layers[@]}"; do [[ ${layers[$i]} == "$1" ]] && { echo "$i"; return; }; done
  echo -1
}
bad=0
while IFS= read -r file; do
  from=${file#src/}; from=${from%%/*}
  from_rank=$(rank "$from")
  while IFS= read -r target; do
    to=${target%%/*}
    to_rank=$(rank "$to")
    ((to_rank < 0)) && continue  # not one of ours (e.g. a file beside it)
    if ((to_rank > from_rank)); then
      echo "$file includes \"$target\": $from may not depend on $to (layers, lowest first: ${layers[*]})"
      bad=1
    fi
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file")
done < <(find src -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) ! -name 'test_*' | sort)
((bad)) && exit 1
echo "check-includes: every include in src/ points to its own layer or one below"
