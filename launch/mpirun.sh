#!/usr/bin/env bash
# mpirun with the flags this kind of machine needs: OpenMPI refuses to run as root and to start
# more ranks than cores unless told to. Usage: launch/mpirun.sh -np 4 build/infoflow_sp --config ...
#
# An interrupted job exits like an interrupted process: 130 after SIGINT, 143 after SIGTERM
# (plain mpirun exits 1 whatever the signal, so a script could not tell Ctrl-C from a failure).
# The signal is passed on to mpirun, which ends the ranks; each prints "[rank r/P] interrupted".
set -uo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Idle ranks yield the core instead of spinning (ranks may outnumber cores here).
export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
# In the background so that this script's traps run while mpirun is alive; stdin stays the
# caller's (a background job would otherwise read /dev/null).
mpirun --oversubscribe --bind-to none "$@" <&0 &
pid=$!
sig=""
trap 'sig=130; kill -INT "$pid" 2>/dev/null' INT
trap 'sig=143; kill -TERM "$pid" 2>/dev/null' TERM
while :; do
    wait "$pid"
    rc=$?
    # wait returns early (status > 128) when a trap ran; go on waiting until mpirun is gone.
    kill -0 "$pid" 2>/dev/null || break
done
if [ -n "$sig" ]; then exit "$sig"; fi
exit "$rc"
