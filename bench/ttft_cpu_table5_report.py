#!/usr/bin/env python3
"""The CPU Table 5 report (bench/ttft_cpu_table5.sh): reads OUT/<point>-<length>.json, prints a
markdown report (one table per length with spread, the emulated-vs-real check at P = 2, the
targets), and writes beside it the rows as JSON lines and CSV and a plot of TTFT against length
per method (PNG). Pure reading: the measurements are the JSON files.

    bench/ttft_cpu_table5_report.py OUT_DIR [--results DIR] [--previous FILE.jsonl]

--previous keeps the rows of an earlier report's JSON lines (e.g. the committed
bench/results/ttft-cpu-table5-smollm2.jsonl) for the (point, length) pairs OUT_DIR does not
hold, each marked with the run it came from. --results DIR writes DIR/ttft-cpu-table5-smollm2.{md,jsonl,csv,png} (the committed result);
without it the files go to OUT_DIR. Ends with one machine-readable line
{"bench": "ttft_cpu_table5", ...}.
"""
import argparse
import csv
import glob
import io
import json
import os
import re
import sys

NAME = "ttft-cpu-table5-smollm2"
LINKS = {"shm": "shared memory (1 us, 8 GB/s)", "ib": "InfiniBand class (3 us, 12 GB/s)"}
AGREE = 0.10   # emulated P = 2 within 10 % of the real 2 ranks
TARGET_P4 = 3.6  # emulated P = 4 infoflow/kv vs single at 8K
TARGET_RING_32K = 2.6  # emulated P = 4 infoflow/kv vs the zigzag ring at 32K
ORDER = {"single": 0, "ring/zigzag": 1, "infoflow/kv": 2}


def point_of(path):
    m = re.match(r"(real2|emul-(\d+)-(\w+))-(\d+)\.json$", os.path.basename(path))
    if not m:
        return None
    if m.group(1) == "real2":
        return {"point": "real2", "setup": "real, 2 ranks", "P": 2, "link": "mpi", "emulated": False}
    P, link = int(m.group(2)), m.group(3)
    return {"point": f"emul:{P}:{link}", "setup": f"emulated, {P} ranks, {link}", "P": P,
            "link": link, "emulated": True}


def load(out):
    rows, meta = [], {}
    for path in sorted(glob.glob(os.path.join(out, "*.json"))):
        pt = point_of(path)
        if pt is None:
            continue
        j = json.load(open(path))
        meta.setdefault("provenance", j.get("provenance", {}))
        commit = j.get("provenance", {}).get("tool", {}).get("commit", "?")[:12]
        for r in j["rows"]:
            rows.append(dict(pt, method=r["method"], clock=j.get("clock", "wall"), commit=commit, tokens=r["tokens"], ranks=r["ranks"],
                             ttft_ms=r["ttft_ms"], ttft_min_ms=r["ttft_min_ms"],
                             ttft_max_ms=r["ttft_max_ms"], spread=r["spread"], runs=r["runs"],
                             past_window=r.get("past_window", False),
                             bytes_per_rank_per_layer=r["bytes_per_rank_per_layer"],
                             phases_ms=r["phases_ms"], file=os.path.basename(path)))
    return rows, meta


def add_previous(rows, path):
    """The earlier report's rows for the (point, length) pairs `rows` lacks."""
    have = {(r["point"], r["tokens"]) for r in rows}
    kept = []
    for line in open(path):
        r = json.loads(line)
        if (r["point"], r["tokens"]) not in have:
            r.pop("bench", None)
            r.setdefault("clock", "wall")
            r["previous"] = os.path.basename(path)
            kept.append(r)
    return rows + kept


def find(rows, point, method, tokens):
    for r in rows:
        if r["point"] == point and r["method"] == method and r["tokens"] == tokens:
            return r
    return None


def report(rows, meta):
    f = io.StringIO()
    p = meta.get("provenance", {})
    cpu = p.get("host", {}).get("cpu", {})
    tool = p.get("tool", {})
    lengths = sorted({r["tokens"] for r in rows})
    w = lambda s="": f.write(s + "\n")  # noqa: E731
    w("# TTFT on CPU nodes: the paper's Table 5 layout (bench/ttft_cpu_table5.sh)")
    w()
    w(f"Machine: {cpu.get('model', '?')}, {p.get('host', {}).get('hardware_threads', '?')} "
      f"hardware threads, kernels `{cpu.get('isa', '?')}`; flags: {' '.join(cpu.get('flags', []))}. "
      f"Commit {tool.get('commit', '?')[:12]}, {tool.get('build_type', '?')} build. Model: "
      f"{p.get('model', {}).get('file', '?')} (native Q4_1 weights), one thread per rank, "
      "chunks of 1024 tokens, ratio 0.15, synthetic token ids.")
    w()
    w("`single` is `full` on one rank (the real run's). `real, 2 ranks` rows are two MPI "
      "processes on this machine's two cores. `emulated` rows run P virtual ranks taking turns "
      "on one core: each rank's compute is measured segment by segment and the collectives "
      "between them follow the link's alpha-beta model (docs/design.md §10) — what P CPU nodes "
      "of this core's speed would see. Rows marked * run past the model's trained window "
      "(`model.positions`; SmolLM2's is 8192 positions): timing only.")
    for L in lengths:
        w()
        w(f"## {L} tokens")
        w()
        here = [r for r in rows if r["tokens"] == L]
        prev = sorted({r["previous"] for r in here if r.get("previous")})
        commits = sorted({r["commit"] for r in here if r.get("commit")})
        if prev:
            ours = f"; this run's rows: commit {', '.join(commits)}" if commits else ""
            w(f"Rows from an earlier run ({', '.join(prev)}) where this run has none{ours}. "
              f"{meta.get('previous_note', '')}".rstrip())
            w()
        if any(r.get("clock") == "cpu" for r in here):
            w("Rows marked (CPU clock) read the process's CPU time (`bench.clock = \"cpu\"`), "
              "not the wall clock: the machine was shared with other work while they ran.")
            w()
        w("| setup | method | ranks | TTFT ms (median) | min – max | spread | runs | vs single | vs ring | bytes/rk/layer |")
        w("|---|---|---|---|---|---|---|---|---|---|")
        single = find(rows, "real2", "single", L)
        for r in sorted((r for r in rows if r["tokens"] == L),
                        key=lambda r: (r["method"] != "single", r["P"], r["link"],
                                       ORDER.get(r["method"], 9))):
            ring = find(rows, r["point"], "ring/zigzag", L)
            vs_s = f"{single['ttft_ms'] / r['ttft_ms']:.2f}x" if single else "-"
            vs_r = f"{ring['ttft_ms'] / r['ttft_ms']:.2f}x" if ring and r["method"] != "single" else "-"
            setup = "real, 1 rank" if r["method"] == "single" else r["setup"]
            if r.get("clock") == "cpu":
                setup += " (CPU clock)"
            if r.get("previous"):
                setup += " (earlier run)"
            star = "*" if r["past_window"] else ""
            w(f"| {setup} | {r['method']}{star} | {r['ranks']} | {r['ttft_ms']:,.0f} | "
              f"{r['ttft_min_ms']:,.0f} – {r['ttft_max_ms']:,.0f} | {100 * r['spread']:.0f}% | "
              f"{r['runs']} | {vs_s} | {vs_r} | {r['bytes_per_rank_per_layer']:,.0f} |")
    # Emulated P = 2 against the real 2 ranks.
    checks = {"agree": [], "p4_vs_single": [], "p4_beats_ring": []}
    w()
    w("## Emulated P = 2 against the real 2 ranks")
    w()
    w(f"The emulation is trusted at P = 4 and 8 only if it reproduces the real 2-rank run within "
      f"{100 * AGREE:.0f} %.")
    w()
    w("| tokens | method | real ms | emulated (shm) ms | emulated / real | within 10 % |")
    w("|---|---|---|---|---|---|")
    for L in lengths:
        for m in ("ring/zigzag", "infoflow/kv"):
            a, b = find(rows, "real2", m, L), find(rows, "emul:2:shm", m, L)
            if a and b:
                q = b["ttft_ms"] / a["ttft_ms"]
                ok = abs(q - 1) <= AGREE
                checks["agree"].append({"tokens": L, "method": m, "ratio": q, "ok": ok})
                w(f"| {L} | {m} | {a['ttft_ms']:,.0f} | {b['ttft_ms']:,.0f} | {q:.3f} | "
                  f"{'yes' if ok else '**no**'} |")
    w()
    w("## Targets")
    w()
    single8 = find(rows, "real2", "single", 8192)
    for link in LINKS:
        r = find(rows, f"emul:4:{link}", "infoflow/kv", 8192)
        if r and single8:
            s = single8["ttft_ms"] / r["ttft_ms"]
            checks["p4_vs_single"].append({"link": link, "speedup": s, "ok": s >= TARGET_P4})
            w(f"- emulated P = 4 ({LINKS[link]}), 8192 tokens: InfoFlow `kv` is {s:.2f}x `single` "
              f"(target ≥ {TARGET_P4}x): {'met' if s >= TARGET_P4 else '**not met**'}.")
    for L in lengths:
        for link in LINKS:
            a = find(rows, f"emul:4:{link}", "infoflow/kv", L)
            b = find(rows, f"emul:4:{link}", "ring/zigzag", L)
            if a and b:
                q = b["ttft_ms"] / a["ttft_ms"]
                checks["p4_beats_ring"].append({"tokens": L, "link": link, "vs_ring": q,
                                                "ok": q > 1})
                w(f"- emulated P = 4 ({link}), {L} tokens: InfoFlow `kv` is {q:.2f}x the zigzag "
                  f"ring: {'faster' if q > 1 else '**not faster**'}.")
                if L == 32768:
                    ok = q >= TARGET_RING_32K
                    checks.setdefault("p4_vs_ring_32k", []).append(
                        {"link": link, "vs_ring": q, "ok": ok})
                    w(f"- emulated P = 4 ({link}), 32768 tokens: {q:.2f}x the ring (target ≥ "
                      f"{TARGET_RING_32K}x): {'met' if ok else '**not met**'}.")
    return f.getvalue(), checks


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    series = {}
    for r in rows:
        if r["method"] == "single":
            key = ("single (1 rank)", "k", "o", "-")
        else:
            color = {"real2": "tab:gray", "emul:2:shm": "tab:olive", "emul:4:shm": "tab:blue",
                     "emul:4:ib": "tab:cyan", "emul:8:shm": "tab:red",
                     "emul:8:ib": "tab:orange"}.get(r["point"], "tab:purple")
            style = "-" if r["method"] == "infoflow/kv" else "--"
            marker = "s" if r["method"] == "infoflow/kv" else "^"
            key = (f"{r['method']} ({r['setup']})", color, marker, style)
        series.setdefault(key, []).append((r["tokens"], r["ttft_ms"] / 1000))
    for (label, color, marker, style), pts in sorted(series.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, marker=marker,
                label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context tokens")
    ax.set_ylabel("TTFT (s)")
    title = "TTFT on CPU nodes, SmolLM2-135M, 1 core per rank"
    prev = sorted({r["tokens"] for r in rows if r.get("previous")})
    if prev:  # an earlier run's rows (--previous) may come from another machine
        title += "\n" + ", ".join(str(t) for t in prev) + " tokens: an earlier run (see the report)"
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--results", help="write the committed result files into this directory")
    ap.add_argument("--previous", help="an earlier report's JSON lines, for the pairs OUT lacks")
    ap.add_argument("--previous-note", default="",
                    help="what the earlier run was (machine, commit), printed with its rows")
    a = ap.parse_args()
    rows, meta = load(a.out)
    if a.previous and rows:
        rows = add_previous(rows, a.previous)
        meta["previous_note"] = a.previous_note
    if not rows:
        sys.exit(f"{a.out}: no <point>-<length>.json files (run bench/ttft_cpu_table5.sh)")
    dest = a.results or a.out
    md, checks = report(rows, meta)
    with open(os.path.join(dest, NAME + ".md"), "w") as f:
        f.write(md)
    with open(os.path.join(dest, NAME + ".jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(dict(r, bench="ttft_cpu_table5")) + "\n")
    cols = ["point", "setup", "P", "link", "emulated", "tokens", "method", "ranks", "ttft_ms",
            "ttft_min_ms", "ttft_max_ms", "spread", "runs", "past_window",
            "bytes_per_rank_per_layer", "clock"]
    with open(os.path.join(dest, NAME + ".csv"), "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        wr.writeheader()
        wr.writerows(rows)
    plot(rows, os.path.join(dest, NAME + ".png"))
    sys.stdout.write(md)
    summary = {"bench": "ttft_cpu_table5", "rows": len(rows),
               "lengths": sorted({r["tokens"] for r in rows}), **checks}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
