#!/usr/bin/env bash
# Every CPU test executable that CMakeLists.txt defines runs in CI's sanitizer stage: each one must
# be named in .ci/run's INFOFLOW_SAN_TARGETS (the MPI ones as NAME:N). The GPU executables and
# tests_comm_nccl (built only with NCCL, which the sanitizer build leaves off) are not CPU tests.
#   check_ci_sanitizer_list.sh SOURCE_DIR
set -euo pipefail
src="${1:?usage: check_ci_sanitizer_list.sh SOURCE_DIR}"
defined=$( {
    grep -oE '^\s*infoflow_tests\(([a-z_]+)' "$src/CMakeLists.txt" | sed -E 's/.*\(/tests_/'
    grep -oE 'add_executable\((tests_[a-z_]+)' "$src/CMakeLists.txt" | sed -E 's/.*\(//'
} | grep -vE '^tests_(gpu|comm_nccl)' | sort -u)
listed=$(sed -n '/INFOFLOW_SAN_TARGETS=/,/launch\/test-sanitizers.sh/p' "$src/.ci/run" \
    | grep -oE 'tests_[a-z_]+' | sort -u)
missing=$(comm -23 <(echo "$defined") <(echo "$listed"))
if [ -n "$missing" ]; then
    echo "FAIL: CPU test executables not run by CI's sanitizer stage (.ci/run INFOFLOW_SAN_TARGETS):"
    echo "$missing"
    exit 1
fi
echo "ok: $(echo "$defined" | wc -l) CPU test executables, all in .ci/run's sanitizer list"
