#!/usr/bin/env python3
"""RAG serving under load: this server (job serve) against llama.cpp's llama-server on the same
CPU cores, the same GGUF and the same prompts, closed loop at 1 to N concurrent clients,
measured interleaved.

Workload: a pool of --docs documents (~400 tokens each: one stated fact in original filler
prose, configs/data/filler.txt), stored once in our KV store (POST /v1/documents, timed apart);
each request cites --cite of them in a random order plus a question about one of them (seeded:
--seed). Variants:
  - ours infoflow+store: InfoFlow (ratio 0.15) with the documents loaded from the store;
  - ours full:           the exact prefill of the whole prompt (no store: the same prefill work
                         as the peer), the reference of `agree`;
  - llama-server:        /completion with the same prompt text (our qa template in ChatML),
                         --parallel = clients (one slot per client), continuous batching, its
                         prompt cache on (cache_prompt; the default --cache-reuse 0);
  - llama-server reuse:  (--peer-reuse N) the same with --cache-reuse N;
  - ours before:         (--baseline-build DIR) the server of another build (e.g. main before
                         batching), at 1 client only: "no slower than today's server".
For every client count of --clients: each variant runs --rounds rounds, the variants in a
rotating order within each round, every round a closed loop of C clients, each sending its
requests back to back (streamed, greedy, --max-tokens tokens); every variant gets the same
requests. Per variant and client count: TTFT (client side: request sent to the first generated
text) p50/p95, inter-token latency (gaps between streamed tokens) p50/p95, requests/s and
output tokens/s over the variant's own windows, agreement of its answers with ours `full`'s
and answers containing the fact. A table, one JSON line per measurement; --results-dir DIR
also writes DIR/serve-rag-smollm2-cpu.{jsonl,md,png} (with --append the JSON lines are added to
the file's, e.g. the 2-rank run after the 1-rank one, and the report and plot cover both).

  bench/bench_serve.py [--build build] [--clients 1,4,16] [--requests 48] [--rounds 2]
                       [--warmup 1] [--threads 2] [--ranks 1] [--docs 32] [--cite 8]
                       [--doc-tokens 400] [--max-tokens 32] [--seed 2026] [--peer-reuse 0]
                       [--prefill-chunk N] [--baseline-build DIR] [--results-dir DIR] [--append]
"""

import argparse
import http.client
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
INTRO = "Answer the question using the documents below.\n\n"
RESULTS = "serve-rag-smollm2-cpu"

PLACES = ["Ashford", "Brindle", "Carrow", "Dunmere", "Elsworth", "Fennick", "Garrow", "Holt",
          "Ingle", "Jarrow", "Kestle", "Lowick", "Marden", "Norcott", "Oakham", "Penrith",
          "Quarry", "Rothley", "Selby", "Tarrant", "Upwell", "Varley", "Wenlock", "Yarrow",
          "Alnwick", "Bexley", "Coldham", "Derwent", "Eskdale", "Farleigh", "Glenby", "Hexham"]
FIRST = ["Agnes", "Bernard", "Clara", "Desmond", "Edith", "Felix", "Greta", "Hugo", "Irene",
         "Jasper", "Lydia", "Magnus", "Nora", "Oswald", "Philippa", "Rupert"]
LAST = ["Moray", "Thackeray", "Pennick", "Ashdown", "Carlisle", "Dunstan", "Everard", "Fairley",
        "Goodwin", "Harcourt", "Ingram", "Kendrick", "Lockwood", "Merriman", "Northcote",
        "Osgood"]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---- workload -------------------------------------------------------------------------------

def make_documents(n, doc_tokens, seed):
    """n documents, each one fact (who founded the archive of PLACE) in ~doc_tokens of prose."""
    rng = random.Random(seed)
    with open(os.path.join(ROOT, "configs", "data", "filler.txt")) as f:
        sentences = [s.strip() + "." for s in re.split(r"\.\s+", f.read()) if len(s.split()) > 4]
    docs, facts = [], []
    words = int(doc_tokens / 1.3)  # ~1.3 tokens per word of this prose
    for i in range(n):
        place = PLACES[i % len(PLACES)]
        name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        fact = f"The town archive of {place} was founded in {1700 + rng.randrange(250)} by {name}."
        body = []
        while sum(len(s.split()) for s in body) < words:
            body.append(rng.choice(sentences))
        at = rng.randrange(len(body))
        docs.append(" ".join(body[:at] + [fact] + body[at:]))
        facts.append((place, name))
    return docs, facts


def make_request(key, docs, facts, cite, seed):
    """The request named `key` (a tuple): cite documents in a random order and a question."""
    rng = random.Random(f"{seed}/{key}")
    chosen = rng.sample(range(len(docs)), cite)  # a random order as well
    place, name = facts[rng.choice(chosen)]
    return {"key": key, "docs": [docs[i] for i in chosen], "answer": name,
            "question": f"Who founded the town archive of {place}?"}


def prompt_text(req):
    """The prompt our server builds for a request (qa template, ChatML), as text."""
    ctx = "".join(d + "\n\n" for d in req["docs"])
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{INTRO}{ctx}"
            f"Question: {req['question']}\nAnswer with a short phrase.<|im_end|>\n"
            "<|im_start|>assistant\n")


# ---- one streamed request -------------------------------------------------------------------

def stream_post(port, path, body, timeout=3600):
    """POSTs a streamed request. Returns a dict: ttft (s), e2e (s), gaps (s between streamed
    tokens after the first), text, last (the last JSON event)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.perf_counter()
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{path}: HTTP {r.status}: {r.read()[:300]!r}")
    ttft, text, last, buf, times = None, "", None, b"", []
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: ") or ev == b"data: [DONE]":
                continue
            j = json.loads(ev[6:])
            last = j
            piece = j.get("content")
            if piece is None and j.get("choices"):
                piece = j["choices"][0].get("delta", {}).get("content")
            if piece:
                times.append(time.perf_counter())
                if ttft is None:
                    ttft = times[-1] - t0
            text += piece or ""
    e2e = time.perf_counter() - t0
    c.close()
    return {"ttft": ttft if ttft is not None else e2e, "e2e": e2e, "text": text, "last": last,
            "gaps": [b - a for a, b in zip(times, times[1:])]}


def run_request(variant, req, ports, max_tokens):
    """One request of a variant; adds its output token count."""
    if variant.startswith("llama-server"):
        body = {"prompt": prompt_text(req), "n_predict": max_tokens, "stream": True,
                "cache_prompt": True, "temperature": 0.0, "top_k": 1}
        out = stream_post(ports[variant], "/completion", body)
        t = (out["last"] or {}).get("timings", {})
        out["tokens"] = t.get("predicted_n") or (out["last"] or {}).get("tokens_predicted", 0)
        return out
    body = {"messages": [{"role": "user", "content": req["question"]}], "documents": req["docs"],
            "max_tokens": max_tokens, "stream": True, "temperature": 0}
    if variant == "ours full":
        body["infoflow"] = {"method": "full"}
    out = stream_post(ports[variant], "/v1/chat/completions", body)
    info = (out["last"] or {}).get("infoflow", {})
    out["tokens"] = len(info.get("answer", {}).get("token_ids", []))
    out["store_hits"] = info.get("store", {}).get("hits")
    return out


def closed_loop(variant, clients, keys_of, reqs, ports, max_tokens):
    """`clients` threads, client c sending the requests keys_of[c] back to back. Returns the
    per-request results and the window's wall time."""
    results, errors = [], []
    lock = threading.Lock()

    def client(c):
        for key in keys_of[c]:
            try:
                out = run_request(variant, reqs[key], ports, max_tokens)
            except Exception as e:  # noqa: BLE001
                errors.append(f"{variant} {key}: {e}")
                return
            out["key"] = key
            with lock:
                results.append(out)

    t0 = time.perf_counter()
    ths = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    if errors:
        raise RuntimeError("; ".join(errors[:3]))
    return results, time.perf_counter() - t0


# ---- servers --------------------------------------------------------------------------------

def wait_http(port, proc, what, timeout=600):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not get ready")


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start_ours(a, tmp, build, name, max_clients):
    port = free_port()
    env = dict(os.environ, INFOFLOW_PROGRESS="0", OMP_WAIT_POLICY="passive",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    args = [os.path.join(build, "infoflow_sp"), "--config", "configs/serve.toml",
            "--set", f"serve.port={port}", "--set", f"store.path={tmp}/{name}.h5",
            "--set", "store.mode=read-write", "--set", f"model.threads={a.threads // a.ranks}",
            "--set", "serve.max_tokens=256", "--set", "serve.request_timeout_s=3000"]
    if name == "ours":  # the batching settings (a baseline build may not know them)
        args += ["--set", f"serve.max_batch={max_clients}",
                 "--set", f"serve.queue_size={max(16, max_clients)}",
                 "--set", "serve.kv_budget_mb=8192"]
        if a.prefill_chunk:
            args += ["--set", f"serve.prefill_chunk={a.prefill_chunk}"]
        if a.prefill_slice_ms is not None:
            args += ["--set", f"serve.prefill_slice_ms={a.prefill_slice_ms}"]
        for kv in a.set:
            args += ["--set", kv]
    if a.ranks > 1:
        args = ["mpirun", "-n", str(a.ranks), "--oversubscribe", "--bind-to", "none"] + args
    log_f = open(os.path.join(tmp, f"{name}.log"), "w")
    p = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log_f, stderr=subprocess.STDOUT,
                         start_new_session=True)
    wait_http(port, p, f"infoflow_sp serve ({name})")
    return p, port


def store_documents(port, docs):
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    c.request("POST", "/v1/documents", body=json.dumps({"documents": docs}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    stored = json.loads(r.read())
    if r.status != 200:
        raise RuntimeError(f"POST /v1/documents: {r.status} {stored}")
    return time.perf_counter() - t0, [d["tokens"] for d in stored["data"]]


def start_peer(a, tmp, peer_bin, reuse, clients):
    port = free_port()
    per_slot = 4096  # a prompt of 8 x 400 tokens and the answer
    args = [peer_bin, "-m", MODEL, "--host", "127.0.0.1", "--port", str(port), "-t",
            str(a.threads), "-tb", str(a.threads), "-c", str(per_slot * clients), "-np",
            str(clients), "--cont-batching"]
    if reuse:
        args += ["--cache-reuse", str(reuse)]
    log_f = open(os.path.join(tmp, f"peer{reuse}-{clients}.log"), "w")
    # The same OpenMP waiting as ours: threads that spin while waiting lose badly when other
    # processes share the cores, which would measure the machine's load, not the engine.
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    p = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log_f, stderr=subprocess.STDOUT,
                         start_new_session=True)
    wait_http(port, p, "llama-server")
    return p, port


def stop(p):
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


# ---- measurement ----------------------------------------------------------------------------

def quantile(xs, q):
    s = sorted(xs)
    if not s:
        return float("nan")
    if len(s) == 1:
        return s[0]
    pos = q * (len(s) - 1)
    lo = int(pos)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (pos - lo)


def summarize(variant, clients, rows, wall_s, full_text):
    ttft = [r["ttft"] for r in rows]
    gaps = [g for r in rows for g in r["gaps"]]
    # Agreement with ours `full` (0 when --variants left it out).
    agree = sum(r["key"] in full_text and r["text"].strip() == full_text[r["key"]].strip()
                for r in rows)
    correct = sum(r["answer"].lower() in r["text"].lower() for r in rows)
    return {"variant": variant, "clients": clients, "requests": len(rows),
            "ttft_p50_ms": 1000 * quantile(ttft, 0.5), "ttft_p95_ms": 1000 * quantile(ttft, 0.95),
            "itl_p50_ms": 1000 * quantile(gaps, 0.5), "itl_p95_ms": 1000 * quantile(gaps, 0.95),
            "e2e_p50_ms": 1000 * quantile([r["e2e"] for r in rows], 0.5),
            "req_per_s": len(rows) / wall_s, "tok_per_s": sum(r["tokens"] for r in rows) / wall_s,
            "wall_s": wall_s, "agree_with_full": agree, "correct": correct}


def table(summaries):
    lines = [f"{'variant':22s} {'clients':>7s} {'n':>4s} {'TTFT p50':>9s} {'p95 ms':>7s} "
             f"{'ITL p50':>8s} {'p95 ms':>7s} {'req/s':>7s} {'tok/s':>7s} {'vs peer req/s':>13s} "
             f"{'TTFT p95 / peer':>15s} {'agree':>7s} {'correct':>7s}"]
    peer = {s["clients"]: s for s in summaries if s["variant"] == "llama-server"}
    for s in summaries:
        p = peer.get(s["clients"])
        rel = f"{s['req_per_s'] / p['req_per_s']:12.2f}x" if p else f"{'-':>13s}"
        rt = f"{s['ttft_p95_ms'] / p['ttft_p95_ms']:14.2f}x" if p else f"{'-':>15s}"
        lines.append(
            f"{s['variant']:22s} {s['clients']:7d} {s['requests']:4d} {s['ttft_p50_ms']:9.0f} "
            f"{s['ttft_p95_ms']:7.0f} {s['itl_p50_ms']:8.0f} {s['itl_p95_ms']:7.0f} "
            f"{s['req_per_s']:7.3f} {s['tok_per_s']:7.1f} {rel} {rt} "
            f"{s['agree_with_full']:3d}/{s['requests']:<3d} {s['correct']:3d}/{s['requests']}")
    return "\n".join(lines)


def targets(summaries):
    """The issue's targets, each as a line: holds / misses (and by how much)."""
    by = {(s["variant"], s["clients"]): s for s in summaries}
    out = []
    ours = "ours infoflow+store"
    for c in sorted({s["clients"] for s in summaries}):
        o, p = by.get((ours, c)), by.get(("llama-server", c))
        if o and p and c >= 4:
            r = o["req_per_s"] / p["req_per_s"]
            t = o["ttft_p95_ms"] / p["ttft_p95_ms"]
            out.append(f"{c} clients: req/s {r:.2f}x llama-server's (target >= 3x: "
                       f"{'holds' if r >= 3 else 'misses'}), TTFT p95 {t:.2f}x "
                       f"(target <= 0.33x: {'holds' if t <= 0.33 else 'misses'})")
    one, before = by.get((ours, 1)), by.get(("ours before", 1))
    if one and before:
        r = one["ttft_p50_ms"] / before["ttft_p50_ms"]
        out.append(f"1 client: TTFT p50 {r:.2f}x the server before batching (target <= 1.05x: "
                   f"{'holds' if r <= 1.05 else 'misses'})")
    many = [s for s in summaries if s["variant"] == ours and s["clients"] >= 16]
    if one and many:
        r = many[-1]["itl_p95_ms"] / one["itl_p95_ms"]
        out.append(f"{many[-1]['clients']} clients: ITL p95 {r:.2f}x the single stream's "
                   f"(target <= 2x: {'holds' if r <= 2 else 'misses'})")
    return out


def plot(lines, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = {}
    for s in lines:
        series.setdefault((s["variant"], s["ranks"]), []).append(s)
    for (v, r), ss in sorted(series.items()):
        ss.sort(key=lambda s: s["clients"])
        several = len({s["ranks"] for s in lines}) > 1
        label = f"{v} ({r}-rank run)" if several else v
        x = [s["clients"] for s in ss]
        ax1.plot(x, [s["ttft_p95_ms"] / 1000 for s in ss], marker="o", label=label)
        ax2.plot(x, [s["req_per_s"] for s in ss], marker="o", label=label)
    clients = sorted({s["clients"] for s in lines})
    for ax, what in ((ax1, "TTFT p95 (s)"), (ax2, "requests/s")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(clients)
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
    ax1.set_yscale("log")
    ax2.legend(fontsize=8)
    fig.suptitle("RAG serving, SmolLM2-135M Q4_1, closed loop (bench/bench_serve.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# ---- the run --------------------------------------------------------------------------------

def machine():
    cpu = ""
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                   if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "host": platform.node(),
            "load_1min": os.getloadavg()[0]}


def level_keys(a, clients, rnd):
    per_client = max(1, a.requests // (clients * a.rounds))
    return [[(clients, rnd, c, j) for j in range(per_client)] for c in range(clients)]


def run_level(a, clients, variants, ports, reqs_for):
    """Warm-up, then a.rounds rounds of every variant (rotating order) at `clients` clients.
    Returns {variant: (rows, wall_s)}."""
    out = {v: ([], 0.0) for v in variants}
    if a.warmup:
        keys = [[("warm", clients, c, j) for j in range(a.warmup)] for c in range(clients)]
        for v in variants:
            closed_loop(v, clients, keys, reqs_for(keys), ports, a.max_tokens)
    for rnd in range(a.rounds):
        keys = level_keys(a, clients, rnd)
        reqs = reqs_for(keys)
        k = rnd % len(variants)
        for v in variants[k:] + variants[:k]:
            rows, wall = closed_loop(v, clients, keys, reqs, ports, a.max_tokens)
            for r in rows:
                r["answer"] = reqs[r["key"]]["answer"]
            out[v] = (out[v][0] + rows, out[v][1] + wall)
            ttft = statistics.median(r["ttft"] for r in rows)
            log(f"[bench] {clients} clients, round {rnd + 1}/{a.rounds}: {v}: {len(rows)} "
                f"requests in {wall:.1f} s, TTFT p50 {1000 * ttft:.0f} ms")
    return out


def measure(a, tmp, docs, facts, peer_bin):
    """Every client count; returns the summaries and the store build time."""
    procs, summaries = [], []
    max_c = max(a.clients)

    def reqs_for(keys):
        return {k: make_request(k, docs, facts, a.cite, a.seed) for ks in keys for k in ks}

    try:
        ours, port = start_ours(a, tmp, a.build, "ours", max_c)
        procs.append(ours)
        ports = {"ours infoflow+store": port, "ours full": port}
        store_s, doc_tokens = store_documents(port, docs)
        log(f"[bench] stored {len(docs)} documents ({statistics.mean(doc_tokens):.0f} tokens "
            f"each on average) in {store_s:.1f} s")
        if a.baseline_build:
            before, ports["ours before"] = start_ours(a, tmp, a.baseline_build, "before", 1)
            procs.append(before)
            store_documents(ports["ours before"], docs)
        for clients in a.clients:
            variants = ["ours infoflow+store", "ours full"] + \
                (["ours before"] if a.baseline_build and clients == 1 else []) + \
                ["llama-server"] + (["llama-server reuse"] if a.peer_reuse else [])
            if a.variants:
                variants = [v for v in variants if v in a.variants]
            peers = []
            if "llama-server" in variants:
                peers.append(start_peer(a, tmp, peer_bin, 0, clients))
                ports["llama-server"] = peers[-1][1]
            if "llama-server reuse" in variants:
                peers.append(start_peer(a, tmp, peer_bin, a.peer_reuse, clients))
                ports["llama-server reuse"] = peers[-1][1]
            try:
                got = run_level(a, clients, variants, ports, reqs_for)
            finally:
                for p, _ in peers:
                    stop(p)
            full_text = {r["key"]: r["text"] for r in got.get("ours full", ([], 0))[0]}
            for v in variants:
                summaries.append(summarize(v, clients, got[v][0], got[v][1], full_text))
    finally:
        for p in procs:
            stop(p)
    return summaries, store_s, statistics.mean(doc_tokens)


def report(a, lines, head):
    """The report: every table (one per rank count among `lines`), the targets, the plot."""
    out = ["# RAG serving under load: job serve against llama-server (CPU)", "", head, ""]
    for ranks in sorted({s["ranks"] for s in lines}):
        ss = [s for s in lines if s["ranks"] == ranks]
        m = ss[0]
        out += [f"## Ours on {ranks} rank{'s' if ranks > 1 else ''}", "",
                f"Run on {m['cpu']} ({m['cores']} cores, load average {m['load_1min']:.1f} at "
                f"the start), `{m['command']}`:", "", "```", table(ss), "```", ""]
        out += [f"- {t}" for t in targets(ss)] + [""]
    out += [f"![TTFT p95 and throughput against clients]({RESULTS}.png)", "",
            f"JSON lines: `{RESULTS}.jsonl`."]
    return "\n".join(out) + "\n"


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--requests", type=int, default=48,
                    help="requests per variant per client count (over all rounds)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1, help="warm-up requests per client")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--docs", type=int, default=32)
    ap.add_argument("--cite", type=int, default=8)
    ap.add_argument("--doc-tokens", type=int, default=400)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--peer-reuse", type=int, default=0,
                    help="also run llama-server with --cache-reuse N (0: not)")
    ap.add_argument("--prefill-chunk", type=int, default=0,
                    help="ours: serve.prefill_chunk (0: the config's): tokens of context work "
                         "between two decode steps")
    ap.add_argument("--prefill-slice-ms", type=float, default=None,
                    help="ours: serve.prefill_slice_ms (default: the config's): the most "
                         "milliseconds of context work between two decode steps")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="ours: one more config setting (repeatable), e.g. "
                         "serve.buffer_pool_mb=0; the baseline build does not get it")
    ap.add_argument("--variants", type=lambda s: [v.strip() for v in s.split(",") if v.strip()],
                    default=[],
                    help="run only these variants (comma-separated names as in the table, e.g. "
                         "'ours infoflow+store,ours full'); default: all. Without llama-server "
                         "the ratios to it are not printed: a study of our own settings, not "
                         "the benchmark")
    ap.add_argument("--baseline-build", default="",
                    help="a build dir whose infoflow_sp is measured at 1 client as 'ours before'")
    ap.add_argument("--results-dir", default="")
    ap.add_argument("--append", action="store_true",
                    help="add to DIR's JSON lines instead of replacing them")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    a.clients = [int(c) for c in a.clients.split(",")]
    if a.baseline_build:
        a.baseline_build = os.path.abspath(a.baseline_build)
    return a


def main():
    a = parse_args()
    peer_dir = subprocess.run([os.path.join(ROOT, "bench", "build_llama_cpp.sh"), "--dir",
                               os.path.join(a.build, "llama_cpp_peer"), "--server"],
                              check=True, stdout=subprocess.PIPE, text=True).stdout.split()[-1]
    docs, facts = make_documents(a.docs, a.doc_tokens, a.seed)
    tmp = tempfile.mkdtemp(prefix="bench-serve-")
    m = machine()
    summaries, store_s, doc_tokens = measure(a, tmp, docs, facts,
                                             os.path.join(peer_dir, "llama-server"))
    command = " ".join(["bench/bench_serve.py"] + sys.argv[1:])
    head = (f"RAG serving, closed loop at {', '.join(map(str, a.clients))} clients, {a.rounds} "
            f"interleaved rounds of every variant (after {a.warmup} warm-up request(s) per "
            f"client), streamed, greedy, {a.max_tokens} tokens: {a.cite} of {a.docs} documents "
            f"(~{doc_tokens:.0f} tokens each) per request in random order + a question; ours "
            f"`configs/serve.toml` (InfoFlow ratio 0.15, f16 KV cache and store, "
            f"serve.max_batch = the most clients, serve.prefill_chunk = "
            f"{a.prefill_chunk or 'its default'}) with {a.threads} threads over its ranks, "
            f"llama-server {a.threads} threads with --parallel = clients, continuous "
            f"batching and cache_prompt; {os.path.basename(MODEL)}; seed {a.seed}. The documents "
            f"were stored before the timed requests (POST /v1/documents, {store_s:.1f} s).")
    print(head)
    print(table(summaries))
    for t in targets(summaries):
        print(t)
    lines = []
    for s in summaries:
        s.update({"bench": "serve-rag", "threads": a.threads, "ranks": a.ranks, "docs": a.docs,
                  "cite": a.cite, "max_tokens": a.max_tokens, "seed": a.seed,
                  "rounds": a.rounds, "store_build_s": store_s, "command": command,
                  "model": os.path.basename(MODEL), **m})
        lines.append(s)
        print(json.dumps(s, sort_keys=True))
    if a.results_dir:
        write_results(a, lines, head)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


def write_results(a, lines, head):
    os.makedirs(a.results_dir, exist_ok=True)
    base = os.path.join(a.results_dir, RESULTS)
    if a.append and os.path.exists(base + ".jsonl"):
        with open(base + ".jsonl") as f:
            old = [json.loads(ln) for ln in f if ln.strip()]
        lines = [s for s in old if s["ranks"] != a.ranks] + lines
    with open(base + ".jsonl", "w") as f:
        f.write("".join(json.dumps(s, sort_keys=True) + "\n" for s in lines))
    with open(base + ".md", "w") as f:
        f.write(report(a, lines, head))
    plot(lines, base + ".png")
    log(f"[bench] wrote {base}.md, .jsonl and .png")


if __name__ == "__main__":
    sys.exit(main())
