# Sourced by the NCCL test scripts: comparing a run's per-step losses (--metrics CSV) with the
# one-GPU reference run's, $work/ref.csv. The caller sets `work` and `failures`.

losses() { python3 -c 'import csv,sys; print(" ".join(r["loss"] for r in csv.DictReader(open(sys.argv[1]))))' "$1"; }

# label, metrics file, exit status, output[, a pattern the output must contain]: passes when
# the run exited 0 and its 3 losses are within 1e-5 of the reference's; else counts a failure
# and prints the output.
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
