#!/usr/bin/env bash
# Set up (packages, model), build, and run the whole test suite (CTest: labels cpu, mpi, gpu).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/launch/setup.sh"
"$root/launch/build.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "${INFOFLOW_BUILD_DIR:-$root/build}"
ctest --output-on-failure -j "${INFOFLOW_TEST_JOBS:-2}" "$@"
