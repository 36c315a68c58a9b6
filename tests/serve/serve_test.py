#!/usr/bin/env python3
"""End-to-end tests of job `serve` with real clients against real server processes (CTest label
`serve`):  serve_test.py --bin BIN --mpiexec MPIEXEC [--np N] CASE

CASE  openai      the official `openai` package, plain and streaming, chat and completions: the
                  answer, its token count, the selected positions and the first-token logits
                  equal the `answer` job's on the same ranks for the same documents, question
                  and method (infoflow, full, and on 2 ranks the exact exchange); curl for
                  /health (503 while loading, then 200), /metrics and /v1/models
      store       the KV store: a request over new documents prefills and adds them; the same
                  request again loads every one (the infoflow object and /metrics say so) and
                  gives bit-identical first-token logits; POST /v1/documents ahead of a
                  question, GET /v1/documents/{key}
      concurrency 8 clients x 25 requests at once through a queue of 4: each answer equals the
                  same request run alone, none lost or duplicated, every 429 carries
                  Retry-After and the request succeeds when retried
      bad         a table of bad requests, each with its status and a message naming the field,
                  and the server still answering afterwards; the API key (401) and the
                  non-loopback rule
      faults      kill -9 of rank 1 while idle and while a request streams, with Open MPI
                  ending the job and with it disabled (--enable-recovery: the server's heartbeat
                  and watchdog then notice): the client gets an error or a closed stream,
                  /health fails, mpirun exits non-zero within parallel.timeout_s + 10 s
      drain       a client that disconnects mid-stream frees the server for the next request
                  (its generation cancelled on every rank); SIGTERM finishes the request in
                  flight, refuses new ones, and the job exits 0
Every server is stopped at the end and each of its processes checked to be gone.
"""

import argparse
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_harness import (ROOT, Fail, Server, check, run_answer, sse_events)  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "serve.toml")
MARROWBY = [open(os.path.join(ROOT, "configs", "data", "marrowby", f"0{i}.txt")).read().strip()
            for i in range(1, 5)]
QUESTION = "What is the name of the architect who designed the Corn Exchange?"


def common_sets(np):
    # Each rank gets the cores to itself: 2 threads on one rank, 1 each on two.
    return [f"model.threads={2 if np == 1 else 1}", "store.path=", "serve.max_tokens=64",
            "parallel.timeout_s=60"]


def log(*a):
    print(*a, flush=True)


def openai_client(server, **kw):
    import openai
    return openai.OpenAI(base_url=server.base_url, api_key=kw.pop("api_key", "unused"),
                         max_retries=0, timeout=300, **kw)


def compare_with_answer(label, info, content, n_tokens, oracle, check_text=True):
    want = oracle["answer"]
    if check_text:
        check(content == want["text"],
              f"{label}: answer {content!r} differs from the answer job's {want['text']!r}")
    check(n_tokens == len(want["token_ids"]),
          f"{label}: {n_tokens} tokens, the answer job generated {len(want['token_ids'])}")
    check(info["answer"]["token_ids"] == want["token_ids"], f"{label}: token ids differ")
    check(info["selected_positions"] == oracle["selected_positions"],
          f"{label}: selected positions differ from the answer job's")
    check(info["first_token_top"] == oracle["first_token_top"],
          f"{label}: first-token logits differ from the answer job's")
    check(info["method"] == oracle["method"], f"{label}: method {info['method']}")


# ---- openai -------------------------------------------------------------------------------

def case_openai(a):
    sets = common_sets(a.np)
    srv = Server(a.bin, a.mpiexec, a.np, CONFIG, sets)
    try:
        check(srv.loading_status == 503, f"/health said {srv.loading_status} while loading")
        client = openai_client(srv)
        variants = [("infoflow", {}, []), ("full", {"method": "full"}, ["method.name=full"])]
        if a.np > 1:
            variants.append(("exact", {"exchange": "exact"}, ["parallel.exchange=exact"]))
        total_tokens = 0
        n_chat = 0
        for label, ext, oracle_sets in variants:
            max_tokens = 24
            oracle = run_answer(a.bin, a.mpiexec, a.np, CONFIG, MARROWBY, QUESTION,
                                sets + oracle_sets + [f"decode.max_new_tokens={max_tokens}"])
            body = {"documents": MARROWBY, "infoflow": ext}
            msgs = [{"role": "user", "content": QUESTION}]
            r = client.chat.completions.create(model="smollm2", messages=msgs,
                                               max_tokens=max_tokens, extra_body=body)
            info = r.model_extra["infoflow"]
            compare_with_answer(f"{label} plain", info, r.choices[0].message.content,
                                r.usage.completion_tokens, oracle)
            check(r.choices[0].finish_reason == ("stop" if oracle["answer"]["stopped"]
                                                 else "length"), "finish_reason")
            check(r.usage.prompt_tokens == oracle["context_tokens"] + oracle["suffix_tokens"],
                  "usage.prompt_tokens")
            # Streaming: the same answer in deltas, the infoflow object on the last chunk.
            stream = client.chat.completions.create(
                model="smollm2", messages=msgs, max_tokens=max_tokens, stream=True,
                stream_options={"include_usage": True}, extra_body=body)
            text, finish, usage, sinfo, roles = "", None, None, None, 0
            for ch in stream:
                if ch.choices:
                    text += ch.choices[0].delta.content or ""
                    roles += ch.choices[0].delta.role == "assistant"
                    finish = ch.choices[0].finish_reason or finish
                if ch.usage:
                    usage = ch.usage
                if ch.model_extra and "infoflow" in ch.model_extra:
                    sinfo = ch.model_extra["infoflow"]
            check(roles == 1, f"{label} stream: {roles} chunks carry the role")
            check(usage is not None and sinfo is not None, "stream without usage / infoflow")
            compare_with_answer(f"{label} stream", sinfo, text, usage.completion_tokens, oracle)
            check(finish == r.choices[0].finish_reason, "stream finish_reason")
            total_tokens += 2 * usage.completion_tokens
            n_chat += 2
            log(f"ok: {label} on {a.np} rank(s): {text!r}, {usage.completion_tokens} tokens, "
                f"{len(sinfo['selected_positions'])} recomputed = the answer job's")
        # Completions (no chat template): plain and streamed agree; stop strings cut the text.
        c1 = client.completions.create(model="smollm2", prompt="The capital of France is",
                                       max_tokens=8)
        c2 = "".join(ch.choices[0].text for ch in client.completions.create(
            model="smollm2", prompt="The capital of France is", max_tokens=8, stream=True)
            if ch.choices)
        check(c1.choices[0].text == c2, f"completions: {c1.choices[0].text!r} vs {c2!r}")
        check("Paris" in c1.choices[0].text, f"completions answer: {c1.choices[0].text!r}")
        c3 = client.completions.create(model="smollm2", prompt="The capital of France is",
                                       max_tokens=8, stop=["aris"])
        check(c3.choices[0].text == c1.choices[0].text.split("aris")[0] and
              c3.choices[0].finish_reason == "stop", f"stop string: {c3.choices[0].text!r}")
        # A conversation with a system turn and earlier turns.
        conv = client.chat.completions.create(model="smollm2", max_tokens=8, messages=[
            {"role": "system", "content": "You answer in one word."},
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And of Italy?"}])
        check(conv.choices[0].message.content, "the conversation got no answer")
        log(f"ok: completions {c1.choices[0].text!r}, stop -> {c3.choices[0].text!r}, "
            f"conversation -> {conv.choices[0].message.content!r}")
        # (the streamed completion generated what the plain one did)
        total_tokens += (2 * c1.usage.completion_tokens + c3.usage.completion_tokens +
                         conv.usage.completion_tokens)
        # curl: health, metrics, models.
        health = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", f"http://127.0.0.1:{srv.port}/health"],
                                capture_output=True, text=True, timeout=30).stdout.splitlines()
        check(health[-1] == "200" and json.loads(health[0])["status"] == "ok", f"health {health}")
        metrics = subprocess.run(["curl", "-s", f"http://127.0.0.1:{srv.port}/metrics"],
                                 capture_output=True, text=True, timeout=30).stdout
        m = {}
        for line in metrics.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                m[k] = float(v)
        chat200 = m.get('infoflow_requests_total{route="/v1/chat/completions",status="200"}')
        check(chat200 == n_chat + 1, f"metrics: {chat200} chat requests counted, sent {n_chat + 1}")
        check(m.get("infoflow_generated_tokens_total") == total_tokens,
              f"metrics: {m.get('infoflow_generated_tokens_total')} tokens, sent {total_tokens}")
        check(m.get("infoflow_ttft_seconds_count") == n_chat + 4, "metrics: TTFT count")
        check(m.get("infoflow_up") == 1 and m.get("infoflow_ranks") == a.np, "metrics: up/ranks")
        check("infoflow_request_duration_seconds_bucket{le=\"+Inf\"}" in m, "metrics: histogram")
        if a.np > 1:
            check(m.get('infoflow_bytes_moved_total{phase="recompute",direction="sent"}', 0) > 0,
                  "metrics: no bytes moved in recompute on 2 ranks")
        # Chunk 0 (the chat prefix) came from the prefix cache after the first request -- the
        # infoflow stream, and on 2 ranks the exact exchange's two -- and those answers equal
        # the answer job's above (a fresh process, no cache).
        hits = m.get("infoflow_prefix_cache_hits_total", 0)
        misses = m.get("infoflow_prefix_cache_misses_total", 0)
        check(hits >= (3 if a.np > 1 else 1) and misses >= 1,
              f"metrics: prefix cache {hits} hits, {misses} misses")
        models = json.loads(subprocess.run(["curl", "-s", f"{srv.base_url}/models"],
                                           capture_output=True, text=True, timeout=30).stdout)
        check(models["data"][0]["infoflow"]["ranks"] == a.np, "models: ranks")
        log(f"ok: curl /health 200, /metrics counts {int(chat200)} chat requests and "
            f"{total_tokens} tokens, /v1/models")
        srv.stop()
    except BaseException:
        srv.kill()
        raise


# ---- store ----------------------------------------------------------------------------------

def case_store(a, tmp):
    store = os.path.join(tmp, "kv", "serve.h5")
    sets = common_sets(a.np) + [f"store.path={store}", "store.mode=read-write"]
    srv = Server(a.bin, a.mpiexec, a.np, CONFIG, sets)
    try:
        client = openai_client(srv)
        msgs = [{"role": "user", "content": QUESTION}]

        def ask(docs):
            r = client.chat.completions.create(model="m", messages=msgs, max_tokens=12,
                                               extra_body={"documents": docs})
            return r, r.model_extra["infoflow"]

        r1, i1 = ask(MARROWBY)
        check(i1["store"]["hits"] == 0 and i1["store"]["misses"] == 4 and
              i1["store"]["added"] == 4, f"first request: store {i1['store']}")
        r2, i2 = ask(MARROWBY)
        check(i2["store"]["hits"] == 4 and i2["store"]["misses"] == 0,
              f"second request: store {i2['store']}")
        check(all(d["from_store"] for d in i2["store"]["documents"]), "documents not loaded")
        check(not any(d["from_store"] for d in i1["store"]["documents"]), "loaded on the first")
        check(i2["first_token_logits_fnv1a64"] == i1["first_token_logits_fnv1a64"],
              "the loaded documents give other first-token logits than the prefilled ones")
        check(i2["first_token_top"] == i1["first_token_top"], "first-token top logits differ")
        check(r2.choices[0].message.content == r1.choices[0].message.content, "answers differ")
        phases2 = [p["name"] for p in i2["phases"]]
        check("store_load" in phases2, f"phases {phases2}")
        m = srv.metrics()
        check(m["infoflow_store_hits_total"] == 4 and m["infoflow_store_misses_total"] == 4,
              f"metrics: hits {m['infoflow_store_hits_total']}, misses "
              f"{m['infoflow_store_misses_total']}")
        log(f"ok: second request loaded 4/4 documents, first-token logits bit-identical "
            f"(fnv1a64 {i2['first_token_logits_fnv1a64']}), answer {r2.choices[0].message.content!r}")
        # Documents stored ahead of the question.
        docs = ["The lighthouse on Skerry Point was built by Agnes Moray in 1851.",
                "Skerry Point has a small harbour used by lobster boats.",
                "The Skerry Point ferry runs twice a day in summer."]
        status, body, _ = srv.post_json("/v1/documents", {"documents": docs})
        check(status == 200 and len(body["data"]) == 3 and body["added"] == 3,
              f"POST /v1/documents: {status} {body}")
        keys = [d["key"] for d in body["data"]]
        for k in keys:
            st, raw = srv.get(f"/v1/documents/{k}")
            check(st == 200 and json.loads(raw)["stored"], f"GET /v1/documents/{k}: {st}")
        st, raw = srv.get("/v1/documents/0123456789abcdef")
        check(st == 404 and json.loads(raw)["error"]["code"] == "document_not_found",
              f"GET of an absent key: {st} {raw!r}")
        status, body, _ = srv.post_json("/v1/documents", {"documents": docs[:1]})
        check(status == 200 and body["added"] == 0 and body["already_present"] == 1,
              "storing a stored document again")
        r = client.chat.completions.create(
            model="m", max_tokens=12, extra_body={"documents": docs},
            messages=[{"role": "user", "content": "Who built the lighthouse on Skerry Point?"}])
        info = r.model_extra["infoflow"]
        check(info["store"]["hits"] == 3 and [d["key"] for d in info["store"]["documents"]] == keys,
              f"the stored documents were not found by content: {info['store']}")
        log(f"ok: POST /v1/documents stored 3 (keys {keys}); the question loaded them: "
            f"{r.choices[0].message.content!r}")
        srv.stop()
    except BaseException:
        srv.kill()
        raise


# ---- concurrency ----------------------------------------------------------------------------

CLIENT_DOCS = [
    ["Anna lives in Oslo.", "Ben lives in Rome."],
    ["The red box holds apples.", "The blue box holds pears."],
    ["Tom is a baker.", "Sara is a pilot."],
    ["The meeting is on Monday.", "The party is on Friday."],
    ["Max owns a cat.", "Lea owns a dog."],
    ["The train leaves at noon.", "The bus leaves at nine."],
    ["Paul plays the violin.", "Mia plays the drums."],
    ["The lake is cold.", "The sea is warm."],
]
CLIENT_QUESTIONS = ["Where does Anna live?", "What does the red box hold?", "What is Tom?",
                    "When is the meeting?", "What does Max own?", "When does the train leave?",
                    "What does Paul play?", "Is the lake cold?"]


def case_concurrency(a):
    import openai
    sets = common_sets(a.np) + ["serve.queue_size=4"]
    srv = Server(a.bin, a.mpiexec, a.np, CONFIG, sets)
    try:
        def body(i):
            return dict(model="m", max_tokens=4,
                        messages=[{"role": "user", "content": CLIENT_QUESTIONS[i]}],
                        extra_body={"documents": CLIENT_DOCS[i]})

        client = openai_client(srv)
        alone = []
        for i in range(8):
            r = client.chat.completions.create(**body(i))
            alone.append((r.choices[0].message.content, r.model_extra["infoflow"]["answer"]
                          ["token_ids"], r.model_extra["infoflow"]["selected_positions"]))
        results = [[] for _ in range(8)]
        rejected = [0] * 8
        errors = []
        start = threading.Barrier(8)

        def client_thread(i):
            try:
                c = openai_client(srv)
                start.wait()
                for _ in range(25):
                    while True:
                        try:
                            raw = c.chat.completions.with_raw_response.create(**body(i))
                            r = raw.parse()
                            results[i].append((r.id, r.choices[0].message.content,
                                               r.model_extra["infoflow"]["answer"]["token_ids"],
                                               r.model_extra["infoflow"]["selected_positions"]))
                            break
                        except openai.RateLimitError as e:
                            ra = e.response.headers.get("retry-after")
                            if ra is None or int(ra) < 1:
                                errors.append(f"client {i}: 429 without Retry-After")
                                return
                            if e.body is None or e.code != "queue_full":
                                errors.append(f"client {i}: 429 body {e.body}")
                                return
                            rejected[i] += 1
                            time.sleep(0.25)  # (Retry-After is whole seconds; a test need not wait it out)
            except Exception as e:  # noqa: BLE001
                errors.append(f"client {i}: {type(e).__name__}: {e}")

        t0 = time.monotonic()
        threads = [threading.Thread(target=client_thread, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.monotonic() - t0
        check(not errors, "; ".join(errors))
        ids = [r[0] for rs in results for r in rs]
        check(len(ids) == 200, f"{len(ids)} answers for 200 requests")
        check(len(set(ids)) == 200, "duplicated response ids")
        for i in range(8):
            for (_, text, tokens, sel) in results[i]:
                check((text, tokens, sel) == alone[i],
                      f"client {i}: {text!r} under load, {alone[i][0]!r} alone")
        m = srv.metrics()
        ok = m['infoflow_requests_total{route="/v1/chat/completions",status="200"}']
        busy = m.get('infoflow_requests_total{route="/v1/chat/completions",status="429"}', 0)
        check(ok == 208, f"the server counted {ok} answered requests, 208 were answered")
        check(busy == sum(rejected) and busy > 0,
              f"the server counted {busy} 429s, the clients saw {sum(rejected)}")
        log(f"ok: 8 clients x 25 requests in {took:.1f} s, every answer equal to the request "
            f"run alone, 200 distinct ids, {sum(rejected)} 429s (each with Retry-After) retried")
        srv.stop()
    except BaseException:
        srv.kill()
        raise


# ---- bad requests ---------------------------------------------------------------------------

def raw_http(port, data, timeout=30):
    """Sends raw bytes, returns (status, body) of the response (status 0: no response)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        buf = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            buf += chunk
    finally:
        s.close()
    m = re.match(rb"HTTP/1\.[01] (\d+)", buf)
    if not m:
        return 0, buf
    return int(m.group(1)), buf.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in buf else b""


def post_raw(path, body, extra_headers=b"", content_length=None):
    n = len(body) if content_length is None else content_length
    return (b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\n" +
            extra_headers + b"Content-Length: " + str(n).encode() + b"\r\n\r\n" + body)


def case_bad(a):
    sets = common_sets(a.np) + ["serve.max_body_bytes=65536", "serve.max_tokens=32"]
    srv = Server(a.bin, a.mpiexec, a.np, CONFIG, sets)
    try:
        chat = b"/v1/chat/completions"
        good = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        msgs = [{"role": "user", "content": "Hi"}]
        long_doc = "word " * 9000  # ~9000 tokens in 45 KB
        # (label, raw request bytes, expected status, words the message must contain)
        table = [
            ("malformed JSON", post_raw(chat, b'{"messages": [}'), 400, ["malformed JSON"]),
            ("truncated body (JSON cut)", post_raw(chat, b'{"messages": [{"role": "user", "con'),
             400, ["messages[0]"]),
            ("truncated body (short of Content-Length)",
             post_raw(chat, b'{"messages": []}', content_length=500), 400, ["ended early"]),
            ("invalid UTF-8 in a string",
             post_raw(chat, b'{"messages": [{"role": "user", "content": "caf\xe9"}]}'), 400,
             ["messages[0].content", "UTF-8"]),
            ("body not an object", post_raw(chat, b'[1, 2]'), 400, ["JSON object"]),
            ("empty body", post_raw(chat, b""), 400, ["empty"]),
            ("messages missing", post_raw(chat, b'{"max_tokens": 4}'), 400, ["messages"]),
            ("messages empty", post_raw(chat, json.dumps({"messages": []}).encode()), 400,
             ["messages", "empty"]),
            ("messages not an array", post_raw(chat, b'{"messages": "hi"}'), 400, ["messages"]),
            ("content wrong type", post_raw(chat, json.dumps(
                {"messages": [{"role": "user", "content": 5}]}).encode()), 400,
             ["messages[0].content"]),
            ("unknown role", post_raw(chat, json.dumps(
                {"messages": [{"role": "wizard", "content": "x"}]}).encode()), 400,
             ["messages[0].role"]),
            ("last message not the user's", post_raw(chat, json.dumps(
                {"messages": msgs + [{"role": "assistant", "content": "x"}]}).encode()), 400,
             ["messages[1].role"]),
            ("negative max_tokens", post_raw(chat, json.dumps(
                {"messages": msgs, "max_tokens": -5}).encode()), 400, ["max_tokens", ">= 1"]),
            ("max_tokens above the cap", post_raw(chat, json.dumps(
                {"messages": msgs, "max_tokens": 100000}).encode()), 400,
             ["max_tokens", "serve.max_tokens"]),
            ("max_tokens a string", post_raw(chat, json.dumps(
                {"messages": msgs, "max_tokens": "ten"}).encode()), 400, ["max_tokens"]),
            ("temperature out of range", post_raw(chat, json.dumps(
                {"messages": msgs, "temperature": 7}).encode()), 400, ["temperature"]),
            ("top_p zero", post_raw(chat, json.dumps(
                {"messages": msgs, "top_p": 0}).encode()), 400, ["top_p"]),
            ("stop not strings", post_raw(chat, json.dumps(
                {"messages": msgs, "stop": [1]}).encode()), 400, ["stop[0]"]),
            ("stream not a boolean", post_raw(chat, json.dumps(
                {"messages": msgs, "stream": "yes"}).encode()), 400, ["stream"]),
            ("unknown method", post_raw(chat, json.dumps(
                {"messages": msgs, "documents": ["x"], "infoflow": {"method": "magic"}}).encode()),
             400, ["infoflow.method", "magic"]),
            ("ratio out of range", post_raw(chat, json.dumps(
                {"messages": msgs, "infoflow": {"ratio": 1.5}}).encode()), 400,
             ["infoflow.ratio"]),
            ("unknown infoflow field", post_raw(chat, json.dumps(
                {"messages": msgs, "infoflow": {"speed": 1}}).encode()), 400, ["infoflow.speed"]),
            ("documents not strings", post_raw(chat, json.dumps(
                {"messages": msgs, "documents": ["ok", 3]}).encode()), 400, ["documents[1]"]),
            ("n = 2", post_raw(chat, json.dumps({"messages": msgs, "n": 2}).encode()), 400,
             ["n:", "not implemented yet"]),
            ("context over the window", post_raw(chat, json.dumps(
                {"messages": msgs, "documents": [long_doc]}).encode()), 400,
             ["documents", "8192"]),
            ("logit_bias token out of range", post_raw(chat, json.dumps(
                {"messages": msgs, "logit_bias": {"999999": 5}}).encode()), 400,
             ["logit_bias.999999"]),
            ("body over serve.max_body_bytes", post_raw(chat, b'{"messages": "' + b"x" * 70000 +
                                                        b'"}'), 413, ["serve.max_body_bytes"]),
            ("chunked body over the limit",
             b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n"
             + (b"8000\r\n" + b"x" * 0x8000 + b"\r\n") * 3 + b"0\r\n\r\n", 413,
             ["serve.max_body_bytes"]),
            ("huge header", b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: " + b"a" * 20000 +
             b"\r\n\r\n", 400, ["header"]),
            ("GET on a POST route", b"GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 405,
             ["POST"]),
            ("unknown route", b"GET /v1/engines HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404, ["route"]),
            ("bad document key", b"GET /v1/documents/xyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 400,
             ["key"]),
            ("documents without a store", post_raw(b"/v1/documents", json.dumps(
                {"documents": ["a"]}).encode()), 400, ["store"]),
        ]
        rows = []
        failures = []
        for label, data, want, words in table:
            status, body = raw_http(srv.port, data)
            try:
                err = json.loads(body)["error"]
                msg = err["message"]
            except (ValueError, KeyError, TypeError):
                err, msg = None, body[:120].decode(errors="replace")
            rows.append((label, status, msg))
            if status != want or err is None or not all(w in msg for w in words):
                failures.append(f"{label}: got {status} {msg!r}, want {want} naming {words}")
            # the server answers after each bad request
            st, _ = srv.get("/health")
            if st != 200:
                failures.append(f"after '{label}': /health said {st}")
        status, body, _ = srv.post_json("/v1/chat/completions", good)
        check(status == 200 and body["choices"][0]["message"]["content"] is not None,
              "a good request after the bad ones")
        srv.stop()
    except BaseException:
        srv.kill()
        raise
    # The queue limit (429 with Retry-After) and the deadline (504) need a busy server.
    rows += limits_rows(a, failures)
    log(f"{'request':44s} status  message")
    for label, status, msg in rows:
        log(f"{label:44s} {status:5d}   {msg}")
    check(not failures, "\n".join(failures))
    log(f"ok: {len(rows)} bad requests, each refused with its status and the field named; "
        "the server answers after each")
    # The API key: 401 without it or with a wrong one (the same message whatever the length),
    # 200 with it; from the environment variable named by serve.api_key_env.
    srv = Server(a.bin, a.mpiexec, 1, CONFIG, common_sets(1) + ["serve.api_key_env=TEST_KEY"],
                 env={"TEST_KEY": "s3cret-key"})
    try:
        for hdr, want in [({}, 401), ({"Authorization": "Bearer wrong"}, 401),
                          ({"Authorization": "Bearer s3cret-ke"}, 401),
                          ({"Authorization": "Basic s3cret-key"}, 401),
                          ({"Authorization": "Bearer s3cret-key"}, 200)]:
            status, body, h = srv.post_json("/v1/chat/completions", good, headers=hdr)
            check(status == want, f"key {hdr}: {status}, want {want}")
            if want == 401:
                check(body["error"]["type"] == "authentication_error" and
                      h.get("WWW-Authenticate") == "Bearer", f"401 body {body}")
        st, _ = srv.get("/health")
        check(st == 200, "/health needs no key")
        log("ok: API key from serve.api_key_env: 401 without / with a wrong key, 200 with it")
        srv.stop()
    except BaseException:
        srv.kill()
        raise
    # A non-loopback address without a key is refused at start-up, naming the keys.
    p = subprocess.run([a.bin, "--config", CONFIG, "--set", "serve.host=0.0.0.0",
                        "--set", "serve.api_key_env="], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    check(p.returncode != 0 and "serve.allow_unauthenticated" in p.stderr and
          "0.0.0.0" in p.stderr, f"0.0.0.0 without a key: rc {p.returncode}\n{p.stderr}")
    log("ok: serve.host = 0.0.0.0 without a key refused at start-up: "
        + p.stderr.strip().splitlines()[-1])


def limits_rows(a, failures):
    """A server with one queue slot and a 2 s deadline: a long stream runs, a second request
    waits, a third gets 429; the deadline ends both running ones (504; in the stream, an error
    event and no [DONE])."""
    srv = Server(a.bin, a.mpiexec, a.np, CONFIG, common_sets(a.np) + [
        "serve.queue_size=1", "serve.max_batch=1", "serve.request_timeout_s=2",
        "serve.max_tokens=4096"])
    # 4000 tokens: far past the deadline on any machine (200 finished within 2 s on a fast one).
    long_req = dict(LONG, max_tokens=4000)
    rows = []
    try:
        c = srv.conn(timeout=120)
        c.request("POST", "/v1/chat/completions", body=json.dumps(long_req),
                  headers={"Content-Type": "application/json"})
        stream = c.getresponse()
        first = stream.read1(4096)  # the stream has started: the worker is busy with it
        waiting = {}

        def second():
            waiting["r"] = srv.request("POST", "/v1/chat/completions",
                                       dict(long_req, stream=False), timeout=120)

        th = threading.Thread(target=second)
        th.start()
        t0 = time.monotonic()
        while srv.metrics()["infoflow_queue_depth"] < 1 and time.monotonic() - t0 < 30:
            time.sleep(0.02)
        status, raw, headers = srv.request("POST", "/v1/chat/completions",
                                           {"messages": [{"role": "user", "content": "Hi"}]})
        msg = json.loads(raw)["error"]["message"]
        rows.append(("queue full (serve.queue_size = 1)", status, msg))
        if status != 429 or int(headers.get("Retry-After", "0")) < 1:
            failures.append(f"queue full: {status}, Retry-After {headers.get('Retry-After')}")
        events = list(sse_events(stream))
        last = json.loads(events[-1]) if events and events[-1] != "[DONE]" else {}
        emsg = last.get("error", {}).get("message", "")
        rows.append(("stream over serve.request_timeout_s", 200, "stream ends with: " + emsg))
        if "serve.request_timeout_s" not in emsg or first.count(b"data: ") < 1:
            failures.append(f"stream past its deadline: last event {events[-1:]}")
        th.join(120)
        st2, raw2, _ = waiting["r"]
        msg2 = json.loads(raw2)["error"]["message"] if raw2 else ""
        rows.append(("request over serve.request_timeout_s", st2, msg2))
        if st2 != 504 or "serve.request_timeout_s" not in msg2:
            failures.append(f"deadline: {st2} {msg2!r}")
        st, _ = srv.get("/health")
        if st != 200:
            failures.append(f"/health said {st} after the deadlines")
        srv.stop()
    except BaseException:
        srv.kill()
        raise
    return rows


# ---- faults ---------------------------------------------------------------------------------

LONG = {"messages": [{"role": "user", "content": "Write a long story about a dragon."}],
        "max_tokens": 200, "stream": True,
        # The end-of-turn and end-of-text tokens banned: the generation runs to max_tokens.
        "logit_bias": {"0": -100, "1": -100, "2": -100}}


def health_fails(srv):
    try:
        st, _ = srv.get("/health", timeout=5)
        return st != 200
    except OSError:
        return True


def kill_rank1(a, idle, recovery):
    timeout_s = 5
    flags = ["--enable-recovery"] if recovery else []
    # The stream must outlast the job's end by far: Open MPI takes about 2 s to end it, and a
    # fast machine decodes 200 tokens of the small model in less (one did, and the stream ended
    # with [DONE] before the kill took effect).
    sets = common_sets(2) + [f"parallel.timeout_s={timeout_s}", "serve.heartbeat_s=0.5",
                             "serve.max_tokens=4096"]
    if recovery and not idle:
        # Every decode step is a collective with rank 1 (with "kv" rank 0 decodes alone and
        # notices the death when the decode ends).
        sets.append("parallel.exchange=exact")
    srv = Server(a.bin, a.mpiexec, 2, CONFIG, sets, mpi_flags=flags)
    label = f"rank 1 killed {'while idle' if idle else 'mid-stream'}" + \
        (" (--enable-recovery: the server notices)" if recovery else " (Open MPI ends the job)")
    try:
        client_result = {}
        if not idle:
            c = srv.conn(timeout=120)
            # With documents the request runs on both ranks (without, it would be `full` on
            # rank 0 alone).
            body = dict(LONG, max_tokens=4000,
                        documents=["The dragon Ember lived in a cave above the valley."])
            c.request("POST", "/v1/chat/completions", body=json.dumps(body),
                      headers={"Content-Type": "application/json"})
            resp = c.getresponse()
            check(resp.status == 200, f"stream status {resp.status}")
            got = []

            def reader():
                try:
                    for ev in sse_events(resp):
                        got.append(ev)
                except Exception as e:  # noqa: BLE001
                    client_result["error"] = repr(e)
                client_result["done"] = True

            th = threading.Thread(target=reader)
            th.start()
            t_wait = time.monotonic()
            while len(got) < 3 and time.monotonic() - t_wait < 60:
                time.sleep(0.02)
            check(len(got) >= 3, "the stream did not start")
        pid1 = srv.pid_of_rank(1)
        check(pid1 is not None, "no rank 1")
        os.kill(pid1, signal.SIGKILL)
        t0 = time.monotonic()
        t_health = None
        while time.monotonic() - t0 < timeout_s + 10:
            if t_health is None and health_fails(srv):
                t_health = time.monotonic() - t0
            if srv.proc.poll() is not None:
                break
            time.sleep(0.05)
        rc, _ = srv.wait(max(1, timeout_s + 10 - (time.monotonic() - t0)))
        took = time.monotonic() - t0
        if t_health is None:
            t_health = took  # the process is gone: the port is closed
        out = srv.output()
        if recovery:
            # Open MPI 4.1's mpirun --enable-recovery exits 0 even after MPI_Abort; what counts is
            # that rank 0's watchdog ended the job, naming rank 1.
            where = "serve/all_reduce" if idle else "decode/"
            check(f"[rank 0/2] error: rank 1 did not reach {where}" in out,
                  f"{label}: no watchdog message naming rank 1 in {where}:\n{out[-3000:]}")
        else:
            check(rc != 0, f"{label}: mpirun exited 0")
        check(took <= timeout_s + 10, f"{label}: mpirun took {took:.1f} s")
        if not idle:
            th.join(30)
            check(client_result.get("done"), "the client is still reading")
            check(got[-1] != "[DONE]", f"{label}: the stream ended normally")
        srv.check_gone()
        log(f"ok: {label}: /health failed after {t_health:.1f} s, mpirun exited {rc} after "
            f"{took:.1f} s (limit {timeout_s} + 10 s)" +
            ("" if idle else f", the client's stream ended after {len(got)} events without "
             "[DONE]"))
        return t_health, took
    except BaseException:
        srv.kill()
        raise


def case_faults(a):
    for recovery in (False, True):
        for idle in (True, False):
            kill_rank1(a, idle, recovery)


# ---- drain ----------------------------------------------------------------------------------

def case_drain(a):
    sets = common_sets(a.np) + ["serve.max_tokens=256"]
    srv = Server(a.bin, a.mpiexec, a.np, CONFIG, sets)
    try:
        # 1. A client that disconnects mid-stream frees the server.
        c = srv.conn(timeout=120)
        c.request("POST", "/v1/chat/completions", body=json.dumps(LONG),
                  headers={"Content-Type": "application/json"})
        resp = c.getresponse()
        check(resp.status == 200, f"stream status {resp.status}")
        buf = b""
        t0 = time.monotonic()
        while buf.count(b"data: ") < 3:
            buf += resp.read1(4096)
        first_chunks = time.monotonic() - t0
        c.sock.shutdown(socket.SHUT_RDWR)
        c.close()
        t1 = time.monotonic()
        status, body, _ = srv.post_json("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2})
        freed = time.monotonic() - t1
        check(status == 200, f"the next request got {status}")
        m = srv.metrics()
        check(m['infoflow_cancelled_total{reason="client_disconnect"}'] == 1,
              "the disconnect was not counted as a cancelled generation")
        # The cancelled generation stopped early: its tokens are not all counted as generated.
        gen = m["infoflow_generated_tokens_total"]
        check(gen < 100, f"{gen} tokens generated: the cancelled stream ran on")
        log(f"ok: client disconnected after 3 chunks ({first_chunks:.1f} s); the next request "
            f"was answered {freed:.1f} s later; generation cancelled (a full one is 200 tokens)")
        # 2. SIGTERM: the request in flight finishes, a new one is refused, exit 0.
        c = srv.conn(timeout=120)
        body = dict(LONG, max_tokens=40)
        c.request("POST", "/v1/chat/completions", body=json.dumps(body),
                  headers={"Content-Type": "application/json"})
        resp = c.getresponse()
        buf = resp.read1(4096)
        srv.signal_rank0(signal.SIGTERM)
        time.sleep(0.3)
        try:
            st, _, _ = srv.post_json("/v1/chat/completions", {
                "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}, timeout=10)
            refused = st == 503
        except OSError:
            refused = True  # no longer listening
        check(refused, "a request after SIGTERM was accepted")
        rest = resp.read()
        events = [e for e in (buf + rest).decode().split("\n\n") if e.startswith("data: ")]
        check(events[-1] == "data: [DONE]", "the request in flight did not finish")
        check(json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length",
              "the request in flight was cut short")
        rc, took = srv.wait(60)
        check(rc == 0, f"the server exited {rc} after SIGTERM:\n{srv.output()[-2000:]}")
        srv.check_gone()
        log(f"ok: SIGTERM during a stream: it finished ({len(events) - 1} chunks + [DONE]), a "
            f"new request was refused, the job exited 0 after {took:.1f} s")
    except BaseException:
        srv.kill()
        raise


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--np", type=int, default=1)
    ap.add_argument("case", choices=["openai", "store", "concurrency", "bad", "faults", "drain"])
    a = ap.parse_args()
    if not os.path.exists(os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")):
        print("FAIL: the model is missing (run launch/setup.sh)")
        return 1
    t0 = time.monotonic()
    import tempfile
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if a.case == "store":
                case_store(a, tmp)
            else:
                globals()["case_" + a.case](a)
    except Fail as e:
        print(f"FAIL: {e}")
        return 1
    log(f"serve {a.case} on {a.np} rank(s): passed in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
