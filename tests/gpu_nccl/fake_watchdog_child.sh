#!/usr/bin/env bash
# Stand-in for tests_gpu_nccl's watchdog children, for the test of run_watchdog_test.sh itself
# (check_watchdog_script.sh): sleeps FAKE_STARTUP_S (a slow CUDA and NCCL start), prints the ready
# line, sleeps FAKE_AFTER_S (the deadline and the abort), prints what the real child prints and
# exits 1.
case "${1:-}" in
    --watchdog-child)
        msg="[rank 0/1] error: NCCL all_reduce in phase watchdog_test did not complete within 1 s" ;;
    --init-timeout-child)
        msg="[rank 0/2] error: communicator 'nccl': NCCL initialization (ncclCommInitRankConfig) did not complete within parallel.startup_timeout_s = 1 s (waited 1.0 s): a rank did not arrive or NCCL's bootstrap could not connect" ;;
    *) exit 2 ;;
esac
sleep "${FAKE_STARTUP_S:-0}"
echo "child: ready" >&2
sleep "${FAKE_AFTER_S:-0}"
echo "$msg" >&2
exit 1
