#!/usr/bin/env bash
# Configure and build into build/ (Release), showing the configuration summary and the build's
# progress. Extra arguments go to the CMake configure step. INFOFLOW_BUILD_DIR and INFOFLOW_JOBS
# choose the directory and the parallelism; INFOFLOW_BUILD_TARGET builds one target (e.g.
# infoflow_sp, skipping the tests); INFOFLOW_BUILD_QUIET=1 shows one line per finished target
# instead of every compile (and the errors of a failing build).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${INFOFLOW_BUILD_DIR:-$root/build}"
jobs="${INFOFLOW_JOBS:-$(nproc)}"
echo "[build] configuring $build (log: $build.configure.log)"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "$@" > "$build.configure.log" 2>&1 || {
    cat "$build.configure.log" >&2
    exit 1
}
sed -n '/infoflow_sp configuration/,/model for tests/p' "$build.configure.log"
echo "[build] compiling with $jobs jobs (the first build takes several minutes; later ones seconds)"
start=$(date +%s)
target=()
if [ -n "${INFOFLOW_BUILD_TARGET:-}" ]; then target=(--target "$INFOFLOW_BUILD_TARGET"); fi
if [ "${INFOFLOW_BUILD_QUIET:-0}" = "1" ]; then
    # One line per finished target (with the percentage), the full log in a file.
    set +e
    cmake --build "$build" -j "$jobs" "${target[@]}" 2>&1 | tee "$build.build.log" \
        | grep --line-buffered -E '^\[ *[0-9]+%\] Built target' | sed -u 's/^/[build]   /'
    rc=${PIPESTATUS[0]}
    set -e
    if [ "$rc" != "0" ]; then
        grep -E 'error|Error' "$build.build.log" | head -n 30 >&2
        echo "[build] failed; full log: $build.build.log" >&2
        exit "$rc"
    fi
else
    cmake --build "$build" -j "$jobs" "${target[@]}"
fi
echo "[build] done in $(( $(date +%s) - start )) s: $build/infoflow_sp"
