#!/usr/bin/env bash
# Set up (packages, model), build, and run the whole test suite (CTest: labels cpu, mpi, slurm,
# gpu). Extra arguments go to ctest (e.g. -L cpu, -R cli_, -LE slurm).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/launch/setup.sh"
"$root/launch/build.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "${INFOFLOW_BUILD_DIR:-$root/build}"
echo "[test] running CTest with ${INFOFLOW_TEST_JOBS:-2} jobs (one line per finished test)"
ctest --output-on-failure -j "${INFOFLOW_TEST_JOBS:-2}" "$@"
