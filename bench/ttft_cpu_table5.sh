#!/usr/bin/env bash
# The paper's Table 5 on CPU nodes (docs/benchmarks.md, "bench-ttft on CPU nodes"): TTFT of one
# rank (`single`), the zigzag ring and InfoFlow with the `kv` exchange, one core per rank, on
# the real SmolLM2 file (configs/bench-ttft-cpu-table5-smollm2.toml), at each length of LENGTHS:
#   real2       launch/mpirun.sh -np 2: the rows single, ring/zigzag, infoflow/kv
#   emul:P:LINK P virtual ranks (bench.emulate_timing) whose collectives follow the link model
#               LINK = shm (one node over MPI: alpha 1 us, beta 8 GB/s) or ib (InfiniBand class:
#               alpha 3 us, beta 12 GB/s), the figures of comm/comm_model.h; rows ring/zigzag
#               and infoflow/kv (single is the real run's)
# Every run sets model.positions to the length (at least 8192): rows past the model's own window
# are timing only, and the table and rows say so.
# Each point is its own process writing OUT/<point>-<length>.json; a point whose JSON exists is
# not run again, so an interrupted table resumes. Then bench/ttft_cpu_table5_report.py writes
# the table, the JSON lines and the plot.
#   bench/ttft_cpu_table5.sh [BUILD_DIR] [OUT_DIR]
# Env: LENGTHS (default "8192 16384"), POINTS (default "real2 emul:2:shm emul:4:shm emul:4:ib
# emul:8:shm emul:8:ib"), RUNS/WARMUP (default 2/1), LONG_RUNS/LONG_WARMUP for lengths past
# 16384 (default 1/0: one 32K single run takes minutes on one core), RESULTS (a directory: the
# report is written there as ttft-cpu-table5-smollm2.{md,jsonl,csv,png}; default: OUT_DIR only),
# EXTRA_SETS (space-separated key=value overrides for every run, e.g. the CI test's
# "model.path=random:tiny chunking.size=128"), CLOCK (default wall; cpu: the emulated points
# read the process's CPU time, bench.clock, so other work on the machine does not inflate
# them; the real 2-rank runs always read the wall clock: run them on an idle machine).
set -euo pipefail
build=${1:-build}
out=${2:-out/ttft-cpu-table5}
lengths=${LENGTHS:-8192 16384}
points=${POINTS:-real2 emul:2:shm emul:4:shm emul:4:ib emul:8:shm emul:8:ib}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
mkdir -p "$out"
config=configs/bench-ttft-cpu-table5-smollm2.toml
export INFOFLOW_PROGRESS=0
for L in $lengths; do
    runs=${RUNS:-2}
    warmup=${WARMUP:-1}
    if [ "$L" -gt 16384 ]; then
        runs=${LONG_RUNS:-1}
        warmup=${LONG_WARMUP:-0}
    fi
    common=(--set "bench.lengths=[$L]" --set bench.runs="$runs" --set bench.warmup="$warmup")
    # Positions up to the length (SmolLM2 has 8192; a smaller model's rows past its own window
    # are marked as well).
    common+=(--set model.positions=$(( L > 8192 ? L : 8192 )))
    for kv in ${EXTRA_SETS:-}; do common+=(--set "$kv"); done
    for p in $points; do
        json="$out/${p//:/-}-$L.json"
        log="$out/${p//:/-}-$L.log"
        if [ -s "$json" ]; then
            echo "[table5] $p at $L: done before ($json)"
            continue
        fi
        case "$p" in
        real2)
            cmd=(launch/mpirun.sh -np 2 "$build/infoflow_sp" --config "$config" "${common[@]}"
                 --set 'bench.rows=["single", "ring/zigzag", "infoflow/kv"]')
            ;;
        emul:*:*)
            P=$(echo "$p" | cut -d: -f2)
            link=$(echo "$p" | cut -d: -f3)
            case "$link" in
            shm) alpha=1 beta=8 ;;
            ib) alpha=3 beta=12 ;;
            *) echo "[table5] $p: unknown link '$link' (shm or ib)" >&2; exit 2 ;;
            esac
            cmd=("$build/infoflow_sp" --config "$config" "${common[@]}"
                 --set bench.emulate_timing=true --set parallel.emulate_ranks="$P"
                 --set bench.link_alpha_us="$alpha" --set bench.link_beta_gbs="$beta"
                 --set bench.clock="${CLOCK:-wall}"
                 --set 'bench.rows=["ring/zigzag", "infoflow/kv"]')
            ;;
        *) echo "[table5] unknown point '$p' (real2 or emul:P:shm|ib)" >&2; exit 2 ;;
        esac
        echo "[table5] $p at $L ($runs runs, $warmup warm-up): ${cmd[*]}"
        start=$(date +%s)
        # The binary writes its JSON only when the run succeeds (whole or not at all).
        if ! "${cmd[@]}" --out "$json" > "$log" 2>&1; then
            tail -n 20 "$log" >&2
            echo "[table5] $p at $L failed (log $log)" >&2
            exit 1
        fi
        grep -E "^ *[0-9]+\*? +(single|ring/zigzag|infoflow/kv) " "$log" | sed 's/^/[table5]   /'
        echo "[table5] $p at $L: $(( $(date +%s) - start )) s"
    done
done
report=(python3 bench/ttft_cpu_table5_report.py "$out")
if [ -n "${RESULTS:-}" ]; then report+=(--results "$RESULTS"); fi
"${report[@]}"
