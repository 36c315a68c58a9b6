#!/usr/bin/env bash
# Builds llama.cpp's llama-bench and llama-quantize, the peer of bench/bench_llama_cpp.sh, from the
# source distribution of the Python package llama-cpp-python (its vendored llama.cpp); with
# --server also llama-server, the peer of bench/bench_serve.py. Nothing of it is committed: the
# sources and the build live under --dir (default build/llama_cpp_peer).
#
#   bench/build_llama_cpp.sh [--dir DIR] [--version V] [--jobs N] [--server]
#
# Prints the directory holding the binaries on its last line. Re-running reuses what is there.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
dir=$repo/build/llama_cpp_peer
version=0.3.16
jobs=2
server=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --dir) dir=$2; shift 2 ;;
        --version) version=$2; shift 2 ;;
        --jobs) jobs=$2; shift 2 ;;
        --server) server=1; shift ;;
        *) echo "build_llama_cpp.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
bin=$dir/build/bin
targets=(llama-bench llama-quantize)
[[ $server == 1 ]] && targets+=(llama-server)
have_all=1
for t in "${targets[@]}"; do [[ -x $bin/$t ]] || have_all=0; done
if [[ $have_all == 1 ]]; then
    echo "$bin"
    exit 0
fi

sdist=$dir/llama_cpp_python-$version.tar.gz
if [[ ! -f $sdist ]]; then
    python3 -m pip download --no-binary :all: --no-deps "llama-cpp-python==$version" -d "$dir" >&2
fi
src=$dir/llama_cpp_python-$version
[[ -d $src ]] || tar -xzf "$sdist" -C "$dir"
llama=$src/vendor/llama.cpp
[[ -f $llama/CMakeLists.txt ]] || { echo "build_llama_cpp.sh: no vendored llama.cpp in $sdist" >&2; exit 1; }

# The peer's default CPU build (its own kernels, OpenMP, tuned for this CPU), tools only (and the
# server when asked: it adds no dependency, the HTTP and JSON libraries are vendored).
server_opt=OFF
[[ $server == 1 ]] && server_opt=ON
nice -n 10 cmake -S "$llama" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=$server_opt -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=OFF >&2
nice -n 10 cmake --build "$dir/build" -j "$jobs" --target "${targets[@]}" >&2
echo "$bin"
