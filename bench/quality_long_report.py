#!/usr/bin/env python3
"""Tables and plots of the long-context quality runs (docs/quality.md "Long contexts") for
bench/results/quality-long-smollm2.md.

Reads sweep results (the final JSON or the row log FILE.jsonl[.gz] of a run still going or
stopped; FILE may be a comma-separated list of the shards of one run, sweep.first_case) and
recomputes every statistic from the rows with the job's bootstrap (bench/quality_report.py:
2000 resamples, SplitMix64, 95 %), on the cases every point of a file finished, so the paired
comparisons pair.

Usage:
    python3 bench/quality_long_report.py \\
        --methods 2K=out/ql-methods-2k.jsonl --methods 4K=out/ql-methods-4k.jsonl \\
        --methods 8K=out/ql-methods-8k.jsonl --ratio out/ql-ratio-4k.jsonl \\
        --ranks out/ql-ranks-4k.jsonl --store out/ql-store-4k.jsonl \\
        --variants 2K=out/ql-dev-2k.jsonl \\
        --heldout 2K=out/ql-heldout-2k.jsonl --heldout 4K=out/ql-heldout-4k.jsonl \\
        --plots bench/results --prefix quality-long-smollm2 > tables.md

Sections (each only when its input is given):
  --methods LEN=FILE   per length: the method table, each InfoFlow point against CacheBlend
                       and EPIC (paired), KL and accuracy per case kind and per evidence depth;
                       the Pareto plot <prefix>-pareto-LEN.png (mean KL against online ms);
  --ratio FILE         the ratio curve (ratio 0.05-0.5) and <prefix>-ratio.png;
  --ranks FILE         P ranks: every point against the one-rank InfoFlow point, paired;
  --store FILE         the store against the fresh chunk prefill: every point against the
                       first (fresh) one, paired, and the cases equal to it to the bit;
  --variants LEN=FILE  development runs of the selection variants: each against the default
                       InfoFlow point, CacheBlend and EPIC, paired, with its online-time ratio;
  --heldout LEN=FILE   the held-out confirmation and the decision rule of docs/quality.md;
  --decompose LABEL=FILE  P ranks: the kv exchange's loss split into what the recompute, the
                       answer and the scores miss (docs/quality.md "P ranks");
  --exchanges LABEL=FILE  P ranks: every exchange against one rank and exact, with its bytes
                       against the zigzag ring's and the targets of docs/quality.md "P ranks".
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quality_report import (bootstrap, by_point, fmt_iv, fmt_pair, load_rows,  # noqa: E402
                            method_of, method_table, paired, values)

BASE = "method.name=infoflow"
CB = "method.name=cacheblend"
EPIC = "method.name=epic"
TIME_LIMIT = 1.2  # docs/quality.md decision rule: at most 1.2x InfoFlow's online time


def load_all(paths):
    """Rows of one or more files (comma-separated: the shards of one run, sweep.first_case)."""
    rows = []
    for path in paths.split(","):
        rows += load_rows(path)
    return rows


def labelled(arg):
    label, _, path = arg.partition("=")
    if not path:
        sys.exit(f"expected LABEL=FILE, got {arg!r}")
    return label, path


def mean_of(pts, p, cases, key):
    return float(np.mean(values(pts, p, cases, key))) if cases else float("nan")


def versus_rows(pts, cases, points, others):
    """Rows: point | KL - other (paired) for each other | accuracy - first other | ms ratio."""
    out = []
    for p in points:
        if p not in pts:
            continue
        kl = values(pts, p, cases, "mean_kl")
        cells = [f"`{p}`", fmt_iv(bootstrap(kl), "%.4f")]
        for o in others:
            cells.append("-" if o == p or o not in pts else
                         fmt_pair(paired(kl, values(pts, o, cases, "mean_kl")), "%+.4f"))
        base_ms = mean_of(pts, BASE, cases, "online_ms") if BASE in pts else float("nan")
        cells.append("%.2f" % (mean_of(pts, p, cases, "online_ms") / base_ms))
        cells.append(fmt_iv(bootstrap(values(pts, p, cases, "correct")), "%.2f"))
        out.append("| " + " | ".join(cells) + " |")
    return out


def breakdown(pts, cases, key, points, title):
    """Mean KL [CI] and accuracy per value of a row field (kind, depth)."""
    groups = {}
    for c in cases:
        groups.setdefault(pts["full"][c].get(key), []).append(c)
    shown = [p for p in points if p in pts]
    md = [f"#### {title}", "",
          "| " + key + " | n | " + " | ".join(f"`{p}` KL" for p in shown) +
          " | " + " | ".join(f"`{p}` acc" for p in shown) + " |",
          "|---|---|" + "---|" * (2 * len(shown))]
    for g in sorted(groups, key=lambda x: (x is None, x)):
        cs = groups[g]
        row = ["%.2f" % g if isinstance(g, float) else str(g), str(len(cs))]
        row += [fmt_iv(bootstrap(values(pts, p, cs, "mean_kl")), "%.4f") for p in shown]
        row += ["%.2f" % mean_of(pts, p, cs, "correct") for p in shown]
        md.append("| " + " | ".join(row) + " |")
    return md + [""]


def pareto_plot(plt, pts, cases, title, path):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    # The methods keep one colour in every plot; the InfoFlow variants take the colours that no
    # method uses, in order, and a square marker.
    fixed = {BASE: "tab:blue", CB: "tab:orange", EPIC: "tab:green", "method.name=none": "tab:gray"}
    spare = iter(["tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"] * 4)
    for p in pts:
        if p == "full":
            continue
        kl = bootstrap(values(pts, p, cases, "mean_kl"))
        ms = mean_of(pts, p, cases, "online_ms")
        ax.errorbar([ms], [kl[1]], yerr=[[kl[1] - kl[2]], [kl[3] - kl[1]]],
                    marker="o" if p in fixed else "s", capsize=3,
                    label=p if len(p) < 48 else p[:45] + "...",
                    color=fixed[p] if p in fixed else next(spare))
    full_ms = mean_of(pts, "full", cases, "online_ms")
    ax.axvline(full_ms, color="gray", ls="--", lw=1, label="full prefill")
    ax.set_xlabel("online ms (scoring + recompute + suffix prefill)")
    ax.set_ylabel("mean KL(full || method) along the answer (nats)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}", file=sys.stderr)


def methods_section(label, path, plt, args):
    pts, cases = by_point(load_all(path))
    order = ["full"] + [p for p in pts if p != "full"]
    md = [f"### {label}: methods at ratio {args.ratio_default}", ""]
    md += method_table(pts, cases, order, BASE, f"{label} (n = {len(cases)})")[2:] + [""]
    infoflow_pts = [p for p in pts if method_of(p)[0] == "infoflow" and p != "full"]
    md += [f"#### {label}: InfoFlow points against CacheBlend and EPIC (paired KL differences)",
           "", "Negative = closer to full than the other method; (n.s.) = the interval contains "
           "0; ms ratio = online time / the default InfoFlow point's.", "",
           "| point | mean KL | − infoflow | − cacheblend | − epic | ms ratio | accuracy |",
           "|---|---|---|---|---|---|---|"]
    md += versus_rows(pts, cases, infoflow_pts, [BASE, CB, EPIC]) + [""]
    shown = [BASE, CB, EPIC, "method.name=none"]
    md += breakdown(pts, cases, "kind", shown, f"{label}: per case kind")
    md += breakdown(pts, cases, "depth", shown, f"{label}: per evidence depth "
                    "(0 = first document, 1 = last)")
    if plt:
        pareto_plot(plt, pts, cases, f"SmolLM2-135M, {label}: KL against online time "
                    f"(n = {len(cases)}, 95 % intervals)",
                    os.path.join(args.plots, f"{args.prefix}-pareto-{label}.png"))
    return md


def ratio_section(path, plt, args):
    pts, cases = by_point(load_all(path))
    curve = {}
    for p in pts:
        if p == "full":
            continue
        m, ratio = method_of(p)
        curve.setdefault(m, []).append((ratio if ratio is not None else args.ratio_default, p))
    md = ["### Ratio curve", "", f"n = {len(cases)} cases (the same for every row).", "",
          "| method | ratio | online ms | mean KL | accuracy | KL − cacheblend | KL − epic |",
          "|---|---|---|---|---|---|---|"]
    by_ratio = {}
    for m in curve:
        for r, p in curve[m]:
            by_ratio.setdefault(r, {})[m] = p
    for m in sorted(curve):
        for r, p in sorted(curve[m]):
            kl = values(pts, p, cases, "mean_kl")
            vs = []
            for o in ("cacheblend", "epic"):
                q = by_ratio[r].get(o)
                vs.append(fmt_pair(paired(kl, values(pts, q, cases, "mean_kl")), "%+.4f")
                          if q and m == "infoflow" else "-")
            md.append(f"| {m} | {r:.2f} | {mean_of(pts, p, cases, 'online_ms'):.0f} | "
                      f"{fmt_iv(bootstrap(kl), '%.4f')} | "
                      f"{fmt_iv(bootstrap(values(pts, p, cases, 'correct')), '%.2f')} | "
                      f"{vs[0]} | {vs[1]} |")
    md.append("")
    if plt:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for m in sorted(curve):
            pr = sorted(curve[m])
            x = [mean_of(pts, p, cases, "online_ms") for _, p in pr]
            iv = [bootstrap(values(pts, p, cases, "mean_kl")) for _, p in pr]
            ax.errorbar(x, [v[1] for v in iv], yerr=[[v[1] - v[2] for v in iv],
                                                     [v[3] - v[1] for v in iv]],
                        marker="o", capsize=3, label=m)
            for (r, _), xx, v in zip(pr, x, iv):
                ax.annotate(f"{r:.2f}", (xx, v[1]), fontsize=7, textcoords="offset points",
                            xytext=(3, 3))
        ax.axvline(mean_of(pts, "full", cases, "online_ms"), color="gray", ls="--", lw=1,
                   label="full prefill")
        ax.set_yscale("log")
        ax.set_xlabel("online ms (scoring + recompute + suffix prefill), labels = ratio")
        ax.set_ylabel("mean KL(full || method) along the answer")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(f"SmolLM2-135M, 4K: speed/quality over method.ratio (n = {len(cases)})",
                     fontsize=9)
        fig.tight_layout()
        out = os.path.join(args.plots, f"{args.prefix}-ratio.png")
        fig.savefig(out, dpi=110)
        plt.close(fig)
        print(f"wrote {out}", file=sys.stderr)
    return md


def ranks_section(path):
    rows = load_all(path)
    pts, cases = by_point(rows)
    md = ["### P ranks (virtual ranks, the sequence-parallel code)", "",
          f"n = {len(cases)} cases; paired KL differences against the one-rank `{BASE}`; "
          "online ms of P > 1 is the modelled critical path (docs/quality.md).", "",
          "| point | ranks | exchange | softmax | mean KL | KL − one rank | accuracy | online ms |",
          "|---|---|---|---|---|---|---|---|"]
    for p in pts:
        if p == "full":
            continue
        r0 = pts[p][cases[0]] if cases else {}
        kl = values(pts, p, cases, "mean_kl")
        vs = "-" if p == BASE or BASE not in pts else fmt_pair(
            paired(kl, values(pts, BASE, cases, "mean_kl")), "%+.4f")
        md.append(f"| `{p}` | {r0.get('ranks', 1)} | {r0.get('exchange', '-')} | "
                  f"{r0.get('softmax', '-')} | {fmt_iv(bootstrap(kl), '%.4f')} | {vs} | "
                  f"{fmt_iv(bootstrap(values(pts, p, cases, 'correct')), '%.2f')} | "
                  f"{mean_of(pts, p, cases, 'online_ms'):.0f} |")
    return md + [""]


def store_section(path):
    """The store against the fresh chunk prefill (docs/quality.md "The store"): every point
    against the first, fresh one, paired, and how many cases are equal to it to the bit."""
    pts, cases = by_point(load_all(path))
    points = [p for p in pts if p != "full"]
    fresh = points[0]
    md = ["### The store against the fresh chunk prefill", "",
          f"n = {len(cases)} cases; paired differences against the fresh point `{fresh}` "
          "(KL: positive = farther from full; accuracy: negative = fewer answers kept).", "",
          "| point | store | mean KL | KL − fresh | accuracy | accuracy − fresh | first-token KL "
          "| cases equal to fresh | online ms |", "|---|---|---|---|---|---|---|---|---|"]
    kl0 = values(pts, fresh, cases, "mean_kl")
    acc0 = values(pts, fresh, cases, "correct")
    for p in points:
        r0 = pts[p][cases[0]] if cases else {}
        kl = values(pts, p, cases, "mean_kl")
        acc = values(pts, p, cases, "correct")
        same = sum(pts[p][c]["mean_kl"] == pts[fresh][c]["mean_kl"] and
                   pts[p][c]["answer"] == pts[fresh][c]["answer"] for c in cases)
        vs_kl = "-" if p == fresh else fmt_pair(paired(kl, kl0), "%+.6f")
        vs_acc = "-" if p == fresh else fmt_pair(paired(acc, acc0), "%+.2f")
        store = r0.get("store", {}).get("dtype", "-")
        md.append(f"| `{p}` | {store} | {fmt_iv(bootstrap(kl), '%.4f')} | {vs_kl} | "
                  f"{fmt_iv(bootstrap(acc), '%.2f')} | {vs_acc} | "
                  f"{fmt_iv(bootstrap(values(pts, p, cases, 'first_kl')), '%.4f')} | "
                  f"{same}/{len(cases)} | {mean_of(pts, p, cases, 'online_ms'):.0f} |")
    return md + [""]


def rank_points(pts, cases):
    """{(ranks, exchange, softmax): point} of the P-rank points (rows from parallel.virtual_ranks)."""
    out = {}
    for p in pts:
        r0 = pts[p][cases[0]] if cases else {}
        if r0.get("ranks", 1) > 1:
            out[(r0["ranks"], r0.get("exchange"), r0.get("softmax", "global"))] = p
    return out


def decompose_section(label, path):
    """The kv exchange's loss against one rank, split into what the recompute misses
    (kv-answer-exact: only the recompute sees its shard), what the answer misses
    (exact-answer-kv: only the answer does), their interaction (the rest of kv's loss, paired per
    case) and what the scores miss (the local softmax against the global one, with kv)."""
    pts, cases = by_point(load_all(path))
    rp = rank_points(pts, cases)
    base = values(pts, BASE, cases, "mean_kl")
    md = [f"### {label}: where the `kv` exchange loses (n = {len(cases)})", "",
          "Paired mean-KL differences on the same cases (nats, 95 % bootstrap intervals): "
          "total = `kv` − one rank; recompute = `kv-answer-exact` − one rank (the recomputed "
          "tokens see chunk 0, their shard and S; the answer sees every key); answer = "
          "`exact-answer-kv` − one rank (the reverse); interaction = total − recompute − answer; "
          "scores = `kv` with `scoring.softmax = \"local\"` − `kv` (global).", "",
          "| ranks | total | recompute | answer | interaction | scores (local − global) | "
          "accuracy: one rank / kv / kv-answer-exact / exact-answer-kv |",
          "|---|---|---|---|---|---|---|"]
    acc1 = mean_of(pts, BASE, cases, "correct")
    for P in sorted({k[0] for k in rp}):
        kv, ra, ar = (rp.get((P, e, "global")) for e in ("kv", "kv-answer-exact",
                                                         "exact-answer-kv"))
        loc = rp.get((P, "kv", "local"))
        if not (kv and ra and ar):
            continue
        d_kv = np.asarray(values(pts, kv, cases, "mean_kl")) - base
        d_r = np.asarray(values(pts, ra, cases, "mean_kl")) - base
        d_a = np.asarray(values(pts, ar, cases, "mean_kl")) - base
        inter = d_kv - d_r - d_a
        cells = [str(P)] + [fmt_pair(paired(d, np.zeros_like(d)), "%+.4f")
                            for d in (d_kv, d_r, d_a, inter)]
        cells.append(fmt_pair(paired(values(pts, loc, cases, "mean_kl"),
                                     values(pts, kv, cases, "mean_kl")), "%+.4f") if loc else "-")
        cells.append(" / ".join("%.2f" % mean_of(pts, q, cases, "correct")
                                for q in (BASE, kv, ra, ar)))
        md.append("| " + " | ".join(cells) + " |")
    md.append("")
    md.append(f"One rank's accuracy: {acc1:.2f}.")
    return md + [""]


# The targets of the P-rank exchange study (docs/quality.md "P ranks"), fixed before the held-out run.
KL_UPPER = 0.02       # the 95 % interval's upper end of KL − one rank, nats
ACC_WITHIN = 0.05     # |accuracy − one rank's|
TIME_VS_EXACT = 0.6   # mean online ms / exact's at the same P, measured in the same run
BYTES_VS_RING = 0.35  # mean over cases of the busiest rank's bytes / the zigzag ring's


def exchanges_section(label, path):
    """Every P-rank point against one rank (KL and accuracy, paired), its online time against
    `exact` at the same P and its busiest rank's bytes against the zigzag ring's, and whether it
    meets the targets."""
    pts, cases = by_point(load_all(path))
    rp = rank_points(pts, cases)
    base = values(pts, BASE, cases, "mean_kl")
    acc1 = mean_of(pts, BASE, cases, "correct")
    md = [f"### {label}: exchanges on P ranks against one rank (n = {len(cases)})", "",
          "KL − one rank and accuracy − one rank paired on the same cases (95 % bootstrap "
          "intervals); online ms is the modelled critical path (virtual ranks, measured in the "
          "same run: compare within the table); × exact = online ms / `exact`'s at the same P; "
          "bytes = the busiest rank's bytes sent + received to the first token, mean over the "
          "cases, MB; × ring = the mean of its ratio to the zigzag ring's busiest rank. Targets: "
          f"KL interval's upper end ≤ +{KL_UPPER}, |accuracy − one rank| ≤ {ACC_WITHIN}, "
          f"× exact ≤ {TIME_VS_EXACT}, × ring ≤ {BYTES_VS_RING}.", "",
          "| ranks | exchange | softmax | mean KL | KL − one rank | accuracy | acc − one rank | "
          "online ms | × exact | bytes MB | × ring | meets |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    md.append(f"| 1 | - | - | {fmt_iv(bootstrap(base), '%.4f')} | - | "
              f"{fmt_iv(bootstrap(values(pts, BASE, cases, 'correct')), '%.2f')} | - | "
              f"{mean_of(pts, BASE, cases, 'online_ms'):.0f} | - | - | - | - |")
    for key in sorted(rp, key=lambda k: (k[0], k[2] != "global", k[1])):
        P, ex, sm = key
        p = rp[key]
        kl = values(pts, p, cases, "mean_kl")
        vs = paired(kl, base)
        acc = values(pts, p, cases, "correct")
        va = paired(acc, values(pts, BASE, cases, "correct"))
        ms = mean_of(pts, p, cases, "online_ms")
        ex_p = rp.get((P, "exact", "global"))
        t_ratio = ms / mean_of(pts, ex_p, cases, "online_ms") if ex_p else float("nan")
        b = values(pts, p, cases, "bytes_max")
        ring = values(pts, p, cases, "ring_bytes_max")
        b_ratio = float(np.mean(np.asarray(b) / np.asarray(ring)))
        meets = (vs[3] <= KL_UPPER and abs(float(np.mean(acc)) - acc1) <= ACC_WITHIN and
                 t_ratio <= TIME_VS_EXACT and b_ratio <= BYTES_VS_RING)
        md.append(f"| {P} | {ex} | {sm} | {fmt_iv(bootstrap(kl), '%.4f')} | "
                  f"{fmt_pair(vs, '%+.4f')} | {float(np.mean(acc)):.2f} | "
                  f"{fmt_pair(va, '%+.2f')} | {ms:.0f} | {t_ratio:.2f} | "
                  f"{float(np.mean(b)) / 1e6:.1f} | {b_ratio:.2f} | {'yes' if meets else 'no'} |")
    return md + [""]


def variants_section(label, path):
    pts, cases = by_point(load_all(path))
    points = [p for p in pts if p != "full"]
    md = [f"### Development set, {label}: selection variants (n = {len(cases)})", "",
          "Paired KL differences on the same cases (negative = closer to full); ms ratio = "
          "online time / the default InfoFlow point's, measured in the same run.", "",
          "| point | mean KL | − infoflow | − cacheblend | − epic | ms ratio | accuracy |",
          "|---|---|---|---|---|---|---|"]
    md += versus_rows(pts, cases, points, [BASE, CB, EPIC])
    return md + [""]


def heldout_section(files):
    md = ["### Held-out confirmation", "",
          "The decision rule (docs/quality.md): a variant becomes the default when at 2K and at "
          "4K its paired KL difference against CacheBlend and against EPIC lies entirely below "
          "0, at no more than 1.2x the default InfoFlow point's online time.", "",
          "| length | point | n | mean KL | − cacheblend | − epic | − infoflow | ms ratio | "
          "passes |", "|---|---|---|---|---|---|---|---|---|"]
    verdict = {}
    for label, path in files:
        pts, cases = by_point(load_all(path))
        for p in pts:
            if method_of(p)[0] != "infoflow" or p == "full":
                continue
            kl = values(pts, p, cases, "mean_kl")
            vc = paired(kl, values(pts, CB, cases, "mean_kl"))
            ve = paired(kl, values(pts, EPIC, cases, "mean_kl"))
            vb = paired(kl, values(pts, BASE, cases, "mean_kl")) if p != BASE else None
            ratio = mean_of(pts, p, cases, "online_ms") / mean_of(pts, BASE, cases, "online_ms")
            ok = vc[3] < 0 and ve[3] < 0 and ratio <= TIME_LIMIT
            verdict.setdefault(p, []).append(ok)
            md.append(f"| {label} | `{p}` | {len(cases)} | {fmt_iv(bootstrap(kl), '%.4f')} | "
                      f"{fmt_pair(vc, '%+.4f')} | {fmt_pair(ve, '%+.4f')} | "
                      f"{fmt_pair(vb, '%+.4f') if vb else '-'} | {ratio:.2f} | "
                      f"{'yes' if ok else 'no'} |")
    md.append("")
    labels = {label for label, _ in files}
    if not {"2K", "4K"} <= labels:
        return md + [f"- No verdict: the rule needs the held-out runs at 2K and at 4K; given: "
                     f"{', '.join(sorted(labels))}.", ""]
    for p, oks in verdict.items():
        md.append(f"- `{p}`: " + ("passes at every length" if all(oks) and len(oks) == len(files)
                                 else "does not pass at every length"))
    return md + [""]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--methods", action="append", default=[], type=labelled)
    ap.add_argument("--ratio")
    ap.add_argument("--ranks")
    ap.add_argument("--store")
    ap.add_argument("--variants", action="append", default=[], type=labelled)
    ap.add_argument("--decompose", action="append", default=[], type=labelled)
    ap.add_argument("--exchanges", action="append", default=[], type=labelled)
    ap.add_argument("--heldout", action="append", default=[], type=labelled)
    ap.add_argument("--plots", default=None, help="folder for the PNGs (none: no plots)")
    ap.add_argument("--prefix", default="quality-long")
    ap.add_argument("--ratio-default", type=float, default=0.15)
    args = ap.parse_args()
    plt = None
    if args.plots:
        os.makedirs(args.plots, exist_ok=True)
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: F811
    md = []
    for label, path in args.methods:
        md += methods_section(label, path, plt, args)
    if args.ratio:
        md += ratio_section(args.ratio, plt, args)
    if args.ranks:
        md += ranks_section(args.ranks)
    if args.store:
        md += store_section(args.store)
    for label, path in args.variants:
        md += variants_section(label, path)
    for label, path in args.decompose:
        md += decompose_section(label, path)
    for label, path in args.exchanges:
        md += exchanges_section(label, path)
    if args.heldout:
        md += heldout_section(args.heldout)
    print("\n".join(md))


if __name__ == "__main__":
    main()
