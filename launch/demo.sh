#!/usr/bin/env bash
# Set up, build, and answer the default question of configs/demo.toml with SmolLM2 on the CPU,
# InfoFlow KV over 2 MPI ranks (one thread each). Extra arguments go to infoflow_sp, e.g.
#   launch/demo.sh --set request.question="What is the capital of France?"
# INFOFLOW_RANKS=N changes the rank count.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/launch/setup.sh" >/dev/null
"$root/launch/build.sh" >/dev/null
cd "$root"
exec "$root/launch/mpirun.sh" -np "${INFOFLOW_RANKS:-2}" \
    "${INFOFLOW_BUILD_DIR:-$root/build}/infoflow_sp" --config configs/demo.toml \
    --set model.threads=1 "$@"
