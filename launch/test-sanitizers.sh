#!/usr/bin/env bash
# CI's sanitizer stage: builds everything with clang under AddressSanitizer + UndefinedBehavior-
# Sanitizer (INFOFLOW_SANITIZE via INFOFLOW_FUZZ=ON, which also builds the libFuzzer targets),
# runs the CPU and MPI test suite once under it, then each fuzz target for a short time.
#   launch/test-sanitizers.sh                 (build, tests, fuzz)
#   launch/test-sanitizers.sh --configure-only
# Environment: INFOFLOW_SAN_BUILD_DIR (default build-san/), INFOFLOW_JOBS (default nproc: build
# jobs, and the plain test executables of INFOFLOW_SAN_TARGETS run at once; INFOFLOW_SAN_JOBS
# sets those alone),
# INFOFLOW_FUZZ_SECONDS (per target, default 30; 0 skips fuzzing), INFOFLOW_SAN_TESTS (a CTest
# -R regex to run a subset; default all tests except the GPU ones), INFOFLOW_SAN_LABEL (a CTest
# label, e.g. cpu: only the tests carrying it), INFOFLOW_SAN_TARGETS (a
# space-separated list of test executables: build only those and the fuzz targets, and run each
# of those executables directly instead of the CTest suite; `NAME:N` runs NAME on N MPI ranks,
# the word `demo` runs infoflow_sp on configs/demo.toml on 2 ranks, its answer checked, and
# `serve` runs the server of configs/serve.toml on 2 ranks: a plain and a streamed request with
# curl, then SIGTERM to rank 0, which must drain and exit 0); INFOFLOW_SAN_CATCH_ARGS (default
# "~[heavy]"): the test spec and options given to each of those executables — the cases tagged
# [heavy] (end to end on the real model, 10 s or more in the normal build) run in the normal
# build only, their code reached under the sanitizers by the smaller cases and the demo; "" runs
# every case.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${INFOFLOW_SAN_BUILD_DIR:-$root/build-san}"
jobs="${INFOFLOW_JOBS:-$(nproc)}"
cxx="$(command -v clang++-14 || command -v clang++)"
cc="$(command -v clang-14 || command -v clang)"
t0=$(date +%s)
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_C_COMPILER="$cc" -DINFOFLOW_FUZZ=ON -DINFOFLOW_ENABLE_CUDA=OFF \
    -DINFOFLOW_ENABLE_NCCL=OFF ${INFOFLOW_SAN_CMAKE_ARGS:-} > "$build.configure.log" 2>&1 || {
    cat "$build.configure.log" >&2
    exit 1
}
[ "${1:-}" = "--configure-only" ] && exit 0
san_targets="${INFOFLOW_SAN_TARGETS:-}"
read -r -a catch_args <<< "${INFOFLOW_SAN_CATCH_ARGS-~[heavy]}"
if [ -n "$san_targets" ]; then
    fuzz_targets=$("$root/launch/fuzz.sh" list | sed 's/^/fuzz_/' | tr '\n' ' ')
    # NAME:N -> NAME; demo -> infoflow_sp
    build_targets=$(for t in $san_targets; do t="${t%%:*}"; case "$t" in demo|serve) t=infoflow_sp ;; esac; echo "$t"; done | sort -u | tr '\n' ' ')
    # shellcheck disable=SC2086
    cmake --build "$build" -j "$jobs" --target $build_targets $fuzz_targets fuzz_gen_corpus
else
    cmake --build "$build" -j "$jobs"
fi
t1=$(date +%s)
echo "[sanitizers] build: $((t1 - t0)) s"

# Leaks: only those inside Open MPI and its runtime (allocations it keeps until exit by design)
# are suppressed; a leak in our code fails the run.
# Two things make the Open MPI suppressions match in MPI ranks: its plugins stay mapped until
# exit (tests/sanitizers/keep_dso.c, preloaded: dlclose does nothing), and allocation stacks are
# unwound fully (fast_unwind_on_malloc=0: the frame-pointer unwinder stops inside Open MPI's
# libraries, before the frame that names them).
export LSAN_OPTIONS="suppressions=$root/tests/fuzz/lsan_openmpi.supp:print_suppressions=0"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
keep_dso="$build/libkeep_dso.so"
"$cc" -shared -fPIC -O1 -o "$keep_dso" "$root/tests/sanitizers/keep_dso.c"
mpi_run() {  # mpi_run N EXE ARGS...: EXE on N ranks under the sanitizers
    local n="$1"
    shift
    ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0" LD_PRELOAD="$keep_dso" \
        mpirun --oversubscribe --bind-to none -np "$n" -x ASAN_OPTIONS -x LSAN_OPTIONS \
        -x UBSAN_OPTIONS -x LD_PRELOAD "$@"
}
# The server under the sanitizers: listens, answers a plain and a streamed chat request, and
# drains on SIGTERM to rank 0 with exit code 0 (a sanitizer report would make it non-zero).
serve_smoke() {
    local out="$1" port="" pid0="" body
    (cd "$root" && mpi_run 2 "$build/infoflow_sp" --config configs/serve.toml \
        --set model.threads=1 --set serve.port=0 --set store.path=) > "$out" 2>&1 &
    local job=$!
    for _ in $(seq 1 1200); do
        port=$(sed -nE 's/.*listening on http:\/\/[^:]+:([0-9]+) \(rank 0 pid ([0-9]+);.*/\1/p' "$out")
        pid0=$(sed -nE 's/.*listening on http:\/\/[^:]+:([0-9]+) \(rank 0 pid ([0-9]+);.*/\2/p' "$out")
        [ -n "$port" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:$port/health")" = 200 ] && break
        kill -0 "$job" 2>/dev/null || break
        sleep 0.5
    done
    [ -n "$port" ] || { cat "$out"; echo "[sanitizers] serve: never listened"; return 1; }
    body="$root/configs/data/serve-request.json"  # the README's request: the demo's documents
    curl -sf "localhost:$port/v1/chat/completions" -d @"$body" | grep -q "Colby" \
        || { cat "$out"; echo "[sanitizers] serve: no answer naming Colby"; return 1; }
    python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); j["stream"] = True; print(json.dumps(j))' \
        "$body" | curl -sfN "localhost:$port/v1/chat/completions" -d @- \
        | grep -q "data: \[DONE\]" || { cat "$out"; echo "[sanitizers] serve: no stream"; return 1; }
    kill -TERM "$pid0"
    wait "$job" || { cat "$out"; echo "[sanitizers] serve: exit code $? after SIGTERM"; return 1; }
    grep -E "^\[serve\]|stopped" "$out"
}
# One plain test executable under the sanitizers, its output into $build/san-logs/NAME.txt; exit
# 77 is the executable's own "skipped" (tests_amx_hw without AMX).
run_plain() {
    local t="$1" rc=0 s
    s=$(cut -d' ' -f1 /proc/uptime)
    "./$t" --use-colour no "${catch_args[@]}" > "san-logs/$t.txt" 2>&1 || rc=$?
    if [ "$rc" -eq 77 ]; then
        echo "[sanitizers] $t: skipped (exit 77)"
    elif [ "$rc" -ne 0 ]; then
        cat "san-logs/$t.txt"
        echo "[sanitizers] $t: FAILED (exit $rc)"
        return "$rc"
    fi
    awk -v s="$s" -v t="$t" '{ printf "[sanitizers] %s: %.0f s\n", t, $1 - s }' /proc/uptime
}
(
    cd "$build"
    if [ -n "$san_targets" ]; then
        # The plain executables first, INFOFLOW_SAN_JOBS at a time (default: the cores; each
        # runs its cases on one thread of its own), then the MPI ones, the demo and the server
        # one after another (they start ranks of their own).
        mkdir -p san-logs
        pool="${INFOFLOW_SAN_JOBS:-$jobs}"
        failed=0
        running=0
        for t in $san_targets; do
            case "$t" in demo | serve | *:*) continue ;; esac
            echo "[sanitizers] $t"
            run_plain "$t" &
            running=$((running + 1))
            if [ "$running" -ge "$pool" ]; then
                wait -n || failed=1
                running=$((running - 1))
            fi
        done
        while [ "$running" -gt 0 ]; do
            wait -n || failed=1
            running=$((running - 1))
        done
        [ "$failed" -eq 0 ] || exit 1
        for t in $san_targets; do
            s=$(cut -d' ' -f1 /proc/uptime)
            case "$t" in
            demo)
                echo "[sanitizers] demo: infoflow_sp --config configs/demo.toml on 2 ranks"
                out="$build/san-demo.txt"
                (cd "$root" && mpi_run 2 "$build/infoflow_sp" --config configs/demo.toml \
                    --set model.threads=1) > "$out" 2>&1 || { cat "$out"; exit 1; }
                grep -E "^(answer|reference) " "$out"
                grep -q "match: the answer contains it" "$out" \
                    || { cat "$out"; echo "[sanitizers] demo: the answer does not match"; exit 1; }
                ;;
            serve)
                echo "[sanitizers] serve: configs/serve.toml on 2 ranks, two requests, SIGTERM"
                serve_smoke "$build/san-serve.txt" || exit 1
                ;;
            *:*)
                echo "[sanitizers] ${t%%:*} on ${t##*:} ranks"
                mpi_run "${t##*:}" "./${t%%:*}" --use-colour no "${catch_args[@]}"
                ;;
            *) continue ;;
            esac
            awk -v s="$s" -v t="$t" '{ printf "[sanitizers] %s: %.0f s\n", t, $1 - s }' /proc/uptime
        done
    elif [ -n "${INFOFLOW_SAN_LABEL:-}" ]; then
        ctest --output-on-failure -j "${INFOFLOW_TEST_JOBS:-2}" -L "$INFOFLOW_SAN_LABEL" -LE gpu
    elif [ -n "${INFOFLOW_SAN_TESTS:-}" ]; then
        ctest --output-on-failure -j "${INFOFLOW_TEST_JOBS:-2}" -LE gpu -R "$INFOFLOW_SAN_TESTS"
    else
        ctest --output-on-failure -j "${INFOFLOW_TEST_JOBS:-2}" -LE gpu
    fi
)
t2=$(date +%s)
echo "[sanitizers] test suite: $((t2 - t1)) s"

seconds="${INFOFLOW_FUZZ_SECONDS:-30}"
if [ "$seconds" != "0" ]; then
    for t in $("$root/launch/fuzz.sh" list); do
        log="$build/fuzz-$t.log"
        if ! INFOFLOW_SAN_BUILD_DIR="$build" INFOFLOW_FUZZ_REBUILD=0 \
            "$root/launch/fuzz.sh" "$t" "$seconds" > "$log" 2>&1; then
            tail -n 60 "$log"
            echo "[sanitizers] fuzz target $t failed (log $log)"
            exit 1
        fi
        grep -E "^(#[0-9]+.*DONE|stat::number_of_executed_units|stat::peak_rss_mb)" "$log" \
            | sed "s/^/[fuzz $t] /"
    done
fi
t3=$(date +%s)
echo "[sanitizers] fuzz: $((t3 - t2)) s; total $((t3 - t0)) s"
