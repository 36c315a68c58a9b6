#!/usr/bin/env bash
# Runs one libFuzzer target of tests/fuzz/ under ASan/UBSan for a given time:
#   launch/fuzz.sh TARGET SECONDS [extra libFuzzer flags]
# TARGET: gguf | safetensors | tokenizer_json | tokenizer_encode | config | serve_request (or
# "list").
# Builds the target first if needed, in the sanitizer build (INFOFLOW_SAN_BUILD_DIR, default
# build-san/, clang, INFOFLOW_FUZZ=ON). New inputs go to BUILD/fuzz-corpus/TARGET (the committed
# seeds in tests/fuzz/corpus/TARGET stay as they are); a crash is saved to
# BUILD/fuzz-artifacts/TARGET/ and makes this script exit non-zero.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
targets=(gguf safetensors tokenizer_json tokenizer_encode config serve_request)
target="${1:?usage: launch/fuzz.sh TARGET SECONDS (targets: ${targets[*]})}"
if [ "$target" = "list" ]; then
    printf '%s\n' "${targets[@]}"
    exit 0
fi
seconds="${2:?usage: launch/fuzz.sh TARGET SECONDS}"
shift 2
case " ${targets[*]} " in
*" $target "*) ;;
*) echo "fuzz.sh: unknown target '$target' (targets: ${targets[*]})" >&2; exit 2 ;;
esac
build="${INFOFLOW_SAN_BUILD_DIR:-$root/build-san}"
bin="$build/fuzz_$target"
if [ ! -x "$bin" ] || [ "${INFOFLOW_FUZZ_REBUILD:-1}" = "1" ]; then
    if [ ! -f "$build/CMakeCache.txt" ]; then
        "$root/launch/test-sanitizers.sh" --configure-only
    fi
    cmake --build "$build" -j "${INFOFLOW_JOBS:-2}" --target "fuzz_$target" > "$build.fuzz-build.log" 2>&1 \
        || { cat "$build.fuzz-build.log" >&2; exit 1; }
fi
work="$build/fuzz-corpus/$target"
artifacts="$build/fuzz-artifacts/$target"
mkdir -p "$work" "$artifacts"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
echo "[fuzz] $target for $seconds s (corpus $work + tests/fuzz/corpus/$target)"
# -timeout: one input taking > 10 s is a hang; -rss_limit_mb: an input must not make the reader
# allocate unbounded memory; -max_len: seeds are small, so are mutations.
exec "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "$@" "$work" "$root/tests/fuzz/corpus/$target"
