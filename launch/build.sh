#!/usr/bin/env bash
# Configure and build into build/ (Release). Extra arguments go to the CMake configure step.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${INFOFLOW_BUILD_DIR:-$root/build}"
jobs="${INFOFLOW_JOBS:-$(nproc)}"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "$@" > "$build.configure.log" 2>&1 || {
    cat "$build.configure.log" >&2
    exit 1
}
sed -n '/infoflow_sp configuration/,/model for tests/p' "$build.configure.log"
cmake --build "$build" -j "$jobs"
