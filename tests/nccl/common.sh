# Sourced by the NCCL test scripts: skipping without enough GPUs, and comparing a run's
# per-step losses (--metrics CSV) with the one-GPU reference run's, $work/ref.csv.

# Sets `gpus`; exits 77 (CTest's SKIP_RETURN_CODE) when there are fewer than $1.
require_gpus() {
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if ((gpus < $1)); then
    echo "SKIPPED: needs $1 GPUs, found ${gpus:-0}"
    exit 77
  fi
}

losses() { python3 -c 'import csv,sys; print(" ".join(r["loss"] for r in csv.DictReader(open(sys.argv[1]))))' "$1"; }

# label, metrics file, exit status, output[, a pattern the output must contain]: passes when
# the run exited 0 and its 3 losses are within 1e-5 of the reference's; else counts a failure
# (in `failures`) and prints the output. The caller sets `work`.
check() {
  local label=$1 metrics=$2 rc=$3 out=$4 want=${5:-}
  if [[ $rc -eq 0 && -s $metrics ]] && { [[ -z $want ]] || grep -q "$want" <<<"$out"; } &&
    python3 - "$work/ref.csv" "$metrics" <<'PY'; then
import csv, sys
ref = [float(r["loss"]) for r in csv.DictReader(open(sys.argv[1]))]
got = [float(r["loss"]) for r in csv.DictReader(open(sys.argv[2]))]
sys.exit(0 if len(ref) == len(got) == 3 and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got, ref)) else 1)
PY
    echo "ok   $label: losses $(losses "$metrics") (1 GPU: $(losses "$work/ref.csv"))"
  else
    echo "FAIL $label: exit $rc, losses '$( [[ -s $metrics ]] && losses "$metrics")' vs 1 GPU '$(losses "$work/ref.csv")'${want:+ (output must contain '$want')}"
    echo "$out"
    failures=$((failures + 1))
  fi
}
