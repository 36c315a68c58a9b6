#!/usr/bin/env python3
"""The CPU-path candidates' table from bench_cpu_paths row logs (--out FILE.jsonl).

Reads one or more row logs (a run split over --first-case ranges: a request that appears in
several files counts once, its first rows kept) and prints, per candidate, the demo and France
requests' first-token KL against the fp32 reference and, over the sweep cases, the mean KL with
a 95 % bootstrap interval, p95 and max KL, top-1 / greedy-answer agreement and the recomputed
sets' Jaccard; then each candidate's KL against the `amx` candidate's, paired per case.

Usage: bench/cpu_paths_report.py out/cpu-paths-2k.jsonl [more.jsonl ...]
"""
import json
import random
import sys


def load(paths):
    rows, seen = {}, set()
    for path in paths:
        file_keys = set()
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                key = (r["request"], r["candidate"])
                if key in seen:
                    continue
                file_keys.add(key)
                rows.setdefault(r["candidate"], {})[r["request"]] = r
        seen |= file_keys
    return rows


def bootstrap_mean(xs, resamples=2000, seed=7):
    rnd = random.Random(seed)
    n = len(xs)
    means = sorted(sum(xs[rnd.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    return sum(xs) / n, means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def main(paths):
    rows = load(paths)
    cands = [c for c in ("amx", "amx-gemm", "amx-attention", "int8") if c in rows]
    cases = sorted((k for k in rows[cands[0]] if k.startswith("case ")),
                   key=lambda k: int(k.split()[1]))
    print(f"| candidate | demo KL | France KL | cases | mean KL [95 % CI] | p95 KL | max KL | "
          f"top-1 | answer | mean J | min J | ms/req ÷ fp32 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in cands:
        r = rows[c]
        kl = [r[k]["first_kl"] for k in cases]
        m, lo, hi = bootstrap_mean(kl)
        s = sorted(kl)
        p95 = s[min(len(s) - 1, int(0.95 * len(s) + 0.999) - 1)]
        every = [r[k] for k in ["demo", "france"] + cases if k in r]
        top1 = sum(x["top1_agree"] for x in every)
        ans = sum(x["answer_agree"] for x in every)
        jac = [x["jaccard"] for x in every]
        ratio = sum(x["ms"] for x in every) / sum(x["ref_ms"] for x in every)
        print(f"| `{c}` | {r['demo']['first_kl']:.2e} | {r['france']['first_kl']:.2e} | "
              f"{len(cases)} | {m:.2e} [{lo:.2e}, {hi:.2e}] | {p95:.2e} | {max(kl):.2e} | "
              f"{top1}/{len(every)} | {ans}/{len(every)} | {sum(jac) / len(jac):.4f} | "
              f"{min(jac):.4f} | {ratio:.2f} |")
    if "amx" in rows:
        print()
        print("Paired against `amx` over the cases (KL difference, nats; ratio of means):")
        print()
        base = [rows["amx"][k]["first_kl"] for k in cases]
        for c in cands:
            if c == "amx":
                continue
            d = [rows[c][k]["first_kl"] - b for k, b in zip(cases, base)]
            m, lo, hi = bootstrap_mean(d)
            ratio = sum(rows[c][k]["first_kl"] for k in cases) / sum(base)
            print(f"- `{c}` − `amx`: {m:+.2e} [{lo:+.2e}, {hi:+.2e}], ratio of means {ratio:.2f}")
    print()
    print(json.dumps({"bench": "cpu_paths_report", "cases": len(cases),
                      "mean_first_kl": {c: sum(rows[c][k]["first_kl"] for k in cases) / len(cases)
                                        for c in cands}}))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
