#!/usr/bin/env python3
"""Overlay training-loss curves from `stateflow train --metrics FILE` CSVs in one SVG.

usage: plot_losses.py OUT.svg LABEL=metrics.csv [LABEL=metrics.csv ...]
Prints the largest absolute difference between the first curve and each other one.
Standard library only (no plotting package needed)."""
import csv
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


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
    W, H, pad = 720, 420, 60
    xs = [x for _, s, _ in curves for x in s]
    ys = [y for _, _, l in curves for y in l]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    sx = lambda x: pad + (x - x0) / max(x1 - x0, 1) * (W - 2 * pad)
    sy = lambda y: H - pad - (y - y0) / max(y1 - y0, 1e-12) * (H - 2 * pad)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
             f'<rect width="{W}" height="{H}" fill="white"/>',
             f'<line x1="{pad}" y1="{H-pad}" x2="{W-pad}" y2="{H-pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{H-pad}" stroke="black"/>',
             f'<text x="{W/2}" y="{H-20}" text-anchor="middle">step</text>',
             f'<text x="15" y="{H/2}" transform="rotate(-90 15 {H/2})" text-anchor="middle">loss</text>']
    for i in range(5):
        yv = y0 + (y1 - y0) * i / 4
        parts.append(f'<text x="{pad-5}" y="{sy(yv)+4:.1f}" text-anchor="end">{yv:.2f}</text>')
        xv = x0 + (x1 - x0) * i / 4
        parts.append(f'<text x="{sx(xv):.1f}" y="{H-pad+16}" text-anchor="middle">{xv:.0f}</text>')
    for i, (label, steps, losses) in enumerate(curves):
        pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(steps, losses))
        dash = ' stroke-dasharray="6,4"' if i else ""
        parts.append(f'<polyline fill="none" stroke="{COLORS[i % 4]}" stroke-width="1.5"{dash} points="{pts}"/>')
        parts.append(f'<text x="{W-pad-150}" y="{pad+18*i}" fill="{COLORS[i % 4]}">{label}</text>')
    parts.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(parts) + "\n")
    _, s0, l0 = curves[0]
    for label, s, l in curves[1:]:
        assert s == s0, f"{label}: different steps than {curves[0][0]}"
        print(f"max |loss({label}) - loss({curves[0][0]})| = {max(abs(a - b) for a, b in zip(l, l0)):.3e}")


if __name__ == "__main__":
    main()
