#!/usr/bin/env bash
# Watchdog tests (docs/design.md §11, label gpu): what cannot complete must end the job at its
# deadline with a rank-tagged message, not hang. Two children of tests_gpu_nccl, each with a 1 s
# deadline, each printing "child: ready" on stderr just before the step that must time out:
#   --watchdog-child      an all_reduce stuck behind a 5 s host function on its stream;
#   --init-timeout-child  NCCL's initialization of 2 ranks of which one never arrives.
# Each must exit non-zero, naming what timed out, within 4.5 s of its ready line. The clock starts
# at that line, not at the launch: CUDA context creation, a cold libnccl load and NCCL's own start
# on a fresh machine can take seconds before the deadline even starts. Exit 77 (skip) where the
# children find no GPU. INFOFLOW_WATCHDOG_LIMIT_S replaces the 4.5 s (for the script's own test,
# tests/gpu_nccl/check_watchdog_script.sh, which runs it on a stand-in child).
#   run_watchdog_test.sh TESTS_GPU_NCCL
set -u
. "$(dirname "${BASH_SOURCE[0]}")/../clock.sh"
prog=${1:?usage: run_watchdog_test.sh TESTS_GPU_NCCL}
limit=${INFOFLOW_WATCHDOG_LIMIT_S:-4.5}
err=$(mktemp)
trap 'rm -f "$err"' EXIT

# run_child FLAG WANT: runs the child, times it from its ready line; 0 when it passed.
run_child() {
    local flag="$1" want="$2" pid rc t_ready="" t_end
    : > "$err"
    timeout -k 5 60 "$prog" "$flag" > /dev/null 2> "$err" &
    pid=$!
    while kill -0 "$pid" 2> /dev/null; do
        if [ -z "$t_ready" ] && grep -q '^child: ready$' "$err"; then t_ready=$(mono_s); fi
        sleep 0.01
    done
    wait "$pid"
    rc=$?
    t_end=$(mono_s)
    if [ "$rc" -eq 77 ]; then
        echo "$flag: no GPU: skipped"
        return 77
    fi
    cat "$err"
    local ok=1
    if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "FAIL ($flag): exit status $rc (0: returned; 124/137: hung until the test's limit)"
        ok=0
    fi
    if ! grep -qF -- "$want" "$err"; then
        echo "FAIL ($flag): stderr lacks: $want"
        ok=0
    fi
    if [ -z "$t_ready" ]; then
        echo "FAIL ($flag): the child never printed its ready line"
        return 1
    fi
    local secs
    secs=$(awk -v a="$t_ready" -v b="$t_end" 'BEGIN { printf "%.2f", b - a }')
    if awk -v s="$secs" -v l="$limit" 'BEGIN { exit !(s >= l) }'; then
        echo "FAIL ($flag): took $secs s after its ready line (the deadline is 1 s)"
        ok=0
    fi
    [ "$ok" -eq 1 ] && echo "PASS ($flag): ended $secs s after its ready line, exit status $rc"
    [ "$ok" -eq 1 ]
}

run_child --watchdog-child \
    "[rank 0/1] error: NCCL all_reduce in phase watchdog_test did not complete within 1 s"
rc1=$?
[ "$rc1" -eq 77 ] && exit 77
run_child --init-timeout-child \
    "[rank 0/2] error: communicator 'nccl': NCCL initialization (ncclCommInitRankConfig) did not complete within parallel.startup_timeout_s = 1 s"
rc2=$?
[ "$rc1" -eq 0 ] && [ "$rc2" -eq 0 ]
