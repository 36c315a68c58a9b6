#!/usr/bin/env bash
# Set up, build, and answer the default question of configs/demo.toml with SmolLM2 on the CPU.
# Extra arguments go to infoflow_sp, e.g. --set request.question="What is the capital of France?"
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/launch/setup.sh" >/dev/null
"$root/launch/build.sh" >/dev/null
cd "$root"
exec "${INFOFLOW_BUILD_DIR:-$root/build}/infoflow_sp" --config configs/demo.toml "$@"
