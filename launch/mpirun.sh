#!/usr/bin/env bash
# mpirun with the flags this kind of machine needs: OpenMPI refuses to run as root and to start
# more ranks than cores unless told to. Usage: launch/mpirun.sh -np 4 build/infoflow_sp --config ...
set -euo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Idle ranks yield the core instead of spinning (ranks may outnumber cores here).
export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
exec mpirun --oversubscribe --bind-to none "$@"
