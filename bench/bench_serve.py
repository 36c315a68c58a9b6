#!/usr/bin/env python3
"""RAG serving: this server (job serve) against llama.cpp's llama-server on the same CPU cores,
the same GGUF and the same prompts, measured interleaved.

Workload: a pool of --docs documents (~400 tokens each: one stated fact in original filler
prose, configs/data/filler.txt), stored once in our KV store (POST /v1/documents, timed apart);
each request cites --cite of them in a random order plus a question about one of them (seeded:
--seed). Every request goes, in a rotating order, to
  - ours infoflow+store: InfoFlow (ratio 0.15) with the documents loaded from the store;
  - ours full:           the exact prefill of the whole prompt (no store: the same prefill work
                         as the peer);
  - llama-server:        /completion with the same prompt text (our qa template in ChatML) and
                         its prompt cache on (cache_prompt; the default --cache-reuse 0);
  - llama-server reuse:  (--peer-reuse N) the same with --cache-reuse N, its KV shifting of
                         chunks of the previous prompt.
One client, streamed, greedy, --max-tokens tokens. Reports per variant TTFT (client side: the
request sent to the first generated text) p50/p95/min/max, end-to-end latency, requests/s (one
client: requests / summed latency), and each variant's answers against ours full (agreement) and
the expected fact (correct). Prints a table then one JSON line per variant; --results-dir DIR
also writes DIR/serve-rag-smollm2-cpu.md (the table, the command, the machine) and .jsonl.

  bench/bench_serve.py [--build build] [--requests 24] [--warmup 3] [--threads 2] [--ranks 1]
                       [--docs 32] [--cite 8] [--doc-tokens 400] [--max-tokens 16]
                       [--seed 2026] [--peer-reuse 0] [--results-dir DIR]
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
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
INTRO = "Answer the question using the documents below.\n\n"

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


def make_requests(n, docs, facts, cite, seed):
    rng = random.Random(seed + 1)
    out = []
    for _ in range(n):
        chosen = rng.sample(range(len(docs)), cite)  # a random order as well
        target = rng.choice(chosen)
        place, name = facts[target]
        out.append({"docs": [docs[i] for i in chosen], "question":
                    f"Who founded the town archive of {place}?", "answer": name})
    return out


def prompt_text(req):
    """The prompt our server builds for a request (qa template, ChatML), as text."""
    ctx = "".join(d + "\n\n" for d in req["docs"])
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{INTRO}{ctx}"
            f"Question: {req['question']}\nAnswer with a short phrase.<|im_end|>\n"
            "<|im_start|>assistant\n")


def stream_post(port, path, body, timeout=600):
    """POSTs a streamed request; returns (ttft_s, e2e_s, text, last_event)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.perf_counter()
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{path}: HTTP {r.status}: {r.read()[:300]!r}")
    ttft, text, last, buf = None, "", None, b""
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
            if ttft is None and (piece or j.get("choices") or j.get("content") is not None):
                ttft = time.perf_counter() - t0
            text += piece or ""
    e2e = time.perf_counter() - t0
    c.close()
    return ttft, e2e, text, last


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


def start_ours(a, tmp):
    port = free_port()
    env = dict(os.environ, INFOFLOW_PROGRESS="0", OMP_WAIT_POLICY="passive",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    args = [os.path.join(a.build, "infoflow_sp"), "--config", "configs/serve.toml",
            "--set", f"serve.port={port}", "--set", f"store.path={tmp}/bench.h5",
            "--set", "store.mode=read-write", "--set", f"model.threads={a.threads // a.ranks}",
            "--set", "serve.max_tokens=256", "--set", "serve.request_timeout_s=3000"]
    if a.ranks > 1:
        args = ["mpirun", "-n", str(a.ranks), "--oversubscribe", "--bind-to", "none"] + args
    log_f = open(os.path.join(tmp, "ours.log"), "w")
    p = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log_f, stderr=subprocess.STDOUT,
                         start_new_session=True)
    wait_http(port, p, "infoflow_sp serve")
    return p, port


def start_peer(a, tmp, peer_bin, reuse):
    port = free_port()
    args = [peer_bin, "-m", MODEL, "--host", "127.0.0.1", "--port", str(port), "-t",
            str(a.threads), "-tb", str(a.threads), "-c", "8192", "-np", "1"]
    if reuse:
        args += ["--cache-reuse", str(reuse)]
    log_f = open(os.path.join(tmp, f"peer{reuse}.log"), "w")
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


def run_variant(name, req, ours_port, peers, max_tokens):
    if name.startswith("llama-server"):
        port = peers[name]
        body = {"prompt": prompt_text(req), "n_predict": max_tokens, "stream": True,
                "cache_prompt": True, "temperature": 0.0, "top_k": 1}
        ttft, e2e, text, last = stream_post(port, "/completion", body)
        prompt_n = (last or {}).get("timings", {}).get("prompt_n")
        return ttft, e2e, text, {"prompt_evaluated": prompt_n,
                                 "prompt_tokens": (last or {}).get("tokens_evaluated")}
    body = {"messages": [{"role": "user", "content": req["question"]}], "documents": req["docs"],
            "max_tokens": max_tokens, "stream": True, "temperature": 0}
    if name == "ours full":
        body["infoflow"] = {"method": "full"}
    ttft, e2e, text, last = stream_post(ours_port, "/v1/chat/completions", body)
    info = (last or {}).get("infoflow", {})
    return ttft, e2e, text, {"pipeline_ttft_ms": info.get("ttft_ms"),
                             "store_hits": info.get("store", {}).get("hits"),
                             "prompt_tokens": info.get("context_tokens", 0) +
                             info.get("suffix_tokens", 0)}


def quantile(xs, q):
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    pos = q * (len(s) - 1)
    lo = int(pos)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (pos - lo)


def summarize(name, rows, full_answers):
    ttft = [r["ttft"] for r in rows]
    e2e = [r["e2e"] for r in rows]
    agree = sum(r["text"].strip() == f.strip() for r, f in zip(rows, full_answers))
    correct = sum(r["answer"].lower() in r["text"].lower() for r in rows)
    return {"variant": name, "requests": len(rows),
            "ttft_p50_ms": 1000 * quantile(ttft, 0.5), "ttft_p95_ms": 1000 * quantile(ttft, 0.95),
            "ttft_min_ms": 1000 * min(ttft), "ttft_max_ms": 1000 * max(ttft),
            "e2e_p50_ms": 1000 * quantile(e2e, 0.5), "e2e_p95_ms": 1000 * quantile(e2e, 0.95),
            "e2e_mean_ms": 1000 * statistics.mean(e2e), "req_per_s": len(rows) / sum(e2e),
            "agree_with_full": agree, "correct": correct,
            "prompt_tokens_mean": statistics.mean(r["extra"].get("prompt_tokens") or 0
                                                  for r in rows)}


def table(summaries, peer_key):
    ref = next(s for s in summaries if s["variant"] == peer_key)
    lines = ["variant                TTFT p50 ms  p95 ms  (min..max)        e2e p50 ms  "
             "p95 ms   req/s  TTFT p50 / llama-server  agree w/ full  correct"]
    for s in summaries:
        lines.append(
            f"{s['variant']:22s} {s['ttft_p50_ms']:11.0f} {s['ttft_p95_ms']:7.0f}  "
            f"({s['ttft_min_ms']:.0f}..{s['ttft_max_ms']:.0f}){'':4s} {s['e2e_p50_ms']:10.0f} "
            f"{s['e2e_p95_ms']:7.0f} {s['req_per_s']:7.3f} {s['ttft_p50_ms'] / ref['ttft_p50_ms']:14.3f}x"
            f"           {s['agree_with_full']:3d}/{s['requests']:<3d}  {s['correct']:3d}/{s['requests']}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--docs", type=int, default=32)
    ap.add_argument("--cite", type=int, default=8)
    ap.add_argument("--doc-tokens", type=int, default=400)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--peer-reuse", type=int, default=0,
                    help="also run llama-server with --cache-reuse N (0: not)")
    ap.add_argument("--results-dir", default="")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    peer_dir = subprocess.run([os.path.join(ROOT, "bench", "build_llama_cpp.sh"), "--dir",
                               os.path.join(a.build, "llama_cpp_peer"), "--server"],
                              check=True, stdout=subprocess.PIPE, text=True).stdout.split()[-1]
    peer_bin = os.path.join(peer_dir, "llama-server")
    docs, facts = make_documents(a.docs, a.doc_tokens, a.seed)
    reqs = make_requests(a.requests, docs, facts, a.cite, a.seed)
    warm = make_requests(a.warmup, docs, facts, a.cite, a.seed + 1000)
    tmp = tempfile.mkdtemp(prefix="bench-serve-")
    procs = []
    try:
        ours, ours_port = start_ours(a, tmp)
        procs.append(ours)
        peers = {}
        p, peers["llama-server"] = start_peer(a, tmp, peer_bin, 0)
        procs.append(p)
        if a.peer_reuse:
            p, peers["llama-server reuse"] = start_peer(a, tmp, peer_bin, a.peer_reuse)
            procs.append(p)
        t0 = time.perf_counter()
        c = http.client.HTTPConnection("127.0.0.1", ours_port, timeout=3000)
        c.request("POST", "/v1/documents", body=json.dumps({"documents": docs}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        stored = json.loads(r.read())
        store_s = time.perf_counter() - t0
        doc_tokens = [d["tokens"] for d in stored["data"]]
        log(f"[bench] stored {len(docs)} documents ({statistics.mean(doc_tokens):.0f} tokens "
            f"each on average) in {store_s:.1f} s")
        variants = ["ours infoflow+store", "ours full", "llama-server"] + \
            (["llama-server reuse"] if a.peer_reuse else [])
        for w in warm:
            for v in variants:
                run_variant(v, w, ours_port, peers, a.max_tokens)
        rows = {v: [] for v in variants}
        for i, req in enumerate(reqs):
            order = variants[i % len(variants):] + variants[:i % len(variants)]
            for v in order:
                ttft, e2e, text, extra = run_variant(v, req, ours_port, peers, a.max_tokens)
                rows[v].append({"ttft": ttft, "e2e": e2e, "text": text, "extra": extra,
                                "answer": req["answer"]})
            log(f"[bench] {i + 1}/{len(reqs)}: " + ", ".join(
                f"{v} {1000 * rows[v][-1]['ttft']:.0f} ms" for v in variants))
    finally:
        for p in procs:
            stop(p)
    full = [r["text"] for r in rows["ours full"]]
    summaries = [summarize(v, rows[v], full) for v in variants]
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                   if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    head = (f"RAG serving, {a.requests} requests (after {a.warmup} warm-up each), one client, "
            f"streamed, greedy, {a.max_tokens} tokens: {a.cite} of {a.docs} documents "
            f"(~{statistics.mean(doc_tokens):.0f} tokens each) per request in random order + a "
            f"question; ours {a.ranks} rank(s) x {a.threads // a.ranks} thread(s), llama-server "
            f"{a.threads} threads; {os.path.basename(MODEL)}; {cpu}; seed {a.seed}")
    tab = table(summaries, "llama-server")
    print(head)
    print(tab)
    lines = []
    for s in summaries:
        s.update({"bench": "serve-rag", "threads": a.threads, "ranks": a.ranks, "docs": a.docs,
                  "cite": a.cite, "max_tokens": a.max_tokens, "seed": a.seed,
                  "store_build_s": store_s, "model": os.path.basename(MODEL), "cpu": cpu,
                  "host": platform.node()})
        lines.append(json.dumps(s, sort_keys=True))
        print(lines[-1])
    if a.results_dir:
        os.makedirs(a.results_dir, exist_ok=True)
        base = os.path.join(a.results_dir, "serve-rag-smollm2-cpu")
        with open(base + ".jsonl", "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(base + ".md", "w") as f:
            f.write("# RAG serving: job serve against llama-server (CPU)\n\n```\n"
                    + " ".join(["bench/bench_serve.py"] + sys.argv[1:]) + "\n```\n\n" + head +
                    "\n\n```\n" + tab + "\n```\n")
        log(f"[bench] wrote {base}.md and .jsonl")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
