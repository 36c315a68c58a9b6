#!/usr/bin/env python3
"""Job serve under load (CTest label `serve`): many clients at once against real server processes
on 1 and 2 ranks, every answer checked against the same request run alone on the same server
(whose answers tests/serve/serve_test.py checks against the `answer` job).
  serve_load_test.py --bin BIN --mpiexec MPIEXEC [--np N] [--duration S] [--out FILE] CASE

CASE  batch   8 concurrent clients of mixed lengths (0 to ~900 context tokens, 6 to 40 answer
              tokens, plain and streamed, infoflow / full / none, on 2 ranks also the exact
              exchange, two seeded samplers), through the official `openai` package: each answer's
              token ids, its first-token logits (a hash of the whole row) and its selection equal
              the request's run alone; /metrics shows the decode batched (rows per step > 1) and
              stepping between pieces of context work; another seed samples another answer; a
              running stream gets a decode step after every 64-token piece of another request's
              ~1000-token prefill (serve.prefill_chunk = 64)
      budget  serve.kv_budget_mb for about two requests at once: 6 concurrent requests answered as
              alone, the KV memory in use (/metrics, sampled meanwhile) never above the limit,
              some of them waited; a request that could never fit is refused (400 naming
              serve.kv_budget_mb); /health carries the counts
      cancel  a streamed and a plain client killed while the batch decodes: each leaves with no
              decode step run for it after its client left (the server's log), the running count
              drops within a second, the other requests finish as alone
      soak    16 clients in a bounded loop for --duration seconds (CI: 60; by hand: 600): zero lost
              requests (each gets its answer, equal to the run alone, or a clear error), resident
              memory flat after warm-up (<= 5 %), none slower than serve.request_timeout_s
              without a 504, some clients dropping mid-stream; a table, one JSON line (--out)
      drain   SIGTERM under load: every stream in hand ends with [DONE], queued and new requests
              get 503, the job exits 0
      kill    kill -9 of rank 1 under load (2 ranks, --enable-recovery so the server notices):
              every client gets an error or a closed stream, rank 0's watchdog ends the job
              naming rank 1
Every server is stopped at the end and each of its processes checked to be gone.
"""

import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_harness import ROOT, Fail, Server, check, sse_events  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "serve.toml")
EOS_BAN = {"0": -100, "1": -100, "2": -100}  # end-of-text / end-of-turn: answers run to length


def log(*a):
    print(*a, flush=True)


def common_sets(np, *more):
    # Deadlines far from the work (sanitizer builds run ~10x slower: rank 1 waits out rank
    # 0's whole `full` prefill); the soak sets its own request deadline, kill its watchdog.
    return [f"model.threads={2 if np == 1 else 1}", "store.path=", "parallel.timeout_s=600",
            "serve.max_tokens=512", "serve.request_timeout_s=900", *more]


def make_docs(n, words, seed):
    """n documents of about `words` words of filler prose, each stating one fact."""
    rng = random.Random(seed)
    with open(os.path.join(ROOT, "configs", "data", "filler.txt")) as f:
        sentences = [s.strip() + "." for s in re.split(r"\.\s+", f.read()) if len(s.split()) > 4]
    docs = []
    for i in range(n):
        body = []
        while sum(len(s.split()) for s in body) < words:
            body.append(rng.choice(sentences))
        body.insert(rng.randrange(len(body) + 1),
                    f"The archive of town {seed}-{i} was founded by Agnes Moray{i}.")
        docs.append(" ".join(body))
    return docs


def specs(np):
    """The mixed workload: (label, body) of chat requests."""
    out = [
        ("long ctx", dict(documents=make_docs(3, 230, 1), max_tokens=24,
                          question="Who founded the archive of town 1-2?")),
        ("short ctx", dict(documents=make_docs(2, 40, 2), max_tokens=40, stream=True,
                           question="Who founded the archive of town 2-0?", logit_bias=EOS_BAN)),
        ("no ctx", dict(documents=[], max_tokens=30, question="Write a poem about rain.",
                        logit_bias=EOS_BAN)),
        ("full", dict(documents=make_docs(2, 120, 3), max_tokens=12, stream=True,
                      question="Who founded the archive of town 3-1?",
                      infoflow={"method": "full"})),
        ("none", dict(documents=make_docs(4, 60, 4), max_tokens=6,
                      question="Who founded the archive of town 4-3?",
                      infoflow={"method": "none"})),
        ("seeded a", dict(documents=make_docs(1, 150, 5), max_tokens=20, stream=True,
                          question="Tell me about the archive.", temperature=0.9, seed=11,
                          top_p=0.95, logit_bias=EOS_BAN)),
        ("seeded b", dict(documents=[], max_tokens=20, question="Tell a story about a fox.",
                          temperature=1.1, seed=12, logit_bias=EOS_BAN)),
        ("mid ctx", dict(documents=make_docs(5, 90, 6), max_tokens=16, stream=True,
                         question="Who founded the archive of town 6-4?", logit_bias=EOS_BAN)),
    ]
    if np > 1:  # the exact exchange decodes across the ranks, between the batch's steps
        out[4] = ("exact", dict(documents=make_docs(4, 60, 4), max_tokens=10,
                                question="Who founded the archive of town 4-3?",
                                infoflow={"exchange": "exact"}))
        # a whole-context exchange decodes on rank 0, in the batch like kv
        out[7] = ("compact4", dict(out[7][1], infoflow={"exchange": "compact-int4"}))
    return out


def openai_client(srv):
    import openai
    return openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=600)


def ask_openai(client, spec):
    """Sends one chat request through the openai package; returns what the oracle compares."""
    extra = {"documents": spec["documents"]}
    if "infoflow" in spec:
        extra["infoflow"] = spec["infoflow"]
    kw = dict(model="m", max_tokens=spec["max_tokens"], extra_body=extra,
              messages=[{"role": "user", "content": spec["question"]}])
    for k in ("temperature", "seed", "top_p", "logit_bias"):
        if k in spec:
            kw[k] = spec[k]
    if not spec.get("stream"):
        r = client.chat.completions.create(**kw)
        return answer_key(r.model_extra["infoflow"], r.choices[0].message.content)
    text, info = "", None
    for ch in client.chat.completions.create(stream=True, **kw):
        if ch.choices:
            text += ch.choices[0].delta.content or ""
        if ch.model_extra and "infoflow" in ch.model_extra:
            info = ch.model_extra["infoflow"]
    check(info is not None, "a stream without the infoflow object")
    return answer_key(info, text)


def answer_key(info, text):
    return {"text": text, "tokens": info["answer"]["token_ids"],
            "logits": info["first_token_logits_fnv1a64"],
            "selected": info["selected_positions"]}


def run_together(fn, args_list):
    """Runs fn(*args) for each args on its own thread, all released at once; returns the results
    in order (an exception is re-raised)."""
    out = [None] * len(args_list)
    start = threading.Barrier(len(args_list))

    def one(i):
        try:
            start.wait()
            out[i] = ("ok", fn(*args_list[i]))
        except BaseException as e:  # noqa: BLE001
            out[i] = ("error", e)

    ths = [threading.Thread(target=one, args=(i,)) for i in range(len(args_list))]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    for kind, v in out:
        if kind == "error":
            raise v
    return [v for _, v in out]


def metric_delta(before, after, key):
    return after.get(key, 0) - before.get(key, 0)


# ---- batch ----------------------------------------------------------------------------------

def case_batch(a):
    srv = Server(a.bin, a.mpiexec, a.np, CONFIG, common_sets(
        a.np, "serve.max_batch=8", "serve.prefill_chunk=64"))
    try:
        client = openai_client(srv)
        work = specs(a.np)
        alone = [ask_openai(client, s) for _, s in work]
        m0 = srv.metrics()
        rounds = 2
        together = []
        for _ in range(rounds):
            together.append(run_together(lambda s: ask_openai(openai_client(srv), s),
                                         [(s,) for _, s in work]))
        m1 = srv.metrics()
        for r in range(rounds):
            for (label, _), want, got in zip(work, alone, together[r]):
                check(got == want, f"{label} (round {r}): batched {got['text']!r} "
                      f"{got['tokens'][:8]}.. logits {got['logits']}, alone {want['text']!r} "
                      f"{want['tokens'][:8]}.. logits {want['logits']}")
        steps = metric_delta(m0, m1, "infoflow_decode_steps_total")
        rows = metric_delta(m0, m1, "infoflow_decode_rows_total")
        in_prefill = metric_delta(m0, m1, "infoflow_decode_steps_in_prefill_total")
        batched = metric_delta(m0, m1, "infoflow_decode_steps_batched_total")
        # Steps of one row come between the pieces of a request's context work (every
        # serve.prefill_slice_ms while one stream runs), so the mean can sit near 1 on a slow
        # machine; the steps over several requests show the batching.
        check(steps > 0 and batched > 0 and rows > steps,
              f"the decode did not batch: {rows:.0f} rows in {steps:.0f} steps, "
              f"{batched:.0f} of them over more than one request")
        check(in_prefill > 0, "no decode step ran between pieces of context work")
        # Negative control: the seed matters (reproducibility above is not a fixed answer).
        other = dict(work[6][1], seed=13)
        check(ask_openai(client, other)["tokens"] != alone[6]["tokens"],
              "seed 13 sampled what seed 12 sampled")
        check_pieces(srv, client)
        log(f"ok: {len(work)} clients x {rounds} rounds on {a.np} rank(s): every answer, "
            f"first-token logits hash and selection equal to the request alone; "
            f"{rows:.0f} rows in {steps:.0f} decode steps ({rows / steps:.2f} per step, "
            f"{batched:.0f} over more than one request), "
            f"{in_prefill:.0f} steps between pieces of context work")
        for (label, _), want in zip(work, alone):
            log(f"    {label:10s} {len(want['tokens']):3d} tokens  {want['text'][:60]!r}")
        srv.stop()
    except BaseException:
        srv.kill()
        raise


def check_pieces(srv, client):
    """A long context never stalls a running stream for more than one piece: while a `full`
    request's ~1000 tokens of context work run (serve.prefill_chunk = 64), a running stream gets
    a decode step after every piece -- at least (tokens / 64) - 1 steps."""
    sock = open_request(srv, {"messages": [{"role": "user", "content": "Tell a long story."}],
                              "max_tokens": 400, "stream": True, "logit_bias": EOS_BAN})
    got = b""
    while got.count(b"data: ") < 2:
        got += sock.recv(65536)
    m0 = srv.metrics()
    r = client.chat.completions.create(
        model="m", max_tokens=2, messages=[{"role": "user", "content": "Who founded it?"}],
        extra_body={"documents": make_docs(4, 190, 9), "infoflow": {"method": "full"}})
    m1 = srv.metrics()
    sock.close()
    tokens = r.usage.prompt_tokens
    steps = metric_delta(m0, m1, "infoflow_decode_steps_in_prefill_total")
    check(steps >= tokens // 64 - 1,
          f"{steps:.0f} decode steps during {tokens} tokens of context work in pieces of 64")
    log(f"ok: {steps:.0f} decode steps of a running stream during the {tokens}-token prefill "
        f"of another request (pieces of 64 tokens)")


# ---- budget ---------------------------------------------------------------------------------

def case_budget(a):
    # Each request: ~330 context tokens; its peak need (cache + chunks) is about 15 MiB with the
    # f16 cache of configs/serve.toml, its cache alone about 8 MiB: 32 MiB holds two at most.
    srv = Server(a.bin, a.mpiexec, a.np, CONFIG, common_sets(
        a.np, "serve.max_batch=8", "serve.kv_budget_mb=32"))
    try:
        client = openai_client(srv)
        work = [dict(documents=make_docs(2, 120, 20 + i), max_tokens=24, stream=i % 2 == 1,
                     question=f"Who founded the archive of town {20 + i}-1?",
                     logit_bias=EOS_BAN) for i in range(6)]
        alone = [ask_openai(client, s) for s in work]
        samples, stop = [], threading.Event()

        def sampler():
            while not stop.is_set():
                m = srv.metrics()
                samples.append((m["infoflow_kv_bytes_in_use"], m["infoflow_kv_bytes_limit"],
                                m["infoflow_requests_running"], m["infoflow_requests_waiting"]))
                time.sleep(0.02)

        th = threading.Thread(target=sampler)
        th.start()
        try:
            got = run_together(lambda s: ask_openai(openai_client(srv), s), [(s,) for s in work])
        finally:
            stop.set()
            th.join()
        check(got == alone, "an answer under the KV budget differs from the request alone")
        limit = samples[0][1]
        check(limit == 32 << 20, f"infoflow_kv_bytes_limit {limit}")
        peak = max(s[0] for s in samples)
        check(peak <= limit, f"KV in use {peak} above the limit {limit}")
        check(max(s[2] for s in samples) <= 2, "more requests ran than the budget holds")
        check(max(s[3] for s in samples) >= 1, "no request waited for memory")
        st, raw = srv.get("/health")
        h = json.loads(raw)
        check(st == 200 and h["kv_bytes_limit"] == limit and "running" in h and "waiting" in h,
              f"/health {raw!r}")
        big = dict(documents=make_docs(6, 400, 30), max_tokens=8, question="?")
        status, body, _ = srv.post_json("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "?"}], "documents": big["documents"],
            "max_tokens": 8})
        msg = body["error"]["message"] if body else ""
        check(status == 400 and body["error"]["code"] == "kv_budget_exceeded" and
              "serve.kv_budget_mb = 32" in msg, f"a request over the budget: {status} {msg!r}")
        log(f"ok: 6 requests under serve.kv_budget_mb = 32: all as alone, KV in use at most "
            f"{peak / 2**20:.1f} MiB, at most {max(s[2] for s in samples):.0f} running, up to "
            f"{max(s[3] for s in samples):.0f} waiting; too big: {status} {msg!r}")
        srv.stop()
    except BaseException:
        srv.kill()
        raise


# ---- cancel ---------------------------------------------------------------------------------

def open_request(srv, body):
    """Sends a request on a raw connection and returns the socket (the response unread)."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=120)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
              b"\r\nContent-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


def running(srv):
    return srv.metrics()["infoflow_requests_running"]


def wait_for(cond, timeout, what):
    t0 = time.monotonic()
    while not cond():
        check(time.monotonic() - t0 < timeout, f"timed out waiting for {what}")
        time.sleep(0.01)
    return time.monotonic() - t0


def case_cancel(a):
    srv = Server(a.bin, a.mpiexec, a.np, CONFIG, common_sets(a.np, "serve.max_batch=8"))
    try:
        long = {"messages": [{"role": "user", "content": "Write a long story about a dragon."}],
                "max_tokens": 400, "logit_bias": EOS_BAN}
        keeper = dict(long, max_tokens=60)
        client = openai_client(srv)
        want = ask_openai(client, dict(documents=[], question=keeper["messages"][0]["content"],
                                       max_tokens=60, logit_bias=EOS_BAN))
        kept = {}
        th = threading.Thread(target=lambda: kept.update(r=ask_openai(openai_client(srv), dict(
            documents=[], question=keeper["messages"][0]["content"], max_tokens=60,
            logit_bias=EOS_BAN))))
        th.start()
        streamed = open_request(srv, dict(long, stream=True))
        plain = open_request(srv, long)
        wait_for(lambda: running(srv) == 3, 120, "three running requests")
        got = b""
        while got.count(b"data: ") < 3:
            got += streamed.recv(65536)
        freed = []
        for label, sock in (("streamed", streamed), ("plain", plain)):
            before = running(srv)
            sock.shutdown(socket.SHUT_RDWR)
            sock.close()
            freed.append((label, wait_for(lambda: running(srv) <= before - 1, 10,
                                          f"the {label} client's slot")))
        th.join(300)
        check(kept.get("r") == want, "the request that stayed differs from the request alone")
        out = srv.output()
        lines = [ln for ln in out.splitlines() if "left: client_disconnect" in ln]
        check(len(lines) == 2, f"{len(lines)} cancelled requests in the log:\n{out[-3000:]}")
        for ln in lines:
            check("0 decode steps after its client left" in ln, f"a slot kept: {ln}")
        for label, s in freed:
            check(s < 1.0, f"the {label} client's slot was freed after {s:.2f} s")
        m = srv.metrics()
        check(m['infoflow_cancelled_total{reason="client_disconnect"}'] == 2, "cancel count")
        log(f"ok: killed clients left the batch with no decode step after they left; slots free "
            f"after {', '.join(f'{lb} {s * 1000:.0f} ms' for lb, s in freed)}; the other "
            f"request answered as alone")
        srv.stop()
    except BaseException:
        srv.kill()
        raise


# ---- soak -----------------------------------------------------------------------------------

def raw_chat(srv, body, abandon_after=None, timeout=600):
    """One request on its own connection. Returns (outcome, seconds, detail): outcome "ok"
    (detail: the answer key), "timeout" (a 504 or a stream's timeout error), "busy" (429),
    "abandoned" (this client hung up after `abandon_after` stream events), or "lost" (anything
    else: no response, a broken stream, another status)."""
    t0 = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    try:
        c.request("POST", "/v1/chat/completions", body=json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raw = r.read()
            code = json.loads(raw)["error"]["code"] if raw else ""
            outcome = {504: "timeout", 429: "busy"}.get(r.status, "lost")
            return outcome, time.monotonic() - t0, f"{r.status} {code}"
        if not body.get("stream"):
            j = json.loads(r.read())
            return "ok", time.monotonic() - t0, answer_key(
                j["infoflow"], j["choices"][0]["message"]["content"])
        text, info, n = "", None, 0
        for ev in sse_events(r):
            n += 1
            if abandon_after is not None and n >= abandon_after:
                c.sock.shutdown(socket.SHUT_RDWR)
                return "abandoned", time.monotonic() - t0, n
            if ev == "[DONE]":
                return "ok", time.monotonic() - t0, answer_key(info, text)
            j = json.loads(ev)
            if "error" in j:
                return ("timeout" if j["error"]["code"] == "timeout" else "lost",
                        time.monotonic() - t0, j["error"]["message"])
            if j.get("choices"):
                text += j["choices"][0]["delta"].get("content") or ""
            info = j.get("infoflow", info)
        return "lost", time.monotonic() - t0, "the stream ended without [DONE]"
    except (OSError, ValueError, KeyError, http.client.HTTPException) as e:
        return "lost", time.monotonic() - t0, repr(e)
    finally:
        c.close()


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def soak_pool():
    """Chat bodies of the soak: greedy, mixed lengths (one without documents); the last one, sent
    now and then, runs past the deadline under load."""
    pool = []
    for i in range(6):
        pool.append({"messages": [{"role": "user", "content":
                                   f"Who founded the archive of town {40 + i}-0?"}],
                     "documents": make_docs(1 + i % 3, 30 + 25 * i, 40 + i) if i else [],
                     "max_tokens": 6 + 4 * i, "logit_bias": EOS_BAN})
    # 4,000 tokens: past the deadline on a fast machine too (500 were not, with decode steps
    # every 5 ms of context work).
    pool.append({"messages": [{"role": "user", "content": "Write a very long story."}],
                 "max_tokens": 4000, "logit_bias": EOS_BAN})
    return pool


def case_soak(a):
    timeout_s = 15.0
    srv = Server(a.bin, a.mpiexec, a.np, CONFIG, common_sets(
        a.np, "serve.max_batch=16", "serve.queue_size=8", f"serve.request_timeout_s={timeout_s}",
        "serve.max_tokens=4096"))
    try:
        pool = soak_pool()
        alone = []
        for body in pool[:-1]:
            outcome, _, key = raw_chat(srv, body)
            check(outcome == "ok", f"alone: {outcome} {key}")
            alone.append(key)
        pid = srv.pid_of_rank(0)
        rss, stop = [], threading.Event()
        results = []
        lock = threading.Lock()
        t_start = time.monotonic()

        def sample():
            while not stop.is_set():
                rss.append((time.monotonic() - t_start, rss_mib(pid)))
                time.sleep(0.5)

        def client(ci):
            rng = random.Random(ci)
            while time.monotonic() - t_start < a.duration:
                k = len(pool) - 1 if rng.random() < 0.05 else rng.randrange(len(pool) - 1)
                body = dict(pool[k], stream=rng.random() < 0.5)
                drop = 3 if body["stream"] and rng.random() < 0.1 else None
                outcome, took, detail = raw_chat(srv, body, abandon_after=drop)
                if outcome == "ok" and k < len(alone) and detail != alone[k]:
                    outcome, detail = "wrong", f"request {k}: {detail['text']!r}"
                with lock:
                    results.append((outcome, took, k, detail))
                if outcome == "busy":
                    time.sleep(0.2)

        sampler = threading.Thread(target=sample)
        sampler.start()
        clients = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for t in clients:
            t.start()
        for t in clients:
            t.join()
        stop.set()
        sampler.join()
        report_soak(a, srv, timeout_s, results, rss)
        srv.stop()
    except BaseException:
        srv.kill()
        raise


def report_soak(a, srv, timeout_s, results, rss):
    by = {}
    for outcome, took, _, _ in results:
        by.setdefault(outcome, []).append(took)
    lost = [r for r in results if r[0] in ("lost", "wrong")]
    slow = [r for r in results if r[0] == "ok" and r[1] > timeout_s + 1.0]
    # After a warm-up of 30 %: the 90th percentile of the RSS samples of the second half of the
    # rest against that of the first half (peaks follow the load of the moment; a leak grows).
    warm = sorted(m for t, m in rss if 0.3 * a.duration <= t < 0.65 * a.duration)
    later = sorted(m for t, m in rss if t >= 0.65 * a.duration)
    p90 = lambda v: v[int(0.9 * (len(v) - 1))]  # noqa: E731
    growth = p90(later) / p90(warm) - 1.0 if warm and later else float("nan")
    m = srv.metrics()
    steps, rows = m["infoflow_decode_steps_total"], m["infoflow_decode_rows_total"]
    log(f"{'outcome':10s} {'n':>5s} {'p50 s':>7s} {'p95 s':>7s} {'max s':>7s}")
    for k in sorted(by):
        v = sorted(by[k])
        log(f"{k:10s} {len(v):5d} {statistics.median(v):7.2f} {v[int(0.95 * (len(v) - 1))]:7.2f} "
            f"{v[-1]:7.2f}")
    line = {"bench": "serve_soak", "ranks": a.np, "clients": 16, "duration_s": a.duration,
            "outcomes": {k: len(v) for k, v in by.items()}, "lost": len(lost),
            "slow_without_504": len(slow), "rss_warm_p90_mib": p90(warm) if warm else None,
            "rss_later_p90_mib": p90(later) if later else None, "rss_growth": growth,
            "rows_per_step": rows / steps if steps else 0.0,
            "buffer_pool_mib": m["infoflow_buffer_pool_bytes"] / 2**20,
            "buffer_pool_reused": m["infoflow_buffer_pool_reused_total"]}
    series = [f"{m:.0f}" for t, m in rss if int(t * 2) % 20 == 0]  # one sample every 10 s
    log(f"rank 0 RSS (MiB, every 10 s): {' '.join(series)}")
    log(json.dumps(line))
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(line) + "\n")
    check(not lost, f"{len(lost)} lost or wrong requests, e.g. {lost[:3]}")
    check(not slow, f"{len(slow)} answers slower than the deadline without a 504: {slow[:3]}")
    check(len(by.get("ok", [])) >= 16, "too few answers")
    check(len(by.get("timeout", [])) >= 1, "no request met the deadline (504) under load")
    # The pool of freed buffers (serve.buffer_pool_mb) served the requests after the first and
    # stayed within its limit.
    check(m["infoflow_buffer_pool_reused_total"] > 0, "the buffer pool was never reused")
    check(0 < m["infoflow_buffer_pool_bytes_limit"] and
          m["infoflow_buffer_pool_bytes"] <= m["infoflow_buffer_pool_bytes_limit"],
          f"buffer pool {m['infoflow_buffer_pool_bytes']} bytes, limit "
          f"{m['infoflow_buffer_pool_bytes_limit']}")
    check(growth <= 0.05, f"resident memory grew {growth * 100:.1f} % after warm-up "
          f"({p90(warm):.0f} -> {p90(later):.0f} MiB, 90th percentiles)")
    log(f"ok: soak of {a.duration:.0f} s, 16 clients on {a.np} rank(s): {len(results)} requests, "
        f"none lost, every answer as alone, {len(by.get('timeout', []))} past the deadline got "
        f"504, RSS {p90(warm):.0f} -> {p90(later):.0f} MiB ({growth * 100:+.1f} %), "
        f"{rows / steps:.1f} rows per decode step")


# ---- drain and kill under load --------------------------------------------------------------

def start_streams(srv, n, max_tokens):
    """n streamed requests on their own threads; returns (threads, results)."""
    results = [None] * n

    def one(i):
        body = {"messages": [{"role": "user", "content": f"Write story number {i}."}],
                "max_tokens": max_tokens, "stream": True, "logit_bias": EOS_BAN,
                "documents": make_docs(1, 50, 60 + i)}
        results[i] = raw_chat(srv, body, timeout=120)

    ths = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ths:
        t.start()
    return ths, results


def case_drain(a):
    srv = Server(a.bin, a.mpiexec, a.np, CONFIG, common_sets(
        a.np, "serve.max_batch=4", "serve.queue_size=8"))
    try:
        # Streams long enough that the 4 running ones are still running when the metrics are
        # polled, on a fast machine too.
        ths, results = start_streams(srv, 7, 200)
        wait_for(lambda: running(srv) == 4 and srv.metrics()["infoflow_requests_waiting"] == 3,
                 120, "4 running and 3 waiting")
        srv.signal_rank0(signal.SIGTERM)
        time.sleep(0.3)
        try:
            st, _, _ = srv.post_json("/v1/chat/completions", {
                "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}, timeout=10)
        except OSError:
            st = 503  # no longer listening
        check(st == 503, f"a request after SIGTERM got {st}")
        for t in ths:
            t.join(120)
        outcomes = [r[0] for r in results]
        check(outcomes.count("ok") == 4, f"running streams after SIGTERM: {results}")
        check(all(r[0] == "lost" and "503" in str(r[2]) for r in results if r[0] != "ok"),
              f"the queued requests: {results}")
        rc, took = srv.wait(60)
        check(rc == 0, f"the server exited {rc} after SIGTERM:\n{srv.output()[-2000:]}")
        srv.check_gone()
        log(f"ok: SIGTERM with 4 streams running and 3 queued on {a.np} rank(s): the 4 ended "
            f"with [DONE], the 3 queued and a new request got 503, exit 0 after {took:.1f} s")
    except BaseException:
        srv.kill()
        raise


def case_kill(a):
    check(a.np == 2, "kill needs 2 ranks")
    timeout_s = 5
    srv = Server(a.bin, a.mpiexec, 2, CONFIG, common_sets(
        2, f"parallel.timeout_s={timeout_s}", "serve.heartbeat_s=0.5", "serve.max_batch=4",
        "serve.max_tokens=2048"), mpi_flags=["--enable-recovery"])
    try:
        # Streams long enough to outlast the watchdog's timeout on a fast machine.
        ths, results = start_streams(srv, 6, 2000)
        wait_for(lambda: srv.metrics()["infoflow_decode_steps_total"] > 5, 120, "the decode")
        os.kill(srv.pid_of_rank(1), signal.SIGKILL)
        t0 = time.monotonic()
        rc, _ = srv.wait(timeout_s + 30)
        took = time.monotonic() - t0
        for t in ths:
            t.join(60)
        check(all(r is not None and r[0] != "ok" for r in results),
              f"a client got a whole answer from a dead job: {results}")
        out = srv.output()
        check("[rank 0/2] error: rank 1 did not reach" in out,
              f"no watchdog message naming rank 1:\n{out[-3000:]}")
        check(took <= timeout_s + 15, f"the job took {took:.1f} s to end")
        srv.check_gone()
        log(f"ok: rank 1 killed with 6 streams in flight: every client got an error or a closed "
            f"stream, rank 0's watchdog named rank 1, the job ended after {took:.1f} s (rc {rc})")
    except BaseException:
        srv.kill()
        raise


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--np", type=int, default=1)
    ap.add_argument("--duration", type=float, default=60.0, help="soak: seconds of load")
    ap.add_argument("--out", default="", help="soak: append the JSON line to this file")
    ap.add_argument("case", choices=["batch", "budget", "cancel", "soak", "drain", "kill"])
    a = ap.parse_args()
    if not os.path.exists(os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")):
        print("FAIL: the model is missing (run launch/setup.sh)")
        return 1
    t0 = time.monotonic()
    try:
        globals()["case_" + a.case](a)
    except Fail as e:
        print(f"FAIL: {e}")
        return 1
    log(f"serve {a.case} on {a.np} rank(s): passed in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
