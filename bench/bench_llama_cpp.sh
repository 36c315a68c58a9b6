#!/usr/bin/env bash
# This engine against llama.cpp on the same CPU, in one job, measured interleaved (ours, peer,
# ours, peer, ... for every cell) so that both see the same machine load:
#   - decode: `--gen` tokens after `--ctx` context tokens on the shipped Q4_1 file
#     (ours: build/bench_prefill --decode; peer: llama-bench -p 0 -n GEN -d CTX, flash attention
#     on and off);
#   - prefill at each of `--lengths` (ours: bench_prefill, native weights; peer: llama-bench
#     -p N -n 0 on an F16 copy of the file and on the Q4_1 file, each with flash attention on and
#     off: which is fastest depends on the CPU and the length, e.g. off wins at 2-4K tokens on an
#     AMX Xeon).
# Every ratio is against the peer's fastest variant for the cell, which the table names.
# The peer is built by bench/build_llama_cpp.sh (vendored llama.cpp of llama-cpp-python's source
# distribution; nothing of it is committed). Prints a table (median and min..max over the
# rounds, ratio ours / peer) and one JSON line per cell; --out also writes them to a file.
#
# KV cache: llama.cpp keeps f16 (its default; llama-bench takes no f32 cache); ours keeps `--kv`
# (model.kv_dtype through bench_prefill --kv-dtype): f16 by default, the same type as the peer,
# or f32, our exact reference.
#
#   bench/bench_llama_cpp.sh [--build DIR] [--model PATH] [--threads 1,2] [--rounds 3]
#                            [--ctx 360] [--gen 64] [--lengths 512,2048,4096] [--kv f16|f32]
#                            [--no-prefill] [--no-decode] [--out FILE]
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
build=$repo/build
model=$repo/models/SmolLM2-135M-Instruct.Q4_1.gguf
threads=1,2
rounds=3
ctx=360
gen=64
lengths=512,2048,4096
do_prefill=1
do_decode=1
kv=f16
out=
while [[ $# -gt 0 ]]; do
    case $1 in
        --build) build=$2; shift 2 ;;
        --model) model=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --ctx) ctx=$2; shift 2 ;;
        --gen) gen=$2; shift 2 ;;
        --lengths) lengths=$2; shift 2 ;;
        --kv) kv=$2; shift 2 ;;
        --no-prefill) do_prefill=0; shift ;;
        --no-decode) do_decode=0; shift ;;
        --out) out=$2; shift 2 ;;
        *) echo "bench_llama_cpp.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[[ $kv == f16 || $kv == f32 ]] || { echo "bench_llama_cpp.sh: --kv must be f16 or f32" >&2; exit 2; }
ours=$build/bench_prefill
[[ -x $ours ]] || { echo "bench_llama_cpp.sh: $ours not built" >&2; exit 1; }
[[ -f $model ]] || { echo "bench_llama_cpp.sh: model $model missing (launch/setup.sh)" >&2; exit 1; }
peer=$("$repo/bench/build_llama_cpp.sh" --dir "$build/llama_cpp_peer" | tail -n 1)
work=$build/llama_cpp_peer/models
mkdir -p "$work"
f16=$work/$(basename "${model%.gguf}").F16.gguf
if [[ ! -f $f16 ]]; then
    # Requantizing the file's blocks to F16 is exact (every Q4_1/Q8_0 value is an F16 value
    # times a small integer plus a minimum; F16 holds them to its 11-bit precision).
    "$peer/llama-quantize" --allow-requantize "$model" "$f16.part" F16 > "$work/quantize.log" 2>&1
    mv "$f16.part" "$f16"
fi

raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
IFS=, read -r -a tlist <<< "$threads"
IFS=, read -r -a nlist <<< "$lengths"
# Both run with their default thread wait policy: OMP_WAIT_POLICY=passive (launch/mpirun.sh's
# default for oversubscribed ranks) halves either engine's 2-thread decode, llama.cpp's included.
unset OMP_WAIT_POLICY
# One record per measurement: kind n threads who variant tokens_per_s
for ((r = 1; r <= rounds; r++)); do
    for t in "${tlist[@]}"; do
        if [[ $do_decode == 1 ]]; then
            v=$("$ours" --model "$model" --decode "$ctx" --gen "$gen" --threads "$t" --runs 1 \
                --warmup 1 --kv-dtype "$kv" | python3 -c 'import sys,json
for l in sys.stdin:
    if l.startswith("{"): print(json.loads(l)["tokens_per_s"])')
            echo "decode $ctx $t ours native $v" >> "$raw"
            for fa in 1 0; do
                v=$("$peer/llama-bench" -m "$model" -p 0 -n "$gen" -d "$ctx" -fa "$fa" -t "$t" \
                    -r 1 -o jsonl -ctk f16 -ctv f16 \
                    2>/dev/null | python3 -c 'import sys,json
for l in sys.stdin:
    if l.startswith("{"): print(json.loads(l)["avg_ts"])')
                echo "decode $ctx $t llama.cpp q4_1_fa$fa $v" >> "$raw"
            done
            echo "[round $r] decode t=$t done" >&2
        fi
        if [[ $do_prefill == 1 ]]; then
            for n in "${nlist[@]}"; do
                v=$("$ours" --model "$model" --lengths "$n" --threads "$t" --runs 1 --warmup 1 \
                    --no-ops --kv-dtype "$kv" | python3 -c 'import sys,json
for l in sys.stdin:
    if l.startswith("{"): print(json.loads(l)["tokens_per_s"])')
                echo "prefill $n $t ours native $v" >> "$raw"
                for variant in f16_fa1 f16_fa0 q4_1_fa1 q4_1_fa0; do
                    m=$model
                    [[ $variant == f16_* ]] && m=$f16
                    v=$("$peer/llama-bench" -m "$m" -p "$n" -n 0 -fa "${variant##*_fa}" -t "$t" \
                        -r 1 -o jsonl -ctk f16 -ctv f16 \
                        2>/dev/null | python3 -c 'import sys,json
for l in sys.stdin:
    if l.startswith("{"): print(json.loads(l)["avg_ts"])')
                    echo "prefill $n $t llama.cpp $variant $v" >> "$raw"
                done
                echo "[round $r] prefill n=$n t=$t done" >&2
            done
        fi
    done
done

python3 - "$raw" "$rounds" "$kv" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)" \
    "$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_vnni|avx512_bf16)$' | xargs)" \
    "$(lscpu 2>/dev/null | sed -n 's/^\(L[23]\) cache: *\(.*\)/\1 \2/p' | paste -sd, - | sed 's/,/, /g')" \
    <<'PY' | tee ${out:+"$out"}
import json, statistics, sys
from collections import defaultdict
raw, rounds, kv, cpu, flags, caches = sys.argv[1:7]
rounds = int(rounds)
# The cache sizes go with the CPU line: whether a token's weights (~100 MB) stay in the last-level
# cache or stream from memory changes decode speed, and the model name alone does not say it.
if caches:
    flags = f"{flags}; {caches}"
cells = defaultdict(list)
for line in open(raw):
    kind, n, t, who, variant, v = line.split()
    cells[(kind, int(n), int(t), who, variant)].append(float(v))
print(f"CPU: {cpu} ({flags}); {rounds} interleaved rounds; KV cache: ours {kv}, llama.cpp f16; "
      "tokens/s median [min..max]")
print(f"{'kind':8} {'tokens':>6} {'thr':>3} {'ours native':>22} {'llama.cpp':>22} {'variant':>9} {'ratio':>6}")
print("(variant: the peer's weights and flash attention, fa1 on, fa0 off)")
lines = []
keys = sorted({(k, n, t) for (k, n, t, _, _) in cells})
for kind, n, t in keys:
    o = cells.get((kind, n, t, "ours", "native"), [])
    peers = {v: x for (k2, n2, t2, who, v), x in cells.items()
             if (k2, n2, t2, who) == (kind, n, t, "llama.cpp")}
    if not o or not peers:
        continue
    om = statistics.median(o)
    # The peer's best variant is the bar.
    best = max(peers, key=lambda v: statistics.median(peers[v]))
    for v, x in sorted(peers.items(), key=lambda item: item[0] != best):
        pm = statistics.median(x)
        mark = "*" if v == best else " "
        print(f"{kind:8} {n:6d} {t:3d} {om:9.1f} [{min(o):6.1f}..{max(o):6.1f}] "
              f"{pm:9.1f} [{min(x):6.1f}..{max(x):6.1f}] {v:>8}{mark} {om / pm:6.2f}")
        lines.append({"bench": "vs_llama_cpp", "kind": kind, "tokens": n, "threads": t,
                      "ours_tokens_per_s": round(om, 2), "ours_min": min(o), "ours_max": max(o),
                      "peer": "llama.cpp", "peer_variant": v, "peer_best": v == best,
                      "peer_tokens_per_s": round(pm, 2), "peer_min": min(x), "peer_max": max(x),
                      "ratio": round(om / pm, 3), "rounds": len(o), "kv_dtype": kv})
print("(* = llama.cpp's fastest variant for the cell, the one the ratio target refers to)")
for l in lines:
    print(json.dumps(l, separators=(",", ":")))
PY
