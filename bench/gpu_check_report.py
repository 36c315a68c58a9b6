#!/usr/bin/env python3
"""Tables and the pass/fail summary of bench/gpu_check.sh (docs/gpu.md), from what the steps left
under OUT: steps.jsonl (one line per step), gpu_ops.jsonl (bench_gpu_ops' JSON lines),
ttft_single.json and ttft_emulated.json (bench-ttft's --out files). Standard library only: it
runs on the device machine's python3. Writes OUT/summary.json and prints one summary line.

    gpu_check_report.py OUT MODE        MODE: device | dry-run
Exit status: 0 when every step ran (passed, or skipped where skipping is allowed) and, on the
device, every target of the acceptance list was met; 1 otherwise.
"""
import json
import os
import sys

# The paper's Table 5 (4xH100, ratio 0.15), ms: single, ring, InfoFlow (docs/design.md §10).
PAPER = {8192: (566.7, 247.5, 232.0), 16384: (1285.8, 707.8, 427.6), 32768: (3190.5, 2350.1, 914.0)}
# Targets of the acceptance list.
FULL_TTFT_MS = {8192: 250.0, 16384: 600.0, 32768: 1500.0}
INFOFLOW_SPEEDUP = {8192: 3.6, 16384: 3.9, 32768: 4.3}
GEMM_TFLOPS = 650.0  # bf16, 8192x4096x4096
ATTN_TFLOPS = 300.0  # dense causal, 8K tokens, head dim 128


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_lines(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


def nearest(rows, method, tokens):
    """The row of `method` whose token count is closest to `tokens` (within 2%)."""
    best = None
    for r in rows:
        if r.get("method") != method:
            continue
        if abs(r["tokens"] - tokens) <= 0.02 * tokens:
            if best is None or abs(r["tokens"] - tokens) < abs(best["tokens"] - tokens):
                best = r
    return best


def fmt(x, spec="%.1f"):
    return "-" if x is None else spec % x


def main():
    out, mode = sys.argv[1], sys.argv[2]
    dry = mode == "dry-run"
    steps = load_lines(os.path.join(out, "steps.jsonl"))
    ops = [r for r in load_lines(os.path.join(out, "gpu_ops.jsonl")) if r.get("bench") == "gpu_ops"]
    single = load_json(os.path.join(out, "ttft_single.json")) or {}
    emulated = load_json(os.path.join(out, "ttft_emulated.json")) or {}
    srows = single.get("rows", [])
    erows = emulated.get("rows", [])

    print("\n== steps")
    print("%-34s %-9s %8s  %s" % ("step", "status", "seconds", "note"))
    for s in steps:
        print("%-34s %-9s %8.1f  %s" % (s["step"], s["status"], s["seconds"], s.get("note", "")))

    if ops:
        print("\n== GPU ops (bench_gpu_ops, TFLOP/s at the median)")
        print("%-20s %-36s %-22s %10s %9s" % ("op", "shape", "kernel", "median ms", "TFLOP/s"))
        for r in ops:
            print("%-20s %-36s %-22s %10.3f %9.1f" % (r["op"], r["shape"], r["kernel"],
                                                      r["median_ms"], r["tflops_median"]))

    if srows:
        print("\n== single-rank full TTFT (%s)" % srows[0].get("model", "?"))
        print("%8s %12s %10s" % ("tokens", "TTFT ms", "target"))
        for r in srows:
            if r["method"] != "single":
                continue
            tgt = FULL_TTFT_MS.get(r["tokens"])
            print("%8d %12.1f %10s" % (r["tokens"], r["ttft_ms"], fmt(tgt, "%.0f")))

    lengths = sorted({r["tokens"] for r in erows})
    if erows:
        ranks = max(r["ranks"] for r in erows)
        print("\n== TTFT, %d ranks emulated on one device (%s; ms, median of %d; the paper: "
              "4xH100)" % (ranks, erows[0].get("model", "?"), erows[0].get("runs", 0)))
        print("%7s %10s %10s %10s %9s %8s %13s %13s   %s" %
              ("tokens", "single", "ring", "InfoFlow", "vs single", "vs ring", "ring B/rk/L",
               "InfoFlow B/rk/L", "paper single / ring / InfoFlow"))
        for n in lengths:
            s = nearest(erows, "single", n)
            g = nearest(erows, "ring/zigzag", n)
            i = nearest(erows, "infoflow/kv", n)
            paper = PAPER.get(n)
            print("%7d %10s %10s %10s %9s %8s %13s %13s   %s" % (
                n, fmt(s and s["ttft_ms"]), fmt(g and g["ttft_ms"]), fmt(i and i["ttft_ms"]),
                fmt(i and i.get("speedup_vs_single"), "%.2fx"),
                fmt(i and i.get("speedup_vs_ring"), "%.2fx"),
                fmt(g and g["bytes_per_rank_per_layer"], "%.0f"),
                fmt(i and i["bytes_per_rank_per_layer"], "%.0f"),
                "%.1f / %.1f / %.1f" % paper if paper else "-"))
        print("\nphases (ms, critical path: modelled; single: measured)")
        for r in erows:
            ph = "; ".join("%s %.1f" % (k, v) for k, v in r.get("phases_ms", {}).items())
            print("  %7d %-18s %s" % (r["tokens"], r["method"], ph))

    # ---- targets ----
    targets = []

    def target(name, ok, value):
        if dry:
            status = "n/a"  # thresholds are for the device; the dry run checks the steps
        else:
            status = "not-run" if ok is None else ("pass" if ok else "fail")
        targets.append({"target": name, "status": status, "value": value})

    tests = [s for s in steps if s["step"].startswith("test:")]
    op_tests = [s for s in tests if "model" not in s["step"]]
    model_tests = [s for s in tests if "model" in s["step"]]

    def tests_ok(group):
        if not group or any(s["status"] == "not-run" for s in group):
            return None
        return all(s["status"] == "pass" for s in group)

    target("gpu_op_tests", tests_ok(op_tests),
           ", ".join("%s=%s" % (s["step"][5:], s["status"]) for s in op_tests) or "none built")
    target("smollm2_cuda_vs_cpu", tests_ok(model_tests),
           ", ".join("%s=%s" % (s["step"][5:], s["status"]) for s in model_tests) or "none built")
    gemm = [r for r in ops if r["op"] == "gemm bf16->bf16"]
    target("gemm_bf16_tflops>=%.0f" % GEMM_TFLOPS,
           (gemm[0]["tflops_median"] >= GEMM_TFLOPS) if gemm else None,
           gemm[0]["tflops_median"] if gemm else None)
    attn = [r for r in ops if r["op"] == "attention causal"]
    target("attention_causal_tflops>=%.0f" % ATTN_TFLOPS,
           (attn[0]["tflops_median"] >= ATTN_TFLOPS) if attn else None,
           attn[0]["tflops_median"] if attn else None)
    for n, tgt in sorted(FULL_TTFT_MS.items()):
        r = nearest(srows, "single", n)
        target("full_ttft_%dk<=%.0fms" % (n // 1024, tgt), (r["ttft_ms"] <= tgt) if r else None,
               r["ttft_ms"] if r else None)
    for n, tgt in sorted(INFOFLOW_SPEEDUP.items()):
        r = nearest(erows, "infoflow/kv", n)
        sp = r.get("speedup_vs_single") if r else None
        target("infoflow_speedup_%dk>=%.1fx" % (n // 1024, tgt), (sp >= tgt) if sp else None, sp)
    faster = []
    for n in (lengths if dry else sorted(INFOFLOW_SPEEDUP)):
        i, g = nearest(erows, "infoflow/kv", n), nearest(erows, "ring/zigzag", n)
        faster.append(i["ttft_ms"] < g["ttft_ms"] if i and g else None)
    target("infoflow_faster_than_ring", None if (not faster or None in faster) else all(faster),
           faster)

    steps_ok = bool(steps) and all(
        s["status"] == "pass" or (s["status"] == "skip" and (dry or s.get("skip_ok")))
        for s in steps)
    targets_ok = all(t["status"] in ("pass", "n/a") for t in targets)
    ok = steps_ok and (dry or targets_ok)
    summary = {"bench": "gpu_check", "mode": mode, "steps_ok": steps_ok,
               "targets_ok": targets_ok if not dry else None, "ok": ok, "targets": targets}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print("\n== targets (%s)" % mode)
    for t in targets:
        print("  %-32s %-8s %s" % (t["target"], t["status"], t["value"]))
    print("\ngpu_check summary: %s; %s" % (
        "ok" if ok else "NOT ok", " ".join("%s=%s" % (t["target"], t["status"]) for t in targets)))
    print(json.dumps(summary))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
