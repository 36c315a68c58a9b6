#!/usr/bin/env bash
# Watchdog test (docs/design.md §11, label gpu): a collective that cannot complete must end the job at
# the deadline with a rank-tagged message, not hang. The child (tests_gpu_nccl --watchdog-child)
# blocks its stream with a 5 s host function and calls all_reduce with a 1 s deadline; it must
# exit non-zero, within 4.5 s, naming the operation, the phase and the deadline. Exit 77 (skip)
# where the child finds no GPU.
#   run_watchdog_test.sh TESTS_GPU_NCCL
set -u
. "$(dirname "${BASH_SOURCE[0]}")/../clock.sh"
prog=${1:?usage: run_watchdog_test.sh TESTS_GPU_NCCL}
err=$(mktemp)
trap 'rm -f "$err"' EXIT
t0=$(mono_s)
timeout -k 5 30 "$prog" --watchdog-child >/dev/null 2>"$err"
rc=$?
t1=$(mono_s)
if [ "$rc" -eq 77 ]; then
    echo "no GPU: skipped"
    exit 77
fi
cat "$err"
ok=1
want="[rank 0/1] error: NCCL all_reduce in phase watchdog_test did not complete within 1 s"
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "FAIL: exit status $rc (0: returned; 124/137: hung until the test's limit)"
    ok=0
fi
if ! grep -qF "$want" "$err"; then
    echo "FAIL: stderr lacks: $want"
    ok=0
fi
secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
if awk -v s="$secs" 'BEGIN { exit !(s >= 4.5) }'; then
    echo "FAIL: took $secs s (the deadline is 1 s; the stream unblocks only after 5 s)"
    ok=0
fi
[ "$ok" -eq 1 ] && echo "PASS: watchdog ended the job after $secs s with exit status $rc"
[ "$ok" -eq 1 ]
