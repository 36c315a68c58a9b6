#!/usr/bin/env python3
"""Summary and tables of bench/gpu_check.sh (docs/gpu.md). Standard library only: it runs on the
device machine's python3. Reads RUN/steps.jsonl (one line per finished step), RUN/running.json
(the step under way, if any), RUN/logs/*.log and the per-length TTFT steps' --out files
(RUN/ttft_single_<N>.json, RUN/ttft_emulated_<N>.json); writes OUT/summary.json and the rows so
far merged into OUT/ttft_single.json and OUT/ttft_emulated.json (each atomically). The script
calls it before and after every step, so a run killed at any point still leaves them.

    gpu_check_report.py OUT RUN MODE [--final]    MODE: device | dry-run
--final also prints the tables: every step with its status (passed / failed / timed out /
skipped / not run), its time and its figures; GPU op throughput; single-GPU TTFT; the emulated
table beside the paper's; every target of the acceptance list with pass / fail / not-run; one
summary line and the summary as one JSON line.
Exit status: 0 when every step ran (passed, or skipped where skipping is allowed) and, on the
device, every target was met; 1 otherwise.
"""
import glob
import json
import os
import re
import sys
import time

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


def json_lines(path):
    out = []
    try:
        with open(path, errors="replace") as f:
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


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def log_of(run, step):
    return os.path.join(run, "logs", re.sub(r"[^A-Za-z0-9_.-]", "_", step) + ".log")


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


def write_json(path, obj, indent=None):
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".part")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=indent)
    os.replace(tmp, path)


def merge_steps(run, kind):
    """The rows of RUN/ttft_<kind>_<N>.json in length order, and each step's config."""
    files = glob.glob(os.path.join(run, "ttft_%s_*.json" % kind))
    files.sort(key=lambda p: int(re.sub(r"\D", "", os.path.basename(p)) or 0))
    rows, configs = [], {}
    for path in files:
        doc = load_json(path) or {}
        rows += doc.get("rows", [])
        configs[os.path.basename(path)] = doc.get("config")
    return {"job": "bench-ttft", "merged_from": sorted(configs), "rows": rows,
            "configs": configs}


class Results:
    """What the steps left: the op rows, the single-GPU rows, the emulated rows."""

    def __init__(self, out, run, steps):
        self.ops = [r for r in json_lines(log_of(run, "bench_gpu_ops"))
                    if r.get("bench") == "gpu_ops"]
        single = merge_steps(run, "single")
        emulated = merge_steps(run, "emulated")
        write_json(os.path.join(out, "ttft_single.json"), single)
        write_json(os.path.join(out, "ttft_emulated.json"), emulated)
        self.single = single["rows"]
        self.emulated = emulated["rows"]
        # `single` is measured once, in the single-GPU step; the emulated steps run without it.
        for r in self.emulated:
            s = nearest(self.single, "single", r["tokens"])
            if r.get("speedup_vs_single") is None and s and r["ttft_ms"] > 0:
                r["speedup_vs_single"] = s["ttft_ms"] / r["ttft_ms"]
        self.steps = steps

    def lengths(self):
        return sorted({r["tokens"] for r in self.emulated})


def step_figures(step, run, res):
    """A short line of what a finished step measured or reported."""
    name = step["step"]
    text = read_text(log_of(run, name))
    if name.startswith("test:"):
        m = re.search(r"All tests passed \((\d+) assertions? in (\d+) test cases?\)", text)
        if m:
            return "%s assertions in %s test cases" % (m.group(1), m.group(2))
        m = re.search(r"test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed", text)
        if m:
            return "test cases: %s, %s passed, %s failed" % m.groups()
        # Script tests (the NCCL watchdog): their PASS / FAIL lines.
        return "; ".join(v[:100] for v in re.findall(r"^(?:PASS|FAIL)[^\n]*", text, re.M))
    if name == "bench_gpu_ops":
        return "; ".join("%s %.0f TFLOP/s" % (r["op"], r["tflops_median"]) for r in res.ops)
    m = re.match(r"ttft_single_(\d+)$", name)
    if m:
        r = nearest(res.single, "single", int(m.group(1)))
        return "full %.1f ms (%.0f..%.0f)" % (r["ttft_ms"], r["ttft_min_ms"],
                                              r["ttft_max_ms"]) if r else ""
    m = re.match(r"ttft_emulated_(\d+)$", name)
    if m:
        n = int(m.group(1))
        parts = []
        for meth in ("ring/zigzag", "infoflow/kv"):
            r = nearest(res.emulated, meth, n)
            if r:
                parts.append("%s %.1f ms" % (meth, r["ttft_ms"]))
        i = nearest(res.emulated, "infoflow/kv", n)
        if i:
            parts.append("InfoFlow %sx vs single, %sx vs ring" % (
                fmt(i.get("speedup_vs_single"), "%.2f"), fmt(i.get("speedup_vs_ring"), "%.2f")))
        return "; ".join(parts)
    return ""


def targets_of(res, dry):
    targets = []

    def target(name, ok, value):
        if dry:
            status = "n/a"  # thresholds are for the device; the dry run checks the steps
        else:
            status = "not-run" if ok is None else ("pass" if ok else "fail")
        targets.append({"target": name, "status": status, "value": value})

    tests = [s for s in res.steps if s["step"].startswith("test:")]
    op_tests = [s for s in tests if not any(k in s["step"] for k in ("model", "random"))]
    model_tests = [s for s in tests if any(k in s["step"] for k in ("model", "random"))]

    def tests_ok(group):
        if not group or any(s["status"] == "not run" for s in group):
            return None
        return all(s["status"] == "passed" for s in group)

    target("gpu_op_tests", tests_ok(op_tests),
           ", ".join("%s=%s" % (s["step"][5:], s["status"]) for s in op_tests) or "none built")
    target("cuda_vs_cpu_models", tests_ok(model_tests),
           ", ".join("%s=%s" % (s["step"][5:], s["status"]) for s in model_tests) or "none built")
    gemm = [r for r in res.ops if r["op"] == "gemm bf16->bf16"]
    target("gemm_bf16_tflops>=%.0f" % GEMM_TFLOPS,
           (gemm[0]["tflops_median"] >= GEMM_TFLOPS) if gemm else None,
           gemm[0]["tflops_median"] if gemm else None)
    attn = [r for r in res.ops if r["op"] == "attention causal"]
    target("attention_causal_tflops>=%.0f" % ATTN_TFLOPS,
           (attn[0]["tflops_median"] >= ATTN_TFLOPS) if attn else None,
           attn[0]["tflops_median"] if attn else None)
    for n, tgt in sorted(FULL_TTFT_MS.items()):
        r = nearest(res.single, "single", n)
        target("full_ttft_%dk<=%.0fms" % (n // 1024, tgt), (r["ttft_ms"] <= tgt) if r else None,
               r["ttft_ms"] if r else None)
    for n, tgt in sorted(INFOFLOW_SPEEDUP.items()):
        r = nearest(res.emulated, "infoflow/kv", n)
        sp = r.get("speedup_vs_single") if r else None
        target("infoflow_speedup_%dk>=%.1fx" % (n // 1024, tgt), (sp >= tgt) if sp else None, sp)
    faster = []
    for n in (res.lengths() if dry else sorted(INFOFLOW_SPEEDUP)):
        i, g = nearest(res.emulated, "infoflow/kv", n), nearest(res.emulated, "ring/zigzag", n)
        faster.append(i["ttft_ms"] < g["ttft_ms"] if i and g else None)
    target("infoflow_faster_than_ring", None if (not faster or None in faster) else all(faster),
           faster)
    return targets


def print_tables(summary, res):
    print("\n== steps (%s, %.0f s so far)" % (summary["mode"], summary["elapsed_s"]))
    print("%-30s %-10s %8s  %s" % ("step", "status", "seconds", "figures / note"))
    for s in summary["steps"]:
        what = s["figures"] or s["note"]
        if s["figures"] and s["note"] and s["status"] != "passed":
            what = s["figures"] + " | " + s["note"]
        print("%-30s %-10s %8.1f  %s" % (s["step"], s["status"], s["seconds"], what))

    if res.ops:
        print("\n== GPU ops (bench_gpu_ops, TFLOP/s at the median)")
        print("%-20s %-36s %-22s %10s %9s" % ("op", "shape", "kernel", "median ms", "TFLOP/s"))
        for r in res.ops:
            print("%-20s %-36s %-22s %10.3f %9.1f" % (r["op"], r["shape"], r["kernel"],
                                                      r["median_ms"], r["tflops_median"]))
    if res.single:
        print("\n== single-GPU full TTFT (%s)" % res.single[0].get("model", "?"))
        print("%8s %12s %10s %10s" % ("tokens", "TTFT ms", "min..max", "target"))
        for r in res.single:
            if r["method"] != "single":
                continue
            print("%8d %12.1f %10s %10s" % (
                r["tokens"], r["ttft_ms"], "%.0f..%.0f" % (r["ttft_min_ms"], r["ttft_max_ms"]),
                fmt(FULL_TTFT_MS.get(r["tokens"]), "%.0f")))
    if res.emulated:
        ranks = max(r["ranks"] for r in res.emulated)
        print("\n== TTFT, %d ranks emulated on one device (%s; ms, median of %d; single: the "
              "single-GPU step; the paper: 4xH100)" % (
                  ranks, res.emulated[0].get("model", "?"), res.emulated[0].get("runs", 0)))
        print("%7s %10s %10s %10s %9s %8s %13s %13s   %s" %
              ("tokens", "single", "ring", "InfoFlow", "vs single", "vs ring", "ring B/rk/L",
               "InfoFlow B/rk/L", "paper single / ring / InfoFlow"))
        for n in res.lengths():
            s = nearest(res.single, "single", n)
            g = nearest(res.emulated, "ring/zigzag", n)
            i = nearest(res.emulated, "infoflow/kv", n)
            paper = PAPER.get(n)
            print("%7d %10s %10s %10s %9s %8s %13s %13s   %s" % (
                n, fmt(s and s["ttft_ms"]), fmt(g and g["ttft_ms"]), fmt(i and i["ttft_ms"]),
                fmt(i and i.get("speedup_vs_single"), "%.2fx"),
                fmt(i and i.get("speedup_vs_ring"), "%.2fx"),
                fmt(g and g["bytes_per_rank_per_layer"], "%.0f"),
                fmt(i and i["bytes_per_rank_per_layer"], "%.0f"),
                "%.1f / %.1f / %.1f" % paper if paper else "-"))
        print("\nphases (ms, critical path: modelled)")
        for r in res.emulated:
            ph = "; ".join("%s %.1f" % (k, v) for k, v in r.get("phases_ms", {}).items())
            print("  %7d %-18s %s" % (r["tokens"], r["method"], ph))
    print("\n== targets (%s)" % summary["mode"])
    for t in summary["targets"]:
        print("  %-32s %-8s %s" % (t["target"], t["status"], t["value"]))
    print("\ngpu_check summary: %s; %s" % (
        "ok" if summary["ok"] else "NOT ok",
        " ".join("%s=%s" % (t["target"], t["status"]) for t in summary["targets"])))
    print(json.dumps(summary))


def main():
    args = [a for a in sys.argv[1:] if a != "--final"]
    if len(args) != 3:
        sys.exit(__doc__)
    out, run, mode = args
    final = "--final" in sys.argv[1:]
    dry = mode == "dry-run"
    steps = json_lines(os.path.join(run, "steps.jsonl"))
    res = Results(out, run, steps)
    for s in steps:
        s["figures"] = step_figures(s, run, res)
    targets = targets_of(res, dry)
    steps_ok = bool(steps) and all(
        s["status"] == "passed" or (s["status"] == "skipped" and (dry or s.get("skip_ok")))
        for s in steps)
    targets_ok = all(t["status"] in ("pass", "n/a") for t in targets)
    ok = steps_ok and (dry or targets_ok)
    summary = {"bench": "gpu_check", "mode": mode, "final": final,
               "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "elapsed_s": round(sum(s["seconds"] for s in steps), 1),
               "running": load_json(os.path.join(run, "running.json")),
               "steps": [{k: s.get(k) for k in ("step", "status", "seconds", "figures", "note")}
                         for s in steps],
               "steps_ok": steps_ok, "targets_ok": targets_ok if not dry else None, "ok": ok,
               "targets": targets}
    write_json(os.path.join(out, "summary.json"), summary, indent=1)
    if final:
        print_tables(summary, res)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
