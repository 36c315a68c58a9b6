#!/usr/bin/env python3
"""Accuracy heatmaps of an infoflow_sp `niah` result: one panel per method label, context length
(rows) x needle depth (columns), each cell the fraction of correct answers (1 = the answer
contains niah.answer), annotated with its value.

Usage:
    pip install -r bench/requirements.txt          # matplotlib
    infoflow_sp --config configs/niah-smollm2.toml --out out/niah.json
    python3 bench/plot_niah.py out/niah.json                    # writes out/niah.png
    python3 bench/plot_niah.py out/niah.json -o niah.png --metric top1_agree
    python3 bench/plot_niah.py out/niah.json --methods full infoflow/global epic

--metric picks the row field to average (correct | top1_agree | exact_match | needle_recall);
rows with the same length x depth x method are averaged. Lengths are the requested lengths
(length_target); the actual context tokens are in the JSON rows.
"""

import argparse
import json
import math
import os
import sys


def load_rows(path):
    with open(path, encoding="utf-8") as f:
        result = json.load(f)
    if result.get("job") != "niah":
        sys.exit(f"{path}: not a niah result (job = {result.get('job')!r})")
    rows = result.get("rows", [])
    if not rows:
        sys.exit(f"{path}: no rows")
    return result, rows


def cell_means(rows, metric):
    """{method: {(length, depth): mean}} and the sorted lengths / depths."""
    sums = {}
    for r in rows:
        if metric not in r:
            sys.exit(f"rows have no field {metric!r}")
        key = (r["length_target"], r["depth"])
        s = sums.setdefault(r["method"], {}).setdefault(key, [0.0, 0])
        s[0] += float(r[metric])
        s[1] += 1
    means = {m: {k: v[0] / v[1] for k, v in cells.items()} for m, cells in sums.items()}
    lengths = sorted({r["length_target"] for r in rows})
    depths = sorted({r["depth"] for r in rows})
    return means, lengths, depths


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("result", help="JSON written by infoflow_sp --out for job = niah")
    ap.add_argument("-o", "--output", help="PNG path (default: the JSON path with .png)")
    ap.add_argument("--metric", default="correct",
                    choices=["correct", "top1_agree", "exact_match", "needle_recall"])
    ap.add_argument("--methods", nargs="*", help="method labels to draw (default: all, in run order)")
    ap.add_argument("--cols", type=int, default=0, help="panels per row (default: up to 4)")
    args = ap.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result, rows = load_rows(args.result)
    means, lengths, depths = cell_means(rows, args.metric)
    order = []
    for r in rows:
        if r["method"] not in order:
            order.append(r["method"])
    methods = args.methods or order
    missing = [m for m in methods if m not in means]
    if missing:
        sys.exit(f"no rows for method(s) {missing}; present: {order}")

    cols = args.cols or min(4, len(methods))
    nrows = math.ceil(len(methods) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.2 * cols + 1.0, 0.45 * len(lengths) * nrows + 1.6 * nrows),
                             squeeze=False, constrained_layout=True)
    image = None
    for i, m in enumerate(methods):
        ax = axes[i // cols][i % cols]
        grid = [[means[m].get((L, d), float("nan")) for d in depths] for L in lengths]
        image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto", origin="lower")
        for y, L in enumerate(lengths):
            for x, d in enumerate(depths):
                v = grid[y][x]
                if not math.isnan(v):
                    ax.text(x, y, f"{v:.2f}".rstrip("0").rstrip(".") if v not in (0.0, 1.0) else f"{v:.0f}",
                            ha="center", va="center", fontsize=8)
        ax.set_title(m + (" (ref)" if m == result.get("reference") else ""), fontsize=10)
        ax.set_xticks(range(len(depths)))
        ax.set_xticklabels([f"{d:g}" for d in depths], fontsize=8)
        ax.set_yticks(range(len(lengths)))
        ax.set_yticklabels([str(L) for L in lengths], fontsize=8)
        ax.set_xlabel("needle depth", fontsize=8)
        if i % cols == 0:
            ax.set_ylabel("context tokens", fontsize=8)
    for j in range(len(methods), nrows * cols):
        axes[j // cols][j % cols].axis("off")
    cfg = result.get("config", {})
    ratio = cfg.get("method", {}).get("ratio")
    fig.suptitle(f"NIAH {args.metric} — {os.path.basename(str(result.get('model', '')))}"
                 + (f", ratio {ratio:g}" if ratio is not None else ""), fontsize=11)
    fig.colorbar(image, ax=axes, shrink=0.8, label=args.metric)

    out = args.output or os.path.splitext(args.result)[0] + ".png"
    fig.savefig(out, dpi=130)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
