#!/usr/bin/env bash
# End-to-end checks of the infoflow_sp binary on the real model, run by CTest:
#   cli_test.sh BIN MPIEXEC CASE
# CASE: france     - one rank, method full: the answer to "What is the capital of France?"
#                    names Paris; the JSON result has the DESIGN §9 fields
#       demo2      - the demo config on 2 MPI ranks (InfoFlow, kv exchange) answers, with bytes
#                    moved reported per rank
#       configdiff - ranks started with different configs stop at start-up with an error
#                    naming the differing rank (no hang)
#       fault      - a rank that fails mid-run stops every rank (MPI_Abort) within 30 s with a
#                    message naming the failing rank
#       badkey     - an unknown config key is an error naming the key and file:line
set -uo pipefail
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
configdiff)
    start=$(date +%s)
    timeout 60 "$mpiexec" -n 1 --oversubscribe "$bin" --config configs/demo.toml \
        --set method.ratio=0.15 : -n 1 "$bin" --config configs/demo.toml --set method.ratio=0.3 \
        > "$tmp/out.txt" 2>&1
    rc=$?
    cat "$tmp/out.txt"
    [ "$rc" -ne 0 ] || fail "differing configs were accepted"
    [ "$rc" -ne 124 ] || fail "job hung"
    grep -q "rank 1 differs from rank 0" "$tmp/out.txt" || fail "error does not name rank 1"
    echo "ok: rejected in $(( $(date +%s) - start )) s"
    ;;
fault)
    # Rank 1 fails as it enters scoring while rank 0 waits in the scoring collectives.
    start=$(date +%s)
    INFOFLOW_INJECT_FAULT="1:scoring" timeout 60 "$mpiexec" -n 2 --oversubscribe \
        -x INFOFLOW_INJECT_FAULT "$bin" --config configs/demo.toml --set model.threads=1 \
        > "$tmp/out.txt" 2>&1
    rc=$?
    took=$(( $(date +%s) - start ))
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
*) fail "unknown case $case_name" ;;
esac
