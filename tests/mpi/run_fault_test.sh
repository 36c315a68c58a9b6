#!/usr/bin/env bash
# Fault tests (docs/design.md §11): a failing rank must end the whole job promptly, non-zero, with a
# rank-tagged message -- no rank may be left waiting in a collective.
#   run_fault_test.sh MPIEXEC FAULT_PROGRAM
# For each mode of tests/mpi/fault_rank_throws.cpp, runs it on 3 ranks (oversubscribed) under a
# 30 s limit and checks: exit status non-zero and not the timeout's, and the expected stderr.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/../clock.sh"
mpiexec=${1:?usage: run_fault_test.sh MPIEXEC FAULT_PROGRAM}
prog=${2:?usage: run_fault_test.sh MPIEXEC FAULT_PROGRAM}
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
np=3
limit=30
failed=0
err=$(mktemp)
trap 'rm -f "$err"' EXIT

# run MODE PATTERN...: every PATTERN (fixed string) must appear in stderr.
run() {
    local mode=$1
    shift
    local t0 t1 rc
    t0=$(mono_i)
    timeout -k 5 "$limit" "$mpiexec" -n "$np" --oversubscribe "$prog" "$mode" >/dev/null 2>"$err"
    rc=$?
    t1=$(mono_i)
    local ok=1
    if [ "$rc" -eq 0 ]; then
        echo "FAIL [$mode]: the job exited 0"; ok=0
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "FAIL [$mode]: the job hung (killed after ${limit} s)"; ok=0
    fi
    for pat in "$@"; do
        if ! grep -qF -- "$pat" "$err"; then
            echo "FAIL [$mode]: stderr lacks '$pat'"; ok=0
        fi
    done
    if [ "$ok" -eq 1 ]; then
        echo "ok   [$mode]: exit $rc after $((t1 - t0)) s, stderr names the failing rank"
    else
        echo "---- stderr of [$mode] ----"; cat "$err"; echo "----"
        failed=1
    fi
}

run abort_job "[rank 1/$np] error: injected failure on rank 1 at step 3"
run unwind "[rank 1/$np] error: an exception left the MPI environment's scope"
run config "[rank 0/$np] error: the configuration differs across ranks: rank 1 differs" \
    "[rank 1/$np] error:" "'feedfacefeedface'"
exit $failed
