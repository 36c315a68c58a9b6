#!/usr/bin/env python3
"""Tables and plots of the quality lab (job `sweep`, docs/quality.md) for bench/results/.

Reads the rows of one or more sweep results -- the final JSON (`--out FILE.json`) or, for a run
that is still going or was stopped, its row log FILE.jsonl (one row per finished run) -- and
recomputes every statistic from the rows with the same percentile bootstrap as the job
(runtime/jobs/stats.cpp: 2000 resamples, SplitMix64 indices, seed 0x5eed2026, 95 %), so the
numbers of a finished run equal the job's own summary. Only cases whose every point finished
are used, so each table's points share their cases (paired comparisons need that).

Usage:
    pip install -r bench/requirements.txt          # matplotlib (numpy comes with it)
    python3 bench/quality_report.py --methods out/quality-methods.jsonl \\
        --ratio out/quality-ratio.jsonl --layers out/quality-layers.jsonl \\
        --plots bench/results --prefix quality-smollm2 > tables.md

Prints markdown tables (methods at the config's ratio, layouts, ratio curve, layer sweep) and
writes PNGs: <prefix>-pareto.png (mean KL and accuracy against online TTFT per method),
<prefix>-layers.png (per-layer mean KL and accuracy with intervals). Any input may be left out.
"""

import argparse
import gzip
import json
import os
import sys

import numpy as np

RESAMPLES = 2000
SEED = 0x5EED2026
M64 = (1 << 64) - 1


def splitmix_indices(n, count, seed):
    """The job's SplitMix64 index stream: count draws of (z % n), in order."""
    k = np.arange(1, count + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + k * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(n)).astype(np.int64)


def percentile(sorted_v, q):
    at = q * (len(sorted_v) - 1)
    i = int(np.floor(at))
    j = min(i + 1, len(sorted_v) - 1)
    return sorted_v[i] + (at - i) * (sorted_v[j] - sorted_v[i])


def bootstrap(x):
    """(n, mean, lo, hi) as runtime/jobs/stats.cpp bootstrap_mean."""
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    if n == 0:
        return (0, 0.0, 0.0, 0.0)
    mean = float(x.sum() / n)
    if np.all(x == x[0]):
        return (n, float(x[0]), float(x[0]), float(x[0]))
    idx = splitmix_indices(n, RESAMPLES * n, SEED).reshape(RESAMPLES, n)
    # Sequential sums as in the job (left to right), so the means match to the last bit.
    means = np.sort(np.cumsum(x[idx], axis=1)[:, -1] / n)
    return (n, mean, percentile(means, 0.025), percentile(means, 0.975))


def paired(a, b):
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    n, m, lo, hi = bootstrap(d)
    return (n, m, lo, hi, n >= 2 and (lo > 0 or hi < 0))


def fmt_iv(iv, f="%.3f"):
    n, m, lo, hi = iv[:4]
    if n == 0:
        return "-"
    return (f % m) + " [" + (f % lo) + ", " + (f % hi) + "]"


def fmt_pair(p, f="%+.3f"):
    if p[0] == 0:
        return "-"
    return fmt_iv(p, f) + ("" if p[4] else " (n.s.)")


def load_rows(path):
    if path.endswith(".jsonl") or path.endswith(".jsonl.gz"):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    with open(path, encoding="utf-8") as f:
        result = json.load(f)
    if result.get("job") != "sweep":
        sys.exit(f"{path}: not a sweep result (job = {result.get('job')!r})")
    return result["rows"]


def by_point(rows):
    """{point: {case: row}}, points in first-seen order, and the cases every point finished."""
    pts = {}
    for r in rows:
        pts.setdefault(r["point"], {})[r["case"]] = r
    common = None
    for d in pts.values():
        common = set(d) if common is None else common & set(d)
    return pts, sorted(common or [])


def values(pts, point, cases, key):
    return [float(pts[point][c][key]) for c in cases]


def method_table(pts, cases, order, base, title):
    out = [f"### {title}", "",
           f"n = {len(cases)} cases (the same cases for every row); 95 % bootstrap intervals; "
           f"paired differences against `{base}` on the same cases, (n.s.) = the interval "
           "contains 0.", "",
           "| point | n | accuracy | acc − full | mean KL (answer) | KL − " + base +
           " | first-token KL | argmax agree | exact | ref log p | selected | online ms | TTFT ms |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in order:
        if p not in pts:
            continue
        acc = values(pts, p, cases, "correct")
        kl = values(pts, p, cases, "mean_kl")
        vs_full = paired(acc, values(pts, "full", cases, "correct")) if p != "full" else None
        vs_base = paired(kl, values(pts, base, cases, "mean_kl")) if p not in ("full", base) and base in pts else None
        mean = lambda k: np.mean(values(pts, p, cases, k))
        out.append("| " + " | ".join([
            f"`{p}`", str(len(cases)), fmt_iv(bootstrap(acc), "%.2f"),
            fmt_pair(vs_full, "%+.2f") if vs_full else "-",
            fmt_iv(bootstrap(kl), "%.4f"),
            fmt_pair(vs_base, "%+.4f") if vs_base else "-",
            fmt_iv(bootstrap(values(pts, p, cases, "first_kl")), "%.4f"),
            "%.3f" % mean("argmax_agree"), "%.2f" % mean("exact"), "%.2f" % mean("ref_logprob"),
            "%.3f" % mean("selected_fraction"), "%.0f" % mean("online_ms"),
            "%.0f" % mean("ttft_ms")]) + " |")
    return out


def method_of(point):
    """(method, ratio) of a point label of the shipped configs."""
    m, ratio = "infoflow", None
    for part in point.split(";"):
        k, _, v = part.strip().partition("=")
        if k == "method.name":
            m = v
        elif k == "method.ratio":
            ratio = float(v)
    return m, ratio


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--methods")
    ap.add_argument("--ratio")
    ap.add_argument("--layers")
    ap.add_argument("--plots", default=None, help="folder for the PNGs (none: no plots)")
    ap.add_argument("--prefix", default="quality")
    ap.add_argument("--default-ratio", type=float, default=0.15)
    args = ap.parse_args()
    md = []
    plt = None
    if args.plots:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: F811

    curve = {}  # method -> [(ratio, n, online ms, kl iv, acc iv)]
    if args.methods:
        pts, cases = by_point(load_rows(args.methods))
        md += method_table(pts, cases, ["full", "method.name=infoflow", "method.name=cacheblend",
                                        "method.name=epic", "method.name=none"],
                           "method.name=infoflow",
                           f"Methods at ratio {args.default_ratio} (global layout)") + [""]
        md += method_table(pts, cases, ["method.name=infoflow", "scoring.layout=hl-tp",
                                        "scoring.layout=hl-hp", "scoring.layout=tl-tp",
                                        "method.reorder=true"], "method.name=infoflow",
                           "Scoring layouts (InfoFlow, ratio %.2f); `method.name=infoflow` is "
                           "`global`" % args.default_ratio) + [""]
        for p in pts:
            m, _ = method_of(p)
            if p.startswith("method.name=") and m in ("infoflow", "cacheblend", "epic"):
                curve.setdefault(m, []).append(
                    (args.default_ratio, len(cases), np.mean(values(pts, p, cases, "online_ms")),
                     bootstrap(values(pts, p, cases, "mean_kl")),
                     bootstrap(values(pts, p, cases, "correct"))))
        full_ms = np.mean(values(pts, "full", cases, "ttft_ms")) if cases else None
    else:
        full_ms = None
    if args.ratio:
        pts, cases = by_point(load_rows(args.ratio))
        for p in pts:
            if p == "full":
                continue
            m, ratio = method_of(p)
            curve.setdefault(m, []).append(
                (ratio, len(cases), np.mean(values(pts, p, cases, "online_ms")),
                 bootstrap(values(pts, p, cases, "mean_kl")),
                 bootstrap(values(pts, p, cases, "correct"))))
        if full_ms is None and cases:
            full_ms = np.mean(values(pts, "full", cases, "ttft_ms"))
        # InfoFlow against CacheBlend and EPIC at the same ratio, paired on the same cases.
        by_ratio = {}
        for p in pts:
            if p != "full":
                m, ratio = method_of(p)
                by_ratio.setdefault(ratio, {})[m] = p
        pair_rows = []
        for ratio in sorted(by_ratio):
            d = by_ratio[ratio]
            for other in ("cacheblend", "epic"):
                if "infoflow" in d and other in d:
                    pair_rows.append("| %.2f | %s | %s | %s |" % (
                        ratio, other,
                        fmt_pair(paired(values(pts, d["infoflow"], cases, "mean_kl"),
                                        values(pts, d[other], cases, "mean_kl")), "%+.4f"),
                        fmt_pair(paired(values(pts, d["infoflow"], cases, "correct"),
                                        values(pts, d[other], cases, "correct")), "%+.2f")))
        if pair_rows:
            md += ["### InfoFlow against CacheBlend and EPIC at equal ratio (paired)", "",
                   f"n = {len(cases)} cases; InfoFlow minus the other method on the same cases "
                   "(negative KL = InfoFlow closer to full; positive accuracy = InfoFlow keeps "
                   "more answers); (n.s.) = the interval contains 0.", "",
                   "| ratio | vs | mean KL: infoflow − other | accuracy: infoflow − other |",
                   "|---|---|---|---|"] + pair_rows + [""]
    if curve:
        md += ["### Ratio curve", "",
               "Mean online time (scoring + recompute + suffix prefill over prefilled chunks, the "
               "TTFT of a KV-store deployment) against fidelity and accuracy; each row has its own "
               "n (its file's complete cases).", "",
               "| method | ratio | n | online ms | mean KL | accuracy |", "|---|---|---|---|---|---|"]
        for m in sorted(curve):
            for ratio, n, ms, kl, acc in sorted(curve[m]):
                md.append(f"| {m} | {ratio:.2f} | {n} | {ms:.0f} | {fmt_iv(kl, '%.4f')} | "
                          f"{fmt_iv(acc, '%.2f')} |")
        if full_ms is not None:
            md.append(f"| full | 1.00 | - | {full_ms:.0f} (whole prefill) | 0 | - |")
        md.append("")
        if plt:
            fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
            for m in sorted(curve):
                pts_m = sorted(curve[m])
                x = [p[2] for p in pts_m]
                for i, key in enumerate((3, 4)):
                    y = [p[key][1] for p in pts_m]
                    err = [[p[key][1] - p[key][2] for p in pts_m],
                           [p[key][3] - p[key][1] for p in pts_m]]
                    ax[i].errorbar(x, y, yerr=err, marker="o", capsize=3, label=m)
                    for p in pts_m:
                        ax[i].annotate(f"{p[0]:.2f}", (p[2], p[key][1]), fontsize=7,
                                       textcoords="offset points", xytext=(3, 3))
            if full_ms is not None:
                for a in ax:
                    a.axvline(full_ms, color="gray", ls="--", lw=1, label="full prefill")
            ax[0].set_ylabel("mean KL(full || method) along the answer (nats)")
            ax[0].set_yscale("log")
            ax[1].set_ylabel("accuracy (answer contains the gold answer)")
            for a in ax:
                a.set_xlabel("online ms (scoring + recompute + suffix), labels = ratio")
                a.grid(alpha=0.3)
            ax[0].legend(fontsize=8)
            fig.suptitle("SmolLM2-135M: speed/quality over method.ratio (95 % bootstrap intervals)")
            fig.tight_layout()
            path = os.path.join(args.plots, f"{args.prefix}-pareto.png")
            fig.savefig(path, dpi=110)
            print(f"wrote {path}", file=sys.stderr)
    if args.layers:
        pts, cases = by_point(load_rows(args.layers))
        layer_pts = [p for p in pts if p.startswith("scoring.layers=")]
        md += ["### Layer sweep (one scoring layer at a time, InfoFlow ratio %.2f, global)"
               % args.default_ratio, "",
               f"n = {len(cases)} cases per layer (the same cases); paired difference of mean KL "
               "against the best layer.", "",
               "| layer | n | mean KL | KL − best | first-token KL | accuracy | argmax agree |",
               "|---|---|---|---|---|---|---|"]
        kl = {p: values(pts, p, cases, "mean_kl") for p in layer_pts}
        best = min(layer_pts, key=lambda p: np.mean(kl[p])) if layer_pts else None
        rows = []
        for p in layer_pts:
            layer = json.loads(p.split("=", 1)[1])[0]
            iv = bootstrap(kl[p])
            acc = bootstrap(values(pts, p, cases, "correct"))
            pr = paired(kl[p], kl[best]) if p != best else None
            md.append("| " + " | ".join([
                str(layer), str(len(cases)), fmt_iv(iv, "%.4f"),
                fmt_pair(pr, "%+.4f") if pr else "(best)",
                fmt_iv(bootstrap(values(pts, p, cases, "first_kl")), "%.4f"),
                fmt_iv(acc, "%.2f"),
                "%.3f" % np.mean(values(pts, p, cases, "argmax_agree"))]) + " |")
            rows.append((layer, iv, acc))
        md.append("")
        if best is not None:
            # The rule of docs/quality.md ("Choosing the scoring layers"): the layers whose
            # paired KL difference from the best is not significant; of those, the run of four
            # consecutive layers with the lowest summed mean KL (the longest run if none has four).
            layer_of = {p: json.loads(p.split("=", 1)[1])[0] for p in layer_pts}
            ok = {layer_of[best]}
            for p in layer_pts:
                if p != best and not paired(kl[p], kl[best])[4]:  # [4]: significant
                    ok.add(layer_of[p])
            mean = {layer_of[p]: float(np.mean(kl[p])) for p in layer_pts}
            runs = []
            for start in sorted(ok):
                run = [start]
                while run[-1] + 1 in ok and len(run) < 4:
                    run.append(run[-1] + 1)
                runs.append(run)
            longest = max(len(r) for r in runs)
            pick = min((r for r in runs if len(r) == longest), key=lambda r: sum(mean[x] for x in r))
            md += [f"Best single layer: {layer_of[best]}. Not significantly worse than it: "
                   f"{', '.join(str(x) for x in sorted(ok))}. The rule's choice (four consecutive "
                   f"layers of that set with the lowest summed mean KL): **{pick}**.", ""]
        if plt and rows:
            fig, ax = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
            x = [r[0] for r in rows]
            for i, k in enumerate((1, 2)):
                y = np.array([r[k][1] for r in rows])
                lo = np.array([r[k][2] for r in rows])
                hi = np.array([r[k][3] for r in rows])
                ax[i].plot(x, y, marker="o")
                ax[i].fill_between(x, lo, hi, alpha=0.25)
                ax[i].grid(alpha=0.3)
            ax[0].set_ylabel("mean KL along the answer")
            ax[1].set_ylabel("accuracy")
            ax[1].set_xlabel("scoring layer (single)")
            fig.suptitle(f"SmolLM2-135M: InfoFlow scored with one layer (n = {len(cases)}, "
                         "95 % bootstrap bands)")
            fig.tight_layout()
            path = os.path.join(args.plots, f"{args.prefix}-layers.png")
            fig.savefig(path, dpi=110)
            print(f"wrote {path}", file=sys.stderr)
    print("\n".join(md))


if __name__ == "__main__":
    main()
