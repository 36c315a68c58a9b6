#!/usr/bin/env bash
# The NCCL communicator's start-up on 2 MPI ranks where no CUDA device exists (labels cpu, mpi):
# infoflow_sp with parallel.comm = "nccl" must stop every rank promptly, non-zero, with the
# rank-tagged "no CUDA device visible" error from the collective start-up check -- no rank may be
# left waiting for the NCCL id. Skipped (77) where a device is visible (the GPU tests cover it).
#   run_nodevice_test.sh INFOFLOW_SP MPIEXEC TESTS_GPU_NCCL
set -u
. "$(dirname "${BASH_SOURCE[0]}")/../clock.sh"
bin=${1:?usage: run_nodevice_test.sh INFOFLOW_SP MPIEXEC TESTS_GPU_NCCL}
mpiexec=${2:?}
probe=${3:?}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
"$probe" > /dev/null 2>&1
if [ $? -ne 77 ]; then
    echo "a CUDA device is visible: skipped"
    exit 77
fi
err=$(mktemp)
trap 'rm -f "$err"' EXIT
t0=$(mono_i)
timeout -k 5 60 "$mpiexec" -n 2 --oversubscribe "$bin" --config "$root/configs/demo.toml" \
    --set parallel.comm=nccl > /dev/null 2> "$err"
rc=$?
t1=$(mono_i)
cat "$err"
ok=1
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "FAIL: exit status $rc (0: started without a device; 124/137: a rank hung)"
    ok=0
fi
if ! grep -qE "^\[rank [01]/2\] error: communicator 'nccl': rank 0 on host .*: no CUDA device visible" "$err"; then
    echo "FAIL: stderr lacks the rank-tagged 'no CUDA device visible' error"
    ok=0
fi
[ "$ok" -eq 1 ] && echo "PASS: every rank stopped after $((t1 - t0)) s with exit status $rc"
[ "$ok" -eq 1 ]
