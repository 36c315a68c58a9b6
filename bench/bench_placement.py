#!/usr/bin/env python3
"""Shard placement A/B: `parallel.placement = "chunks"` against `"tokens"` (docs/design.md §5.1).

Runs the same request with both placements, alternating round by round so both see the same
machine load, on N MPI ranks through launch/mpirun.sh, and prints, per placement, each rank's
shard (tokens), the shard-prefill time of the slowest rank, how long the fastest rank then waits
(max - min shard prefill), and the TTFT, as median [min..max] over the rounds; then the TTFT
ratio chunks / tokens per round and its median, and one JSON line.

  bench/bench_placement.py --np 2 --rounds 3 -- --config configs/demo.toml --set ...

Arguments after `--` go to infoflow_sp (an `answer` job). Run from the repository root with the
binary built (build/infoflow_sp). Writes only under a temporary directory.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run_once(root, np_, placement, extra, out):
    cmd = [os.path.join(root, "launch", "mpirun.sh"), "-np", str(np_),
           os.path.join(root, "build", "infoflow_sp"), *extra,
           "--set", f"parallel.placement={placement}", "--out", out]
    p = subprocess.run(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-4000:])
        raise SystemExit(f"bench_placement: infoflow_sp failed (placement {placement}, rc {p.returncode})")
    with open(out) as f:
        j = json.load(f)
    pre = next(ph for ph in j["phases"] if ph["name"] in ("shard_prefill", "store_load"))
    ms = pre["ms"] if isinstance(pre["ms"], list) else [pre["ms"]]
    shards = j.get("shard_tokens", [])
    return {"ttft_ms": j["ttft_ms"], "prefill_max_ms": max(ms),
            "prefill_wait_ms": max(ms) - min(ms), "shard_tokens": shards,
            "answer": j["answer"]}


def spread(xs):
    return statistics.median(xs), min(xs), max(xs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("extra", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    extra = a.extra[1:] if a.extra[:1] == ["--"] else a.extra
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = {"chunks": [], "tokens": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for pl in ("chunks", "tokens"):
                rows[pl].append(run_once(root, a.np, pl, extra, os.path.join(tmp, f"{pl}-{r}.json")))
    print(f"shard placement A/B: {a.np} ranks, {a.rounds} interleaved rounds; ms median [min..max]")
    print(f"{'placement':9} {'shard tokens per rank':>24} {'slowest shard_prefill':>26} "
          f"{'fastest rank waits':>24} {'TTFT':>26}")
    summary = {}
    for pl, rs in rows.items():
        m = {k: spread([x[k] for x in rs]) for k in ("prefill_max_ms", "prefill_wait_ms", "ttft_ms")}
        shards = "/".join(str(t) for t in rs[0]["shard_tokens"])
        cells = [f"{v[0]:8.0f} [{v[1]:6.0f}..{v[2]:6.0f}]" for v in m.values()]
        print(f"{pl:9} {shards:>24} {cells[0]:>26} {cells[1]:>24} {cells[2]:>26}")
        summary[pl] = {"shard_tokens": rs[0]["shard_tokens"],
                       **{k: {"median": round(v[0], 1), "min": round(v[1], 1), "max": round(v[2], 1)}
                          for k, v in m.items()}}
    ratios = [c["ttft_ms"] / t["ttft_ms"] for c, t in zip(rows["chunks"], rows["tokens"])]
    same = all(c["answer"] == t["answer"] for c, t in zip(rows["chunks"], rows["tokens"]))
    print("TTFT chunks / tokens per round: " + ", ".join(f"{x:.3f}" for x in ratios)
          + f"; median {statistics.median(ratios):.3f}; same answer in every round: {same}")
    print(json.dumps({"bench": "placement_ab", "ranks": a.np, "rounds": a.rounds, **summary,
                      "ttft_ratio_chunks_over_tokens": [round(x, 4) for x in ratios],
                      "ttft_ratio_median": round(statistics.median(ratios), 4),
                      "same_answer": same}))


if __name__ == "__main__":
    main()
