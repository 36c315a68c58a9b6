#!/usr/bin/env bash
# CTest case docs_config_reference: docs/config.md must be what the binary generates from the
# config loader's field table, so the reference cannot drift from the keys the loader accepts.
#   check_config_reference.sh BIN DOCS_CONFIG_MD
set -uo pipefail
bin="$1"; committed="$2"
tmp="$(mktemp)"
trap 'rm -f "$tmp"' EXIT
"$bin" --print-config-reference > "$tmp" || { echo "FAIL: $bin --print-config-reference failed"; exit 1; }
if ! diff -u "$committed" "$tmp"; then
    echo "FAIL: docs/config.md is out of date with the config table (diff above: - committed, + generated)."
    echo "Regenerate it from the repository root with:"
    echo "    build/infoflow_sp --print-config-reference > docs/config.md"
    exit 1
fi
echo "ok: docs/config.md matches infoflow_sp --print-config-reference"
