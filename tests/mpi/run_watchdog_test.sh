#!/usr/bin/env bash
# End-to-end fault tests of the watchdog, the model identity check and the signal handling
# (docs/design.md §11) on real mpirun jobs of infoflow_sp with the real model:
#   run_watchdog_test.sh BIN MPIEXEC VARIANT_WRITER CASE
# CASE: stop_scoring   - rank 1 stops itself (SIGSTOP) entering scoring; with
#                        parallel.timeout_s = 5 every process must be gone within 5 + 10 s,
#                        non-zero, rank 0 naming rank 1 and scoring
#       stop_recompute - the same in recompute
#       model_diff     - rank 1 runs in a directory whose models/ holds a file with the same
#                        shapes but other weights (written by VARIANT_WRITER); the job must stop
#                        at start-up naming both ranks and both files
#       sigint         - SIGINT to mpirun mid-run: every rank prints "[rank r/P] interrupted",
#                        the job ends non-zero, and --out is not written (not even partially);
#                        SIGINT / SIGTERM to a single process, or to launch/mpirun.sh:
#                        exit 130 / 143
#       bad_out        - an unwritable --out is refused before the run (within seconds, not
#                        after the computation)
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../clock.sh"
bin="$1"; mpiexec="$2"; writer="$3"; case_name="$4"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMP_WAIT_POLICY=passive
fail() { echo "FAIL: $*"; exit 1; }
model="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$model" ] || fail "model file $model missing (run launch/setup.sh)"

# stop PHASE: rank 1 stops entering PHASE; checks the watchdog ends the job.
stop_case() {
    local phase=$1 timeout_s=5
    local t0 rc took
    # The clock starts when rank 1 stops: the job's own start-up (model load) is not counted.
    t0=$(mono_s)
    INFOFLOW_INJECT_FAULT="1:$phase:stop" timeout -k 5 120 "$mpiexec" -n 2 --oversubscribe \
        -x INFOFLOW_INJECT_FAULT "$bin" --config configs/demo.toml --set model.threads=1 \
        --set parallel.timeout_s=$timeout_s --out "$tmp/r.json" > "$tmp/out.txt" 2>&1 &
    local job=$!
    # Wait until rank 1 is stopped (state T), then time the rest.
    local stopped=""
    for _ in $(seq 1 600); do
        for p in $(pgrep -f -- "--out $tmp/r.json" || true); do
            if [ "$(ps -o stat= -p "$p" 2>/dev/null | cut -c1)" = "T" ]; then stopped=$p; fi
        done
        [ -n "$stopped" ] && break
        kill -0 "$job" 2>/dev/null || break
        sleep 0.1
    done
    [ -n "$stopped" ] || { cat "$tmp/out.txt"; fail "rank 1 never stopped in $phase"; }
    t0=$(mono_s)
    wait "$job"
    rc=$?
    took=$(python3 -c "print(round($(mono_s) - $t0, 1))")
    cat "$tmp/out.txt"
    [ "$rc" -ne 0 ] || fail "the job exited 0 with a stopped rank"
    [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "the job hung (killed by timeout)"
    python3 -c "import sys; sys.exit(0 if $took <= $timeout_s + 10 else 1)" \
        || fail "took $took s after the stop (limit $timeout_s + 10 s)"
    grep -qF "[rank 0/2] error: rank 1 did not reach $phase/" "$tmp/out.txt" \
        || fail "no message naming rank 1 and phase $phase"
    grep -qF "within $timeout_s s" "$tmp/out.txt" || fail "message lacks the deadline"
    # The stopped rank is ended by Open MPI's SIGTERM/SIGKILL after the abort; give a loaded
    # machine up to 10 s to reap it.
    for _ in $(seq 1 100); do
        kill -0 "$stopped" 2>/dev/null || break
        sleep 0.1
    done
    ! kill -0 "$stopped" 2>/dev/null || { kill -KILL "$stopped"; fail "stopped rank left behind"; }
    [ ! -e "$tmp/r.json" ] || fail "--out written by a failed job"
    echo "ok: rank 1 stopped in $phase; job ended rc=$rc $took s after the stop"
}

case "$case_name" in
stop_scoring) stop_case scoring ;;
stop_recompute) stop_case recompute ;;
model_diff)
    mkdir -p "$tmp/a/models" "$tmp/b/models"
    ln -s "$model" "$tmp/a/models/m.gguf"
    "$writer" "$model" "$tmp/b/models/m.gguf" || fail "cannot write the model variant"
    cfg="$root/configs/demo.toml"
    start=$(mono_i)
    timeout -k 5 120 "$mpiexec" --oversubscribe -n 1 -wdir "$tmp/a" "$bin" --config "$cfg" \
        --set model.path=models/m.gguf --set model.threads=1 : \
        -n 1 -wdir "$tmp/b" "$bin" --config "$cfg" --set model.path=models/m.gguf \
        --set model.threads=1 > "$tmp/out.txt" 2>&1
    rc=$?
    cat "$tmp/out.txt"
    [ "$rc" -ne 0 ] || fail "ranks with different weights were accepted"
    [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "job hung"
    grep -qF "the model differs across ranks" "$tmp/out.txt" || fail "no model-identity error"
    grep -qF "rank 0 on" "$tmp/out.txt" && grep -qF "rank 1 on" "$tmp/out.txt" \
        || fail "error does not name both ranks"
    grep -qF "$(realpath "$model")" "$tmp/out.txt" || fail "error does not name rank 0's file"
    grep -qF "$tmp/b/models/m.gguf" "$tmp/out.txt" || fail "error does not name rank 1's file"
    echo "ok: rejected at start-up in $(( $(mono_i) - start )) s"
    ;;
sigint)
    # wait_or_kill PID LIMIT: waits up to LIMIT s for PID to end; returns its status, 137 if
    # it had to be killed.
    wait_or_kill() {
        local pid=$1 limit=$2
        for _ in $(seq 1 $((limit * 10))); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
        wait "$pid"
    }
    long=(--config configs/demo.toml --set model.threads=1 --set job=bench-ttft
          --set 'bench.lengths=[1024]' --set bench.runs=100 --out "$tmp/r.json")
    # 1. SIGINT to mpirun: it passes SIGTERM to the ranks; each prints one line and exits 143.
    "$mpiexec" -n 2 --oversubscribe "$bin" "${long[@]}" > "$tmp/out.txt" 2>&1 &
    job=$!
    sleep 12
    kill -0 "$job" 2>/dev/null || { cat "$tmp/out.txt"; fail "the job ended before the signal"; }
    kill -INT "$job"
    start=$(mono_i)
    wait_or_kill "$job" 60
    rc=$?
    cat "$tmp/out.txt"
    [ "$rc" -ne 0 ] || fail "an interrupted job exited 0"
    [ "$rc" -ne 137 ] || fail "the job did not end within 60 s of SIGINT"
    grep -qE "^\[rank 0/2\] interrupted" "$tmp/out.txt" || fail "no 'interrupted' line of rank 0"
    grep -qE "^\[rank 1/2\] interrupted" "$tmp/out.txt" || fail "no 'interrupted' line of rank 1"
    ls -a "$tmp" | grep -q "r.json" && fail "a result file (or its temp file) was left behind"
    echo "ok: mpirun interrupted, rc=$rc, $(( $(mono_i) - start )) s after SIGINT, no --out"
    # signal_job WHAT SIG WAIT LINE CMD...: starts CMD, sends SIG after WAIT s, and checks the
    # exit code (130 for SIGINT, 143 for SIGTERM), the line LINE (a regex) and that no result
    # file was left behind.
    signal_job() {
        local what=$1 sig=$2 wait_s=$3 line=$4
        shift 4
        "$@" > "$tmp/out1.txt" 2>&1 &
        local job=$!
        sleep "$wait_s"
        kill -0 "$job" 2>/dev/null || { cat "$tmp/out1.txt"; fail "$what: the job ended early"; }
        kill -"$sig" "$job"
        wait_or_kill "$job" 60
        local rc=$?
        cat "$tmp/out1.txt"
        local want
        want=$([ "$sig" = INT ] && echo 130 || echo 143)
        [ "$rc" -eq "$want" ] || fail "$what, SIG$sig: exit $rc, expected $want"
        grep -qE "$line" "$tmp/out1.txt" || fail "$what, SIG$sig: no line '$line'"
        ls -a "$tmp" | grep -q "r.json" && fail "$what, SIG$sig: a result file was left behind"
        echo "ok: SIG$sig to $what: exit $rc"
    }
    for sig in INT TERM; do
        # 2. One process, no launcher.
        signal_job "one process" "$sig" 6 "^\[rank 0/1\] interrupted \(SIG$sig\)$" \
            "$bin" "${long[@]}"
        # 3. The project's launcher, launch/mpirun.sh (plain mpirun exits 1 for both signals). A
        # background job of a script starts with SIGINT ignored and bash cannot trap a signal
        # ignored at entry, so python3 restores the default first, as a terminal's foreground
        # job has it.
        signal_job "launch/mpirun.sh" "$sig" 12 "^\[rank 1/2\] interrupted" python3 -c \
            'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])' \
            launch/mpirun.sh -np 2 "$bin" "${long[@]}"
    done
    ;;
bad_out)
    start=$(mono_i)
    "$mpiexec" -n 2 --oversubscribe "$bin" --config configs/demo.toml --set model.threads=1 \
        --out "$tmp/no_such_dir/r.json" > "$tmp/out.txt" 2>&1
    rc=$?
    took=$(( $(mono_i) - start ))
    cat "$tmp/out.txt"
    [ "$rc" -ne 0 ] || fail "an unwritable --out was accepted"
    grep -qF "[rank 0/2] error: --out / output.path: cannot write '$tmp/no_such_dir/r.json'" \
        "$tmp/out.txt" || fail "error does not name the --out path"
    grep -q "answer" "$tmp/out.txt" && fail "the job ran before refusing --out"
    echo "ok: refused in $took s, before the run"
    ;;
*) fail "unknown case $case_name" ;;
esac
