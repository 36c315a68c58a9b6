#!/usr/bin/env bash
# Set up, build, and answer the default question of configs/demo.toml with SmolLM2 on the CPU,
# InfoFlow KV over 2 MPI ranks (one thread each). Prints each step, the phases as they run, the
# answer and the config's reference answer. Extra arguments go to infoflow_sp, e.g.
#   launch/demo.sh --set request.question="What is the capital of France?"
# INFOFLOW_RANKS=N changes the rank count.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
echo "[demo] 1/3 set-up: Debian packages and the model (launch/setup.sh)"
"$root/launch/setup.sh"
echo "[demo] 2/3 build infoflow_sp (launch/build.sh; launch/test.sh builds and runs the tests)"
INFOFLOW_BUILD_QUIET="${INFOFLOW_BUILD_QUIET:-1}" INFOFLOW_BUILD_TARGET=infoflow_sp \
    "$root/launch/build.sh"
ranks="${INFOFLOW_RANKS:-2}"
echo "[demo] 3/3 answer configs/demo.toml on $ranks MPI ranks"
cd "$root"
exec "$root/launch/mpirun.sh" -np "$ranks" \
    "${INFOFLOW_BUILD_DIR:-$root/build}/infoflow_sp" --config configs/demo.toml \
    --set model.threads=1 "$@"
