#!/usr/bin/env bash
# End-to-end checks of the infoflow_sp binary on the real model, run by CTest:
#   cli_test.sh BIN MPIEXEC CASE
# CASE: france     - one rank, method full: the answer to "What is the capital of France?"
#                    names Paris; the JSON result has the docs/design.md §9 fields
#       demo2      - the demo config on 2 MPI ranks (InfoFlow, kv exchange) answers, with bytes
#                    moved reported per rank
#       kv16       - the demo on 2 ranks with model.kv_dtype = "f16" gives the same greedy
#                    answer as with "f32", and its recompute exchange moves half the bytes
#                    (parallel.balance = false: the balanced plan's queries and partials are
#                    fp32 whatever the cache type)
#       configdiff - ranks started with different configs stop at start-up with an error
#                    naming the differing rank (no hang)
#       fault      - a rank that fails mid-run stops every rank (MPI_Abort) within 30 s with a
#                    message naming the failing rank
#       badkey     - an unknown config key is an error naming the key and file:line
#       demo       - configs/demo.toml's default question is answered correctly (its
#                    request.reference) by `full` on 1 rank and `infoflow` on 2 ranks, the run
#                    prints the reference with "match" and progress lines (phases, tok/s)
#       planned    - planned features (bf16) stop
#                    at start-up with "not implemented yet", before any model is loaded
#       version    - --version prints the version, a commit, the build features and the CPU
#                    paths this CPU can run (INFOFLOW_CPU_CEILING=avx2: avx2 alone)
#       products   - the binary started directly with OpenBLAS's generic kernels forced (what a
#                    CPU model it does not know gets): fp32 weights run the CPU's path, no BLAS
#                    library is linked, the summary and provenance name the products' kernels
#       schema     - answer (1 and 2 ranks), niah, eval and bench-ttft results validate against
#                    docs/result.schema.json, and carry the provenance of this build and model
#       jsonl      - a 2-case niah sweep interrupted after its first case leaves exactly one
#                    valid row in <out>.jsonl and no half-written <out>.json
#       resultsdir - bench-ttft with --out elsewhere writes nothing into bench/results/;
#                    --results-dir DIR writes DIR/<output.name>.json and .csv
#       table5     - bench/ttft_cpu_table5.sh on random:tiny (256 and 1536 tokens, the second
#                    past its 1024 positions; real 2 ranks, emulated 2 and 4): every point's
#                    rows, the report (tables, the P = 2 agreement table, JSON lines, CSV, PNG),
#                    and a second run that reuses the finished points
#       qualitylong - every configs/quality-long-*.toml runs as a 2-case version (2 cases of
#                    ~320 tokens in 4 documents, every case kept, from case 7 (sweep.first_case),
#                    2 answer tokens), every point
#                    of it (P-rank points included) gives a row, and the result validates
#                    against docs/result.schema.json: the long configs cannot rot in CI
#       install    - `cmake --install` into a temp prefix; the installed binary, with the
#                    installed configs, answers the France question; docs and configs are there
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../clock.sh"
bin="$1"; mpiexec="$2"; case_name="$3"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMP_WAIT_POLICY=passive
fail() { echo "FAIL: $*"; exit 1; }

case "$case_name" in
france)
    "$bin" --config configs/full.toml --set model.threads=2 --set decode.max_new_tokens=16 \
        --set 'request.documents=[]' --set request.system="" \
        --set request.question="What is the capital of France?" --out "$tmp/r.json" \
        > "$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt"; fail "infoflow_sp exited non-zero"; }
    cat "$tmp/out.txt"
    python3 - "$tmp/r.json" <<'PY' || exit 1
import json, sys
r = json.load(open(sys.argv[1]))
for k in ["job", "method", "ranks", "model", "context_tokens", "suffix_tokens", "answer",
          "first_token_top", "selected_positions", "ttft_ms", "phases", "config"]:
    assert k in r, f"missing key {k}"
assert len(r["first_token_top"]) == 20
assert "Paris" in r["answer"]["text"], f"answer without Paris: {r['answer']['text']!r}"
print("ok: answer", repr(r["answer"]["text"]))
PY
    ;;
demo2)
    "$mpiexec" -n 2 --oversubscribe "$bin" --config configs/demo.toml --set model.threads=1 \
        --set decode.max_new_tokens=12 --out "$tmp/r.json" > "$tmp/out.txt" 2>&1 \
        || { cat "$tmp/out.txt"; fail "mpiexec exited non-zero"; }
    cat "$tmp/out.txt"
    python3 - "$tmp/r.json" <<'PY' || exit 1
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ranks"] == 2 and r["method"] == "infoflow"
assert r["answer"]["token_ids"], "empty answer"
rec = [p for p in r["phases"] if p["name"] == "recompute"][0]
assert len(rec["bytes_sent"]) == 2 and sum(rec["bytes_sent"]) > 0
pre = [p for p in r["phases"] if p["name"] == "shard_prefill"][0]
assert sum(pre["bytes_sent"]) == 0
frac = len(r["selected_positions"]) / r["context_tokens"]
assert 0.1 < frac <= 0.15, frac
print("ok: 2 ranks, answer", repr(r["answer"]["text"]))
PY
    ;;
kv16)
    for t in f32 f16; do
        "$mpiexec" -n 2 --oversubscribe "$bin" --config configs/demo.toml --set model.threads=1 \
            --set decode.max_new_tokens=12 --set model.kv_dtype=$t --set parallel.balance=false \
            --out "$tmp/$t.json" \
            > "$tmp/$t.txt" 2>&1 || { cat "$tmp/$t.txt"; fail "kv_dtype $t: mpiexec exited non-zero"; }
    done
    cat "$tmp/f16.txt"
    python3 - "$tmp/f32.json" "$tmp/f16.json" <<'PY' || exit 1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["answer"]["token_ids"], "empty answer"
assert a["answer"]["token_ids"] == b["answer"]["token_ids"], (a["answer"]["text"], b["answer"]["text"])
def rec_bytes(r):
    return sum([p for p in r["phases"] if p["name"] == "recompute"][0]["bytes_sent"])
sa, sb = a["selected_positions"], b["selected_positions"]
print(f"ok: same answer {a['answer']['text']!r}; selected {len(sa)} / {len(sb)}, "
      f"{len(set(sa) & set(sb))} shared; recompute bytes {rec_bytes(a)} -> {rec_bytes(b)}")
if sa == sb:  # same selected set: the K/V exchange is exactly half as many bytes
    assert 2 * rec_bytes(b) == rec_bytes(a), (rec_bytes(a), rec_bytes(b))
PY
    ;;
configdiff)
    start=$(mono_i)
    timeout 60 "$mpiexec" -n 1 --oversubscribe "$bin" --config configs/demo.toml \
        --set method.ratio=0.15 : -n 1 "$bin" --config configs/demo.toml --set method.ratio=0.3 \
        > "$tmp/out.txt" 2>&1
    rc=$?
    cat "$tmp/out.txt"
    [ "$rc" -ne 0 ] || fail "differing configs were accepted"
    [ "$rc" -ne 124 ] || fail "job hung"
    grep -q "rank 1 differs from rank 0" "$tmp/out.txt" || fail "error does not name rank 1"
    echo "ok: rejected in $(( $(mono_i) - start )) s"
    ;;
fault)
    # Rank 1 fails as it enters scoring while rank 0 waits in the scoring collectives.
    start=$(mono_i)
    INFOFLOW_INJECT_FAULT="1:scoring" timeout 60 "$mpiexec" -n 2 --oversubscribe \
        -x INFOFLOW_INJECT_FAULT "$bin" --config configs/demo.toml --set model.threads=1 \
        > "$tmp/out.txt" 2>&1
    rc=$?
    took=$(( $(mono_i) - start ))
    cat "$tmp/out.txt"
    [ "$rc" -ne 0 ] || fail "the job succeeded despite the fault"
    [ "$rc" -ne 124 ] || fail "job hung"
    [ "$took" -le 30 ] || fail "took $took s to stop"
    grep -q "\[rank 1/2\] error: injected fault on rank 1" "$tmp/out.txt" || fail "no rank-tagged message"
    echo "ok: every rank stopped in $took s"
    ;;
badkey)
    printf 'job = "answer"\n[method]\nrato = 0.2\n' > "$tmp/bad.toml"
    if "$bin" --config "$tmp/bad.toml" > "$tmp/out.txt" 2>&1; then fail "bad key accepted"; fi
    cat "$tmp/out.txt"
    grep -q "unknown key 'method.rato' at $tmp/bad.toml:3" "$tmp/out.txt" || fail "message"
    grep -q "did you mean 'method.ratio'" "$tmp/out.txt" || fail "no suggestion"
    ;;
demo)
    # Both answers must contain request.reference; the 2-rank run is the demo itself.
    ref="$(python3 -c 'import tomllib,sys; print(tomllib.load(open("configs/demo.toml","rb"))["request"]["reference"])')"
    [ -n "$ref" ] || fail "configs/demo.toml has no request.reference"
    "$bin" --config configs/demo.toml --set method.name=full --set model.threads=2 \
        --out "$tmp/full.json" > "$tmp/full.txt" 2> "$tmp/full.err" \
        || { cat "$tmp/full.txt" "$tmp/full.err"; fail "full run exited non-zero"; }
    "$mpiexec" -n 2 --oversubscribe "$bin" --config configs/demo.toml --set model.threads=1 \
        --out "$tmp/sp.json" > "$tmp/sp.txt" 2> "$tmp/sp.err" \
        || { cat "$tmp/sp.txt" "$tmp/sp.err"; fail "2-rank run exited non-zero"; }
    cat "$tmp/full.txt" "$tmp/sp.txt" "$tmp/sp.err"
    for f in full sp; do
        grep -q "^reference  : $ref  (match" "$tmp/$f.txt" || fail "$f: reference line without match"
    done
    for phase in load shard_prefill scoring recompute suffix_prefill decode; do
        grep -q "^\[progress\] $phase" "$tmp/sp.err" || fail "no progress line for $phase"
    done
    grep -q "^\[progress\] shard_prefill done: .* tok/s" "$tmp/sp.err" || fail "no tok/s"
    grep -q "^\[progress\] chunk_prefill\|^\[progress\] prefill done" "$tmp/full.err" \
        || fail "no progress line in the full run"
    python3 - "$tmp/full.json" "$tmp/sp.json" "$ref" <<'PY' || exit 1
import json, sys
ref = sys.argv[3].lower()
for path, method, ranks in [(sys.argv[1], "full", 1), (sys.argv[2], "infoflow", 2)]:
    r = json.load(open(path))
    assert r["method"] == method and r["ranks"] == ranks, (path, r["method"], r["ranks"])
    assert ref in r["answer"]["text"].lower(), f"{method}: {r['answer']['text']!r} lacks {ref!r}"
    assert r["reference"]["match"] is True
    print(f"ok: {method} on {ranks} rank(s): {r['answer']['text']!r}")
PY
    ;;
planned)
    for set in model.dtype=bf16; do
        start=$(mono_ns)
        if "$bin" --config configs/demo.toml --set "$set" > "$tmp/out.txt" 2>&1; then
            fail "--set $set was accepted"
        fi
        ms=$(( ($(mono_ns) - start) / 1000000 ))
        cat "$tmp/out.txt"
        grep -q "not implemented yet" "$tmp/out.txt" || fail "--set $set: no 'not implemented yet'"
        grep -q "${set%%=*}" "$tmp/out.txt" || fail "--set $set: error does not name the key"
        [ "$ms" -lt 5000 ] || fail "--set $set took $ms ms: rejected after loading?"
    done
    echo "ok: every planned feature rejected at start-up"
    ;;
version)
    "$bin" --version > "$tmp/out.txt" 2>&1 || fail "--version exited non-zero"
    cat "$tmp/out.txt"
    grep -Eq '^infoflow_sp [0-9]+\.[0-9]+\.[0-9]+ \(commit ([0-9a-f]{7,}(-dirty)?|unknown), ' \
        "$tmp/out.txt" || fail "no version and commit"
    want="$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
    grep -q "commit $want" "$tmp/out.txt" || fail "commit is not HEAD ($want): rebuild, the binary was built from another commit"
    grep -q '^features: cpu ' "$tmp/out.txt" || fail "no build features"
    grep -Eq '^cpu paths: avx2( avx512)?( amx)? \(this run: (avx2|avx512|amx)\)$' "$tmp/out.txt" ||
        fail "no line of the CPU paths this CPU can run"
    # A CPU without AVX-512 (INFOFLOW_CPU_CEILING, the test hook that simulates one) lists avx2
    # alone and runs it.
    INFOFLOW_CPU_CEILING=avx2 INFOFLOW_CPU_ISA= "$bin" --version | grep -qx 'cpu paths: avx2 (this run: avx2)' ||
        fail "INFOFLOW_CPU_CEILING=avx2 does not leave avx2 alone"
    ;;
products)
    # Started directly (no launch script), as users, mpirun and Slurm start it, on a CPU whose
    # model a BLAS library would not know (OPENBLAS_CORETYPE=Prescott forces OpenBLAS's generic
    # SSE3 kernels, what it picks on a model it does not know): fp32 weights (model.weights =
    # f32) still run the CPU's own path, and the summary and provenance say which kernels carry the
    # products. No BLAS library is linked at all.
    if ldd "$bin" | grep -Ei 'lib(open)?blas|libmkl|libblis'; then
        fail "a BLAS library is linked"
    fi
    expect=$(INFOFLOW_CPU_ISA= "$bin" --version | sed -n 's/^cpu paths: .*(this run: \(.*\))$/\1/p')
    [ -n "${INFOFLOW_CPU_ISA:-}" ] && expect="$INFOFLOW_CPU_ISA"
    OPENBLAS_CORETYPE=Prescott "$bin" --config configs/full.toml --set model.weights=f32 \
        --set model.threads=2 --set decode.max_new_tokens=4 --set 'request.documents=[]' \
        --set request.system="" --set request.question="What is the capital of France?" \
        --out "$tmp/r.json" > "$tmp/out.txt" 2>&1 ||
        { cat "$tmp/out.txt"; fail "infoflow_sp exited non-zero"; }
    grep '^products' "$tmp/out.txt" || fail "the summary names no products' kernels"
    python3 - "$tmp/r.json" "$expect" <<'PY' || exit 1
import json, sys
r, expect = json.load(open(sys.argv[1])), sys.argv[2]
cpu = r["provenance"]["host"]["cpu"]
print("isa:", cpu["isa"], "| products:", cpu["products"])
assert cpu["isa"].split()[0] == expect, (cpu["isa"], expect)
want = {"avx2": "exact pass (avx2 fma)", "avx512": "exact pass (avx512 fma)",
        "amx": "bf16 tiles ("}[expect]
assert cpu["products"].startswith(want), cpu["products"]
assert cpu["products"].endswith("no BLAS library"), cpu["products"]
PY
    ;;
schema)
    schema="$root/docs/result.schema.json"
    export INFOFLOW_PROGRESS=0
    "$bin" --config configs/full.toml --set model.threads=2 --set decode.max_new_tokens=4 \
        --set 'request.documents=[]' --set request.question="What is the capital of France?" \
        --set output.logits_file="$tmp/first.f32" \
        --out "$tmp/answer1.json" > /dev/null || fail "answer on 1 rank"
    "$mpiexec" -n 2 --oversubscribe "$bin" --config configs/demo.toml --set model.threads=1 \
        --set decode.max_new_tokens=4 --out "$tmp/answer2.json" > /dev/null || fail "answer on 2 ranks"
    "$bin" --config configs/niah-smollm2.toml --set 'niah.lengths=[256]' --set 'niah.depths=[0.5]' \
        --set 'niah.methods=[full,infoflow]' --set 'niah.layouts=[global]' --set method.reorder=false \
        --set decode.max_new_tokens=4 --out "$tmp/niah.json" > /dev/null || fail "niah"
    "$bin" --config configs/eval-example.toml --set eval.max_samples=1 \
        --set decode.max_new_tokens=4 --out "$tmp/eval.json" > /dev/null || fail "eval"
    "$mpiexec" -n 2 --oversubscribe "$bin" --config configs/bench-ttft-smollm2.toml \
        --set model.path=random:tiny --set 'bench.lengths=[256]' --set bench.runs=2 \
        --set bench.warmup=0 --set chunking.size=64 --out "$tmp/bench.json" > /dev/null || fail "bench"
    "$bin" --config configs/quality-methods-smollm2.toml --set sweep.cases=1 \
        --set 'sweep.kinds=[niah]' --set sweep.documents=2 --set sweep.context_tokens=60 \
        --set 'sweep.points=["method.name=infoflow"]' --set sweep.full_correct_only=false \
        --set decode.max_new_tokens=4 --out "$tmp/sweep.json" > /dev/null || fail "sweep"
    python3 "$root/tests/cli/validate_result.py" "$schema" "$tmp"/answer1.json "$tmp"/answer2.json \
        "$tmp"/niah.json "$tmp"/eval.json "$tmp"/bench.json "$tmp"/sweep.json || exit 1
    # The logits file: n_vocab float32 log-probs whose softmax sums to 1, named in the result.
    python3 - "$tmp" <<'PY' || exit 1
import json, math, struct, sys
tmp = sys.argv[1]
a = json.load(open(f"{tmp}/answer1.json"))
assert a["first_token_logprobs_full_vocab_file"] == f"{tmp}/first.f32", a["first_token_logprobs_full_vocab_file"]
raw = open(f"{tmp}/first.f32", "rb").read()
assert len(raw) == 4 * 49152, len(raw)
lp = struct.unpack(f"<{len(raw) // 4}f", raw)
total = math.fsum(math.exp(x) for x in lp)
assert abs(total - 1.0) < 1e-4, total
assert max(range(len(lp)), key=lp.__getitem__) == a["answer"]["token_ids"][0]
print("ok: logits file", len(lp), "log-probs, softmax sum", total)
PY
    # bench-ttft on 2 ranks: each distributed row has every phase of phases_ms per rank (in the
    # order they ran: the shard or ring prefill first), each rank's wait within its phase.
    python3 - "$tmp/bench.json" <<'PY' || exit 1
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
dist = [r for r in rows if r["ranks"] == 2]
assert dist and all("phases_per_rank" not in r for r in rows if r["ranks"] == 1), rows
for r in dist:
    per = r["phases_per_rank"]
    assert sorted(p["phase"] for p in per) == sorted(r["phases_ms"]), (per, r["phases_ms"])
    assert per[0]["phase"] in ("shard_prefill", "ring_prefill"), per
    for p in per:
        assert len(p["ms"]) == 2 and len(p["wait_ms"]) == 2, p
        assert all(w <= m + 1e-6 for m, w in zip(p["ms"], p["wait_ms"])), p
print("ok: bench-ttft per-rank phases of", len(dist), "distributed rows")
PY
    python3 "$root/tests/cli/validate_result.py" "$schema" --rows niah "$tmp/niah.jsonl" || exit 1
    python3 "$root/tests/cli/validate_result.py" "$schema" --rows eval "$tmp/eval.jsonl" || exit 1
    # Provenance names this build and this model file.
    python3 - "$tmp" "$("$bin" --version | head -n 1)" "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" <<'PY' || exit 1
import json, os, socket, sys
tmp, version_line, model = sys.argv[1], sys.argv[2], sys.argv[3]
a1 = json.load(open(f"{tmp}/answer1.json"))["provenance"]
a2 = json.load(open(f"{tmp}/answer2.json"))["provenance"]
b = json.load(open(f"{tmp}/bench.json"))["provenance"]
assert a1["ranks"] == 1 and a2["ranks"] == 2 and b["ranks"] == 2
assert a1["tool"]["commit"] in version_line and a1["tool"]["version"] in version_line
assert a1["host"]["name"] == socket.gethostname()
assert a1["model"]["bytes"] == os.path.getsize(model) and a1["model"]["file"] == os.path.basename(model)
assert a1["model"]["hash"] == a2["model"]["hash"] and a1["model"]["hash_scope"] == "whole"
assert a2["threads_per_rank"] == 1 and a1["threads_per_rank"] == 2
assert b["model"]["hash_scope"] == "name"
# Placement: both ranks of the local 2-rank run on this host, node-local ranks 0 and 1.
pl = json.load(open(f"{tmp}/answer2.json"))["placement"]
# The CPU device names its kernel path: "cpu (avx2)", "cpu (avx512 (bf16, vnni; no amx: ...))"
# or "cpu (amx (...))".
assert [(p["rank"], p["host"], p["local_rank"], p["local_size"], p["device"].split(" ")[0])
        for p in pl] == [(r, socket.gethostname(), r, 2, "cpu") for r in range(2)], pl
assert all(p["device"] in ("cpu (avx2)", "cpu (avx512)", "cpu (amx)")
           or p["device"].startswith(("cpu (avx512 (", "cpu (amx ("))
           for p in pl), pl
print("ok: provenance", a1["tool"]["commit"], a1["model"]["hash"], a1["host"]["cpu"]["model"])
PY
    ;;
jsonl)
    # Case 1 (256 tokens) takes about a second, case 2 (4096 tokens) far longer: stop the sweep
    # as soon as the first row is on disk.
    "$bin" --config configs/niah-smollm2.toml --set 'niah.lengths=[256,4096]' \
        --set 'niah.depths=[0.5]' --set 'niah.methods=[full]' --set method.reorder=false \
        --set decode.max_new_tokens=4 --out "$tmp/sweep.json" > "$tmp/out.txt" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
        [ -s "$tmp/sweep.jsonl" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -TERM "$pid" 2>/dev/null
    wait "$pid"
    rc=$?
    cat "$tmp/out.txt"
    [ "$rc" -ne 0 ] || fail "the sweep finished before it was interrupted (rc 0)"
    [ -f "$tmp/sweep.json" ] && fail "an interrupted sweep wrote its final JSON"
    lines=$(wc -l < "$tmp/sweep.jsonl")
    [ "$lines" -eq 1 ] || fail "expected 1 row in sweep.jsonl, found $lines"
    python3 "$root/tests/cli/validate_result.py" "$root/docs/result.schema.json" --rows niah \
        "$tmp/sweep.jsonl" || exit 1
    python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).readline()); assert r["length_target"]==256, r' \
        "$tmp/sweep.jsonl" || fail "the row is not the first case"
    echo "ok: interrupted sweep kept its first row"
    ;;
qualitylong)
    n=0
    # The store points' files (configs/quality-long-store-4k-smollm2.toml writes them under
    # out/): those this run creates are removed at the end.
    stores_before="$(ls -d out/ql-store-* 2>/dev/null)"
    trap 'for f in out/ql-store-*; do [ -e "$f" ] && ! grep -qxF "$f" <<< "$stores_before" \
          && rm -rf "$f"; done; rm -rf "$tmp"' EXIT
    for cfg in configs/quality-long-*.toml; do
        name="$(basename "$cfg" .toml)"
        # A config timed on the CPU clock runs on one thread (sweep.clock = "cpu" needs it).
        threads=2
        grep -qE '^clock *= *"cpu"' "$cfg" && threads=1
        "$bin" --config "$cfg" --set sweep.cases=2 --set sweep.full_correct_only=false \
            --set sweep.first_case=7 \
            --set decode.max_new_tokens=2 --set sweep.context_tokens=320 --set sweep.documents=4 \
            --set 'sweep.document_tokens=[40, 120]' --set model.threads=$threads \
            --out "$tmp/$name.json" > "$tmp/$name.txt" 2>&1 \
            || { cat "$tmp/$name.txt"; fail "$cfg (2-case version)"; }
        python3 "$root/tests/cli/validate_result.py" "$root/docs/result.schema.json" \
            "$tmp/$name.json" || exit 1
        python3 - "$tmp/$name.json" <<'PY' || fail "$cfg: rows"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["case_spec"]["layout"] == "long", r["case_spec"]
assert r["cases_kept"] == 2, r["cases_kept"]
assert sorted({row["case"] for row in r["rows"]}) == [7, 8], "sweep.first_case = 7"
assert len(r["rows"]) == 2 * (len(r["points"]) + 1), (len(r["rows"]), len(r["points"]))
ranks = sorted({row["ranks"] for row in r["rows"]})
print(f"ok: {sys.argv[1].rsplit('/', 1)[-1]}: {len(r['points'])} points x 2 cases, ranks {ranks}, "
      f"{r['wall_s']:.0f} s")
PY
        n=$((n + 1))
    done
    [ "$n" -ge 8 ] || fail "expected at least 8 configs/quality-long-*.toml, found $n"
    # The report of bench/results/quality-long-smollm2.md runs on those results: every section,
    # the plots, and the held-out verdict (which needs both 2K and 4K).
    q="$tmp/quality-long"
    rep=(python3 bench/quality_long_report.py --plots "$tmp/plots" --prefix ql
         --methods "2K=$q-methods-2k-smollm2.json" --ratio "$q-ratio-4k-smollm2.json"
         --ranks "$q-ranks-4k-smollm2.json" --store "$q-store-4k-smollm2.json"
         --variants "2K=$q-dev-2k-smollm2.json")
    "${rep[@]}" --heldout "2K=$q-methods-2k-smollm2.json" > "$tmp/report1.md" 2>&1 \
        || { cat "$tmp/report1.md"; fail "quality_long_report.py"; }
    grep -q "No verdict: the rule needs the held-out runs at 2K and at 4K" "$tmp/report1.md" \
        || { cat "$tmp/report1.md"; fail "report: a verdict from 2K alone"; }
    "${rep[@]}" --heldout "2K=$q-methods-2k-smollm2.json" --heldout "4K=$q-methods-4k-smollm2.json" \
        > "$tmp/report2.md" 2>&1 || { cat "$tmp/report2.md"; fail "quality_long_report.py"; }
    for s in "### 2K: methods at ratio 0.15" "### Held-out confirmation" \
             "### The store against the fresh chunk prefill" \
             "Development set, 2K" "\`scoring.layers=\[2, 3, 4, 5\]\`: \(passes\|does not pass\)"; do
        grep -q "$s" "$tmp/report2.md" || { cat "$tmp/report2.md"; fail "report: no '$s'"; }
    done
    [ -s "$tmp/plots/ql-pareto-2K.png" ] && [ -s "$tmp/plots/ql-ratio.png" ] \
        || { ls "$tmp/plots"; fail "report: plots"; }
    echo "ok: quality_long_report.py on the 2-case results"
    ;;
table5)
    export INFOFLOW_PROGRESS=0
    t5=(env LENGTHS="256 1536" POINTS="real2 emul:2:shm emul:4:ib" RUNS=1 WARMUP=0
        EXTRA_SETS="model.path=random:tiny chunking.size=128")
    "${t5[@]}" bench/ttft_cpu_table5.sh "$(dirname "$bin")" "$tmp/t5" > "$tmp/t5.txt" 2>&1 \
        || { cat "$tmp/t5.txt"; fail "bench/ttft_cpu_table5.sh"; }
    for f in ttft-cpu-table5-smollm2.md ttft-cpu-table5-smollm2.jsonl ttft-cpu-table5-smollm2.csv \
             ttft-cpu-table5-smollm2.png real2-256.json emul-2-shm-1536.json emul-4-ib-256.json; do
        [ -s "$tmp/t5/$f" ] || { ls "$tmp/t5"; fail "table5: no $f"; }
    done
    python3 - "$tmp/t5" <<'PY' || { cat "$tmp/t5.txt"; fail "table5: the report"; }
import json, sys
d = sys.argv[1]
rows = [json.loads(l) for l in open(d + "/ttft-cpu-table5-smollm2.jsonl")]
# real2: single, ring/zigzag, infoflow/kv; each emulated point: ring/zigzag, infoflow/kv
assert len(rows) == 2 * (3 + 2 + 2), len(rows)
assert {r["tokens"] for r in rows} == {256, 1536}
assert all(r["past_window"] == (r["tokens"] == 1536) for r in rows)
assert {(r["point"], r["method"]) for r in rows if r["tokens"] == 256} == {
    ("real2", "single"), ("real2", "ring/zigzag"), ("real2", "infoflow/kv"),
    ("emul:2:shm", "ring/zigzag"), ("emul:2:shm", "infoflow/kv"),
    ("emul:4:ib", "ring/zigzag"), ("emul:4:ib", "infoflow/kv")}
md = open(d + "/ttft-cpu-table5-smollm2.md").read()
for s in ("## 256 tokens", "## 1536 tokens", "## Emulated P = 2 against the real 2 ranks",
          "| emulated, 4 ranks, ib | infoflow/kv |", "infoflow/kv* |"):
    assert s in md, s
last = [l for l in open(d + "/../t5.txt") if l.startswith('{"bench": "ttft_cpu_table5"')]
summary = json.loads(last[-1])
assert summary["rows"] == 14 and len(summary["agree"]) == 4, summary
print("ok: table5 rows and report", len(rows))
PY
    "${t5[@]}" bench/ttft_cpu_table5.sh "$(dirname "$bin")" "$tmp/t5" > "$tmp/t5b.txt" 2>&1 \
        || { cat "$tmp/t5b.txt"; fail "table5: second run"; }
    [ "$(grep -c 'done before' "$tmp/t5b.txt")" = 6 ] || { cat "$tmp/t5b.txt"; fail "table5: points rerun"; }
    echo "ok: table5 resumes from the finished points"
    # --previous: an earlier report's rows fill the (point, length) pairs a new run lacks,
    # marked; CLOCK=cpu: the emulated rows read CPU time and say so.
    mkdir -p "$tmp/t5c"
    env LENGTHS="256" POINTS="emul:4:ib" RUNS=1 WARMUP=0 CLOCK=cpu \
        EXTRA_SETS="model.path=random:tiny chunking.size=128" \
        bench/ttft_cpu_table5.sh "$(dirname "$bin")" "$tmp/t5c" > "$tmp/t5c.txt" 2>&1 \
        || { cat "$tmp/t5c.txt"; fail "table5: CLOCK=cpu"; }
    python3 bench/ttft_cpu_table5_report.py "$tmp/t5c" \
        --previous "$tmp/t5/ttft-cpu-table5-smollm2.jsonl" > "$tmp/t5c.md" \
        || fail "table5: --previous"
    python3 - "$tmp/t5c" <<'PY' || { cat "$tmp/t5c.md"; fail "table5: --previous rows"; }
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/ttft-cpu-table5-smollm2.jsonl")]
assert len(rows) == 14, len(rows)
new = [r for r in rows if not r.get("previous")]
assert {(r["point"], r["tokens"]) for r in new} == {("emul:4:ib", 256)}, new
assert all(r["clock"] == "cpu" for r in new) and all(r["clock"] == "wall" for r in rows
                                                      if r.get("previous"))
md = open(sys.argv[1] + "/ttft-cpu-table5-smollm2.md").read()
assert "| emulated, 4 ranks, ib (CPU clock) | infoflow/kv |" in md
assert "| emulated, 2 ranks, shm (earlier run) | infoflow/kv |" in md
print("ok: table5 --previous and CLOCK=cpu")
PY
    ;;
resultsdir)
    committed="$root/bench/results/ttft-smollm2-cpu.csv"
    before="$(stat -c %Y "$committed" 2>/dev/null || echo none)"
    before_sum="$(md5sum < "$committed" 2>/dev/null || echo none)"
    args=(--set model.path=random:tiny --set 'bench.lengths=[256]' --set bench.runs=1
          --set bench.warmup=0 --set chunking.size=64)
    export INFOFLOW_PROGRESS=0
    "$bin" --config configs/bench-ttft-smollm2.toml "${args[@]}" --out "$tmp/o.json" > "$tmp/out.txt" \
        || { cat "$tmp/out.txt"; fail "bench with --out"; }
    [ -f "$tmp/o.json" ] && [ -f "$tmp/o.csv" ] || fail "--out did not write o.json and o.csv"
    "$bin" --config configs/bench-ttft-smollm2.toml "${args[@]}" > "$tmp/out.txt" \
        || fail "bench without --out"
    [ "$(stat -c %Y "$committed" 2>/dev/null || echo none)" = "$before" ] || fail "bench/results/ was written"
    [ "$(md5sum < "$committed" 2>/dev/null || echo none)" = "$before_sum" ] || fail "bench/results/ changed"
    "$bin" --config configs/bench-ttft-smollm2.toml "${args[@]}" --results-dir "$tmp/res" \
        > "$tmp/out.txt" 2>&1 && fail "--results-dir into a missing directory succeeded"
    mkdir -p "$tmp/res"
    "$bin" --config configs/bench-ttft-smollm2.toml "${args[@]}" --results-dir "$tmp/res" \
        > "$tmp/out.txt" || fail "bench --results-dir"
    [ -f "$tmp/res/ttft-smollm2-cpu.json" ] && [ -f "$tmp/res/ttft-smollm2-cpu.csv" ] \
        || { ls "$tmp/res"; fail "--results-dir did not write ttft-smollm2-cpu.{json,csv}"; }
    grep -q "min ms *median ms *max ms *spread" "$tmp/out.txt" || fail "no min/median/max table"
    echo "ok: nothing written into bench/results/ unless asked"
    # bench.rows: only the named rows run (here on 2 emulated ranks); a name that is not a row
    # is an error that lists the rows.
    emul=(--set bench.emulate_timing=true --set parallel.emulate_ranks=2)
    "$bin" --config configs/bench-ttft-smollm2.toml "${args[@]}" "${emul[@]}" \
        --set 'bench.rows=["infoflow/kv", "single"]' --out "$tmp/rows.json" > "$tmp/out.txt" \
        || { cat "$tmp/out.txt"; fail "bench.rows"; }
    python3 - "$tmp/rows.json" <<'PY' || fail "bench.rows: the rows run"
import json, sys
labels = [r["method"] for r in json.load(open(sys.argv[1]))["rows"]]
assert labels == ["single", "infoflow/kv"], labels
print("ok: bench.rows ran", labels)
PY
    "$bin" --config configs/bench-ttft-smollm2.toml "${args[@]}" "${emul[@]}" \
        --set 'bench.rows=["infoflow"]' > "$tmp/out.txt" 2>&1 && fail "bench.rows: a bad label passed"
    grep -q "bench.rows: 'infoflow' is not a row of bench.methods on 2 rank(s) (the rows: single, ring/zigzag, ring/contiguous, infoflow/kv, infoflow/exact)" \
        "$tmp/out.txt" || { cat "$tmp/out.txt"; fail "bench.rows: the error"; }
    echo "ok: bench.rows keeps the named rows and rejects others"
    # bench.clock = "cpu": the virtual ranks' segments read the process's CPU time (the rows say
    # which clock); refused where CPU time would leave out waiting (2 threads, real ranks).
    "$bin" --config configs/bench-ttft-smollm2.toml "${args[@]}" "${emul[@]}" --set bench.clock=cpu \
        --set bench.threads=1 --set 'bench.rows=["ring/zigzag", "infoflow/kv"]' \
        --out "$tmp/clock.json" > "$tmp/out.txt" || { cat "$tmp/out.txt"; fail "bench.clock = cpu"; }
    python3 - "$tmp/clock.json" <<'PY' || fail "bench.clock: the result"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["clock"] == "cpu", d["clock"]
assert all(r["ttft_ms"] > 0 for r in d["rows"]), [r["ttft_ms"] for r in d["rows"]]
print("ok: bench.clock = cpu,", [round(r["ttft_ms"], 1) for r in d["rows"]])
PY
    "$bin" --config configs/bench-ttft-smollm2.toml "${args[@]}" "${emul[@]}" --set bench.clock=cpu \
        --set bench.threads=2 > "$tmp/out.txt" 2>&1 && fail "bench.clock = cpu with 2 threads passed"
    grep -q 'bench.clock = "cpu" needs one process with one thread' "$tmp/out.txt" \
        || { cat "$tmp/out.txt"; fail "bench.clock: the error"; }
    echo "ok: bench.clock = cpu times the virtual ranks and refuses 2 threads"
    # model.positions: past random:tiny's 1024 positions only when asked, and then marked as
    # timing only in the table and the rows.
    long=(--set model.path=random:tiny --set 'bench.lengths=[1536]' --set bench.runs=1
          --set bench.warmup=0 --set chunking.size=256 --set 'bench.rows=["single"]')
    "$bin" --config configs/bench-ttft-smollm2.toml "${long[@]}" > "$tmp/out.txt" 2>&1 \
        && fail "1536 tokens on a 1024-position model passed without model.positions"
    grep -q "positions" "$tmp/out.txt" || { cat "$tmp/out.txt"; fail "model.positions: the error"; }
    "$bin" --config configs/bench-ttft-smollm2.toml "${long[@]}" --set model.positions=2048 \
        --out "$tmp/long.json" > "$tmp/out.txt" 2> "$tmp/err.txt" \
        || { cat "$tmp/out.txt" "$tmp/err.txt"; fail "model.positions=2048"; }
    grep -q "model.positions = 2048 runs past the 1024 positions" "$tmp/err.txt" \
        || { cat "$tmp/err.txt"; fail "model.positions: no warning at load"; }
    grep -q "past the model's window of 1024 positions (model.positions): timing only" \
        "$tmp/out.txt" || { cat "$tmp/out.txt"; fail "model.positions: no note under the table"; }
    python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))["rows"]; assert [x["past_window"] for x in r] == [True], r' \
        "$tmp/long.json" || fail "model.positions: past_window in the rows"
    echo "ok: model.positions runs past the window, marked timing only"
    ;;
install)
    build="$(dirname "$bin")"
    cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.txt" 2>&1 \
        || { cat "$tmp/install.txt"; fail "cmake --install"; }
    p="$tmp/prefix"
    for f in bin/infoflow_sp share/infoflow_sp/configs/full.toml share/infoflow_sp/configs/demo.toml \
             share/infoflow_sp/configs/README.md share/doc/infoflow_sp/README.md \
             share/doc/infoflow_sp/results-schema.md share/doc/infoflow_sp/result.schema.json; do
        [ -f "$p/$f" ] || fail "not installed: $f"
    done
    "$p/bin/infoflow_sp" --version | head -n 1
    cd "$tmp"  # away from the source tree: only the installed files and the model
    INFOFLOW_PROGRESS=0 "$p/bin/infoflow_sp" --config "$p/share/infoflow_sp/configs/full.toml" \
        --set model.path="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" --set model.threads=2 \
        --set decode.max_new_tokens=16 --set 'request.documents=[]' --set request.system="" \
        --set request.question="What is the capital of France?" --out "$tmp/r.json" \
        > "$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt"; fail "installed binary exited non-zero"; }
    grep "^answer" "$tmp/out.txt"
    python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["answer"]["text"]; assert "Paris" in t, t' \
        "$tmp/r.json" || fail "installed binary: no Paris"
    echo "ok: installed binary answers"
    ;;
*) fail "unknown case $case_name" ;;
esac
