#!/usr/bin/env bash
# The GPU check (docs/gpu.md): one prepared script for a GPU machine that is lent only briefly
# (about 15 minutes in all, one command of at most 10 minutes; nothing installable there, no MPI,
# no network).
#
#   bench/gpu_check.sh --pack [DIR]      here: build for the device machine into build-gpu/
#                                        (CUDA arch 90, no MPI, no HDF5, cudart and OpenBLAS
#                                        static), pack the binaries, the shared libraries they
#                                        need that the device may lack (not cuBLAS/NCCL: the
#                                        device has them), the model file when it fits, and the
#                                        list of GPU tests into DIR (default out/gpu-pack,
#                                        git-ignored), then print the `carry` list.
#   bench/gpu_check.sh [--pack-dir DIR] [--budget SECONDS]
#                                        on the device: every step, each under its own timeout
#                                        and all within the budget (default 540 s), logs and
#                                        JSON under $OUT, the tables and a summary line.
#   bench/gpu_check.sh --dry-run [--build DIR] [--out DIR]
#                                        here (CI): the same steps with the binaries of DIR
#                                        (default build/) on the CPU backend at tiny shapes
#                                        (random:tiny, 256/512 tokens, 2 emulated ranks).
# Steps: the GPU tests (CTest label gpu: op tests, FlashInfer, NCCL, the SmolLM2 cuda-vs-cpu
# model test), bench_gpu_ops (GEMM and attention TFLOP/s), single-GPU `full` TTFT at 8K/16K/32K
# on random:llama-3.1-8b, and the 4-rank table (single, ring, InfoFlow) emulated on the one GPU
# (bench.emulate_timing). Exit status 0: every step ran and (on the device) every target of the
# acceptance list was met; bench/gpu_check_report.py prints which.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
model_name="SmolLM2-135M-Instruct.Q4_1.gguf"
carry_limit=$((60 * 1024 * 1024))  # what travels is 64 MiB in all; leave room for the tree

mode="device"
pack_dir="$root/out/gpu-pack"
build_dir=""
out_dir=""
budget=540
while [ $# -gt 0 ]; do
    case "$1" in
        --pack)
            mode="pack"
            if [ $# -gt 1 ] && [ "${2#--}" = "$2" ]; then pack_dir="$2"; shift; fi ;;
        --dry-run) mode="dry-run" ;;
        --pack-dir) pack_dir="$2"; shift ;;
        --build) build_dir="$2"; shift ;;
        --out) out_dir="$2"; shift ;;
        --budget) budget="$2"; shift ;;
        -h|--help) sed -n '2,25p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$pack_dir" in /*) ;; *) pack_dir="$PWD/$pack_dir" ;; esac

die() { echo "gpu_check.sh: error: $*" >&2; exit 1; }

# The GPU tests of a built build dir as JSON (bench/gpu_check_tests.py).
gpu_test_list() { python3 "$root/bench/gpu_check_tests.py" list "$1" "$root"; }

# ---- --pack -----------------------------------------------------------------------------------
do_pack() {
    local build="${INFOFLOW_GPU_BUILD_DIR:-$root/build-gpu}"
    local launcher=()
    if command -v ccache > /dev/null; then
        launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
    fi
    echo "== configure $build (CUDA arch 90, no MPI, no HDF5, static cudart and OpenBLAS)"
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DINFOFLOW_ENABLE_MPI=OFF -DINFOFLOW_ENABLE_HDF5=OFF -DBLA_STATIC=ON \
        -DINFOFLOW_MODEL_PATH:STRING="models/$model_name" "${launcher[@]}" \
        > "$build.configure.log" 2>&1 || { cat "$build.configure.log" >&2; die "configure failed"; }
    sed -n '/infoflow_sp configuration/,/model for tests/p' "$build.configure.log"
    grep -q 'CUDA *: ON' "$build.configure.log" ||
        echo "warning: CUDA is not enabled in this build: the pack runs on the CPU backend only"

    # Targets: the binary, the executables of the tests labelled gpu, bench_gpu_ops.
    local targets=(infoflow_sp) t
    for t in $(python3 "$root/bench/gpu_check_tests.py" targets "$build"); do targets+=("$t"); done
    cmake --build "$build" --target help > "$build.targets.txt" 2>&1
    grep -q ' bench_gpu_ops$' "$build.targets.txt" && targets+=(bench_gpu_ops)
    echo "== build ${targets[*]}"
    cmake --build "$build" -j "${INFOFLOW_JOBS:-2}" --target "${targets[@]}" || die "build failed"
    local tests_json
    tests_json="$(gpu_test_list "$build")" || die "cannot list the GPU tests of $build"

    local stage
    stage="$(mktemp -d)"
    trap 'rm -rf "$stage"' RETURN
    mkdir -p "$stage/pack/bin" "$stage/pack/lib" "$stage/pack/models"
    for t in "${targets[@]}"; do cp "$build/$t" "$stage/pack/bin/"; done
    echo "$tests_json" > "$stage/pack/gpu_tests.json"
    # Shared libraries: everything ldd names except the C runtime, the C++ runtime (newer on the
    # device) and CUDA's own libraries (the driver, and cuBLAS/NCCL from the device's wheels).
    local skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libmvec|libpthread|libdl|librt|libutil|libstdc\+\+|libgcc_s|libcuda\.|libcudart|libcublas|libcublasLt|libnccl|libnvrtc|libnvJitLink)'
    ldd "$stage"/pack/bin/* 2> /dev/null | awk '/=> \// {print $1, $3}' | sort -u |
        while read -r name path; do
            if ! echo "$name" | grep -Eq "$skip"; then cp -L "$path" "$stage/pack/lib/$name"; fi
        done
    local model="$root/models/$model_name" model_note
    {
        echo "built $(date -u +%FT%TZ) from $(git -C "$root" rev-parse --short HEAD 2> /dev/null)"
        echo "configure: CUDA arch 90, INFOFLOW_ENABLE_MPI=OFF, INFOFLOW_ENABLE_HDF5=OFF, BLA_STATIC=ON"
        echo "binaries: ${targets[*]}"
        echo "libraries: $(ls "$stage/pack/lib" | tr '\n' ' ')"
    } > "$stage/pack/build-info.txt"

    mkdir -p "$pack_dir"
    rm -f "$pack_dir"/*.tar.xz
    tar -C "$stage" -cf - pack | xz -T2 -6 > "$pack_dir/gpu-pack.tar.xz"
    local size model_size
    size=$(stat -c %s "$pack_dir/gpu-pack.tar.xz")
    model_note="not carried: $model does not exist"
    if [ -f "$model" ]; then
        model_size=$(stat -L -c %s "$model")
        if [ $((size + model_size)) -le "$carry_limit" ]; then
            cp -L "$model" "$pack_dir/$model_name"
            model_note="carried ($model_size bytes)"
        else
            model_note="not carried: $model_size bytes + the pack's $size exceed the $carry_limit-byte carry budget"
        fi
    fi
    echo "model: $model_note" >> "$stage/pack/build-info.txt"
    echo "$model_note" > "$pack_dir/model-note.txt"
    cp "$stage/pack/build-info.txt" "$pack_dir/build-info.txt"
    echo
    cat "$pack_dir/build-info.txt"
    echo "pack: $(du -sb "$pack_dir" | cut -f1) bytes in $pack_dir"
    local rel="${pack_dir#"$root"/}"
    echo "carry: [\"$rel\"]"
    echo "device command: bash bench/gpu_check.sh --pack-dir $rel"
}

# ---- steps (device and dry run) ---------------------------------------------------------------
start_s=$(date +%s)
record() {  # name status seconds note [skip_ok]
    python3 -c 'import json, sys
print(json.dumps({"step": sys.argv[1], "status": sys.argv[2], "seconds": float(sys.argv[3]),
                  "note": sys.argv[4], "skip_ok": sys.argv[5] == "1"}))' \
        "$1" "$2" "$3" "$4" "${5:-0}" >> "$OUT/steps.jsonl"
    printf '  %-34s %-8s %7.1f s  %s\n' "$1" "$2" "$3" "$4"
}

# run_step NAME TIMEOUT SKIP_RC CMD...: runs CMD with its output in $OUT/logs/NAME.log.
run_step() {
    local name="$1" limit="$2" skip_rc="$3"
    shift 3
    local left=$((start_s + budget - $(date +%s)))
    if [ "$left" -lt 20 ]; then
        record "$name" "not-run" 0 "budget of ${budget} s spent"
        return
    fi
    [ "$limit" -gt $((left - 10)) ] && limit=$((left - 10))
    local log="$OUT/logs/${name//[^A-Za-z0-9_.-]/_}.log"
    local t0 t1 rc status note=""
    t0=$(date +%s.%N)
    timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    if [ "$rc" -eq 0 ]; then
        status="pass"
    elif [ "$rc" -eq "$skip_rc" ]; then
        status="skip"
        note="exit $rc: $(grep -m1 -io 'no .*device[^.]*' "$log" || echo skipped)"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        status="timeout"
        note="killed after $limit s"
    else
        status="fail"
        note="exit $rc: $(grep -m1 -i 'error' "$log" | cut -c1-160)"
    fi
    record "$name" "$status" "$(awk "BEGIN { print $t1 - $t0 }")" "$note"
}

run_checks() {  # mode bin_dir tests_json model_dir
    local mode="$1" bin="$2" tests_json="$3" model_dir="$4"
    local backend="cuda" model="random:llama-3.1-8b" lengths="[8192,16384,32768]" ranks=4
    local runs=3 warmup=1 t_test=300 t_ttft=200 t_emul=330
    if [ "$mode" = "dry-run" ]; then
        backend="cpu" model="random:tiny" lengths="[256,512]" ranks=2 runs=1 warmup=0
        t_test=120 t_ttft=60 t_emul=60
    fi
    echo "== steps ($mode; budget ${budget} s; logs and JSON in $OUT)"

    # 1. GPU tests, with the source tree and the binaries substituted, from the model's folder.
    local n_tests
    n_tests=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))))' "$tests_json")
    if [ "$n_tests" -eq 0 ]; then
        record "gpu-tests" "skip" 0 "no GPU tests in this build" 1
    fi
    local i
    for ((i = 0; i < n_tests; ++i)); do
        local name skip_rc limit cmd=() envs=()
        name=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[int(sys.argv[2])]["name"])' "$tests_json" "$i")
        skip_rc=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[int(sys.argv[2])]["skip_rc"])' "$tests_json" "$i")
        limit=$(python3 -c 'import json, sys; print(min(int(sys.argv[3]), json.load(open(sys.argv[1]))[int(sys.argv[2])]["timeout"]))' "$tests_json" "$i" "$t_test")
        mapfile -t cmd < <(python3 -c 'import json, sys
t = json.load(open(sys.argv[1]))[int(sys.argv[2])]
for c in t["command"]:
    print(c.replace("{bin}", sys.argv[3]).replace("{src}", sys.argv[4]))' "$tests_json" "$i" "$bin" "$root")
        mapfile -t envs < <(python3 -c 'import json, sys
for e in json.load(open(sys.argv[1]))[int(sys.argv[2])]["env"]: print(e)' "$tests_json" "$i")
        if [[ "$name" == *model* ]] && [ ! -f "$model_dir/models/$model_name" ]; then
            record "test:$name" "not-run" 0 "$(cat "$pack_dir/model-note.txt" 2> /dev/null || echo "no $model_name")"
            continue
        fi
        (cd "$model_dir" && run_step "test:$name" "$limit" "$skip_rc" env "${envs[@]}" "${cmd[@]}")
    done

    # 2. GEMM and attention throughput.
    if [ -x "$bin/bench_gpu_ops" ]; then
        run_step "bench_gpu_ops" 120 77 "$bin/bench_gpu_ops" --runs 20 --warmup 3
        grep -h '^{"bench":"gpu_ops"' "$OUT/logs/bench_gpu_ops.log" > "$OUT/gpu_ops.jsonl" || true
    else
        record "bench_gpu_ops" "skip" 0 "bench_gpu_ops not built (needs CUDA and FlashInfer)" \
            "$([ "$mode" = dry-run ] && echo 1 || echo 0)"
    fi

    # 3. Single-rank full TTFT, then 4. the emulated table.
    local common=(--config "$root/configs/gpu-check.toml" --set "model.backend=\"$backend\""
        --set "model.path=\"$model\"" --set "bench.lengths=$lengths" --set "bench.runs=$runs"
        --set "bench.warmup=$warmup")
    run_step "ttft_single" "$t_ttft" -1 "$bin/infoflow_sp" "${common[@]}" \
        --set 'bench.methods=["full"]' --out "$OUT/ttft_single.json"
    run_step "ttft_emulated_${ranks}ranks" "$t_emul" -1 "$bin/infoflow_sp" "${common[@]}" \
        --set 'bench.methods=["full","ring","infoflow"]' --set "parallel.emulate_ranks=$ranks" \
        --set "bench.emulate_timing=true" --out "$OUT/ttft_emulated.json"

    python3 "$root/bench/gpu_check_report.py" "$OUT" "$mode"
    local rc=$?
    echo "total: $(($(date +%s) - start_s)) s"
    return $rc
}

# Directories holding cuBLAS / NCCL inside the device's python (its PyTorch wheels).
nvidia_lib_dirs() {
    python3 - << 'EOF'
import importlib, os
dirs = []
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
for r in roots:
    for base, _, files in os.walk(r):
        if any(f.startswith(("libcublas.so", "libcublasLt.so", "libnccl.so", "libcudart.so"))
               for f in files):
            dirs.append(base)
print(":".join(sorted(set(dirs))))
EOF
}

case "$mode" in
    pack)
        do_pack
        ;;
    dry-run)
        build_dir="${build_dir:-$root/build}"
        [ -x "$build_dir/infoflow_sp" ] || die "no $build_dir/infoflow_sp: build first (launch/build.sh)"
        OUT="${out_dir:-${OUT:-$(mktemp -d)}}"
        mkdir -p "$OUT/logs"
        : > "$OUT/steps.jsonl"
        gpu_test_list "$build_dir" > "$OUT/gpu_tests.json" || die "cannot list the GPU tests of $build_dir"
        export OMP_WAIT_POLICY=passive
        run_checks dry-run "$build_dir" "$OUT/gpu_tests.json" "$root"
        exit $?
        ;;
    device)
        [ -f "$pack_dir/gpu-pack.tar.xz" ] || die "no $pack_dir/gpu-pack.tar.xz: run bench/gpu_check.sh --pack here first"
        OUT="${out_dir:-${OUT:-$root/out/gpu-check}}"
        mkdir -p "$OUT/logs"
        : > "$OUT/steps.jsonl"
        work="${TMPDIR:-/tmp}/infoflow-gpu-check"
        rm -rf "$work" && mkdir -p "$work" || die "cannot create $work"
        t0=$(date +%s)
        xz -dc "$pack_dir/gpu-pack.tar.xz" | tar -C "$work" -xf - || die "cannot unpack the pack"
        mkdir -p "$work/pack/models"
        [ -f "$pack_dir/$model_name" ] && ln -sf "$pack_dir/$model_name" "$work/pack/models/$model_name"
        echo "unpacked in $(($(date +%s) - t0)) s: $(cat "$work/pack/build-info.txt" | head -1)"
        python3 -c "import nvidia.cublas, nvidia.nccl" 2> "$OUT/logs/python_nvidia.log" &&
            echo "python3: nvidia.cublas and nvidia.nccl import" ||
            echo "warning: python3 -c 'import nvidia.cublas, nvidia.nccl' failed (see logs)"
        nv="$(nvidia_lib_dirs)"
        [ -n "$nv" ] || echo "warning: no cuBLAS/NCCL libraries found under python3's nvidia/ folder"
        export LD_LIBRARY_PATH="$work/pack/lib${nv:+:$nv}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
        command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version \
            --format=csv,noheader | tee "$OUT/device.txt"
        ldd "$work/pack/bin/infoflow_sp" | grep -i 'not found' && echo "warning: missing libraries"
        export OMP_WAIT_POLICY=passive
        run_checks device "$work/pack/bin" "$work/pack/gpu_tests.json" "$work/pack"
        exit $?
        ;;
esac
