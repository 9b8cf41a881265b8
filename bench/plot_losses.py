#!/usr/bin/env python3
"""Overlay training-loss curves from `stateflow train --metrics FILE` CSVs, with matplotlib
(Debian's python3-matplotlib, installed by tools/install-deps.sh).

usage: plot_losses.py OUT.svg|OUT.png LABEL=metrics.csv [LABEL=metrics.csv ...]
The first curve is the reference: the upper panel overlays every curve, the lower one shows
each other curve minus the reference. Printed for each other curve: its largest absolute and
relative difference from the reference, the largest over the first quarter of the steps, and
both curves' mean over the last quarter (runs whose rounding differs drift apart step by
step, so late single-step differences are noise of the size of the loss's own jitter)."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return [int(r["step"]) for r in rows], [float(r["loss"]) for r in rows]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, curves = sys.argv[1], []
    for arg in sys.argv[2:]:
        label, path = arg.rsplit("=", 1)
        curves.append((label, *read(path)))
    ref_label, ref_steps, ref_losses = curves[0]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8, 6), gridspec_kw={"height_ratios": [3, 1]})
    for i, (label, steps, losses) in enumerate(curves):
        top.plot(steps, losses, label=label, color=f"C{i}", linewidth=1.2,
                 linestyle="-" if i == 0 else (0, (4, 2 + 2 * i)))
    top.set_ylabel("training loss")
    top.legend()
    top.grid(alpha=0.3)
    quarter = max(1, len(ref_steps) // 4)
    for i, (label, steps, losses) in enumerate(curves[1:], start=1):
        if steps != ref_steps:
            sys.exit(f"{label}: its steps differ from {ref_label}'s")
        diff = [a - b for a, b in zip(losses, ref_losses)]
        bottom.plot(steps, diff, color=f"C{i}", linewidth=1, label=label)
        worst = max(range(len(diff)), key=lambda k: abs(diff[k]))
        early = max(abs(d) for d in diff[:quarter])
        mean = lambda xs: sum(xs[-quarter:]) / quarter  # noqa: E731
        print(f"max |loss({label}) - loss({ref_label})| = {abs(diff[worst]):.3e} at step {steps[worst]} "
              f"(relative {abs(diff[worst]) / abs(ref_losses[worst]):.3e}); over steps {steps[0]}-"
              f"{steps[quarter - 1]}: {early:.3e}; mean loss over the last {quarter} steps {mean(losses):.4f} vs "
              f"{mean(ref_losses):.4f}")
    bottom.set_xlabel("step")
    bottom.set_ylabel(f"minus {ref_label}")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    # No date in the file: the same curves give the same bytes.
    matplotlib.rcParams["svg.hashsalt"] = "stateflow"
    fig.savefig(out, metadata={"Date": None} if out.endswith(".svg") else None)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
