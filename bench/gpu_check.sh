#!/usr/bin/env bash
# The GPU check (docs/gpu.md): one prepared script for a GPU machine that is lent only briefly
# (about 15 minutes in all, one command of at most 10 minutes, at most 8 files back from $OUT;
# nothing installable there, no MPI, no network).
#
#   bench/gpu_check.sh --pack [DIR]      here: build for the device machine into build-gpu/
#                                        (CUDA arch 90, no MPI, no HDF5, cudart static),
#                                        pack the binaries, the shared libraries they
#                                        need that the device may lack (not cuBLAS/NCCL: the
#                                        device has them), the model file when it fits, and the
#                                        list of GPU tests into DIR (default out/gpu-pack,
#                                        git-ignored), then print the `carry` list.
#   bench/gpu_check.sh [--pack-dir DIR] [--budget SECONDS]
#                                        on the device: every step, each under its own timeout
#                                        and all within the budget (default 480 s).
#   bench/gpu_check.sh --dry-run [--build DIR] [--out DIR]
#                                        here (CI): the same steps with the binaries of DIR
#                                        (default build/) on the CPU backend at tiny shapes
#                                        (random:tiny, 256/512 tokens, 2 emulated ranks); fails
#                                        if the output folder would hold more than 8 files.
# Steps, the most important evidence first: the GPU op tests against the CPU backend (CTest label
# gpu: ops, FlashInfer), model equality (generated models, the SmolLM2 cuda-vs-cpu test), GEMM
# and attention TFLOP/s (bench_gpu_ops), single-GPU `full` TTFT at 8K/16K/32K on
# random:llama-3.1-8b, the NCCL tests on one rank, then the 4-rank table (ring, InfoFlow)
# emulated on the one GPU; the TTFT steps one per length. Each step has its own timeout; a
# failure or timeout loses that step alone.
# What $OUT holds (4 files): summary.json (every step's status, time and figures, rewritten
# after every step, so a killed run still leaves it), logs.tar.gz (every step's log, rewritten
# after every step) and the TTFT JSONs (ttft_single.json, ttft_emulated.json: the rows of the
# per-length steps so far, merged after every step); the steps' own --out files, CSVs and logs
# stay in a work folder outside $OUT. Exit status 0: every step ran and (on the device) every
# target of the acceptance list was met; the printed table and bench/gpu_check_report.py's
# summary line say which.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
model_name="SmolLM2-135M-Instruct.Q4_1.gguf"
carry_limit=$((60 * 1024 * 1024))  # what travels is 64 MiB in all; leave room for the tree

mode="device"
pack_dir="$root/out/gpu-pack"
build_dir=""
out_dir=""
budget=480
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
        -h|--help) sed -n '2,33p' "${BASH_SOURCE[0]}"; exit 0 ;;
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
    echo "== configure $build (CUDA arch 90, no MPI, no HDF5, static cudart)"
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DINFOFLOW_ENABLE_MPI=OFF -DINFOFLOW_ENABLE_HDF5=OFF \
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
        echo "configure: CUDA arch 90, INFOFLOW_ENABLE_MPI=OFF, INFOFLOW_ENABLE_HDF5=OFF"
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
# $OUT: what comes back (summary.json, logs.tar.gz, ttft_single.json, ttft_emulated.json). $RUN:
# everything else (logs, steps.jsonl, each step's --out and CSV), outside $OUT.
start_s=$(date +%s)
max_out_files=8

# Rewrites $OUT/summary.json and $OUT/logs.tar.gz from what $RUN holds (atomically: a kill in
# the middle leaves the previous versions); returns the report's exit status.
publish() {  # [--final]
    local rc=0
    python3 "$root/bench/gpu_check_report.py" "$OUT" "$RUN" "$mode_name" "$@" > "$RUN/report.txt" \
        2>&1 || rc=$?
    tar -C "$RUN" -czf "$OUT/.logs.tar.gz.part" logs steps.jsonl report.txt 2> /dev/null &&
        mv -f "$OUT/.logs.tar.gz.part" "$OUT/logs.tar.gz"
    return "$rc"
}

json_str() {  # a JSON string literal of $1 (control characters dropped)
    local x="${1//\\/\\\\}"
    x="${x//\"/\\\"}"
    printf '"%s"' "$(printf '%s' "$x" | tr -d '\000-\037')"
}

record() {  # name status seconds note [skip_ok]
    printf '{"step": %s, "status": %s, "seconds": %s, "note": %s, "skip_ok": %s}\n' \
        "$(json_str "$1")" "$(json_str "$2")" "$3" "$(json_str "$4")" \
        "$([ "${5:-0}" = 1 ] && echo true || echo false)" >> "$RUN/steps.jsonl"
    printf '  %-30s %-10s %7.1f s  %s\n' "$1" "$2" "$3" "$4"
    publish || true
}

# run_step NAME TIMEOUT SKIP_RC CMD...: runs CMD with its output in $RUN/logs/NAME.log, under
# its own timeout (capped by what is left of the budget). Status: passed, failed, timed out,
# skipped (exit SKIP_RC) or not run (budget spent).
run_step() {
    local name="$1" limit="$2" skip_rc="$3"
    shift 3
    local left=$((start_s + budget - $(date +%s)))
    if [ "$left" -lt 20 ]; then
        record "$name" "not run" 0 "budget of ${budget} s spent"
        return
    fi
    [ "$limit" -gt $((left - 10)) ] && limit=$((left - 10))
    local log="$RUN/logs/${name//[^A-Za-z0-9_.-]/_}.log"
    local t0 t1 rc status note=""
    # The step under way goes into summary.json first: a run killed now still says where.
    printf '{"step": %s, "status": "running", "limit_s": %s}\n' "$(json_str "$name")" "$limit" \
        > "$RUN/running.json"
    publish || true
    t0=$(date +%s.%N)
    timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    rm -f "$RUN/running.json"
    if [ "$rc" -eq 0 ]; then
        status="passed"
    elif [ "$rc" -eq "$skip_rc" ]; then
        status="skipped"
        note="exit $rc: $(grep -m1 -io 'no .*device[^.]*' "$log" || echo skipped)"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        status="timed out"
        note="killed after $limit s"
    else
        status="failed"
        note="exit $rc: $(grep -m1 -iE 'error|FAIL' "$log" | cut -c1-160)"
    fi
    record "$name" "$status" "$(awk "BEGIN { print $t1 - $t0 }")" "$note"
}

# The GPU tests of the pack's list whose names contain the patterns, in the patterns' order ("+":
# every test not named by an earlier pattern; "-P": none whose name contains P), each a step.
run_tests() {  # tests_json bin model_dir t_test PATTERN...
    local tests_json="$1" bin="$2" model_dir="$3" t_test="$4" line
    shift 4
    while IFS= read -r line; do
        eval "run_test $line"
    done < <(python3 "$root/bench/gpu_check_tests.py" plan "$tests_json" "$bin" "$root" "$@")
}

run_test() {  # NAME SKIP_RC TIMEOUT ENV... -- CMD...
    local name="$1" skip_rc="$2" limit="$3" envs=()
    shift 3
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    [ "$limit" -gt "$t_test" ] && limit=$t_test
    if [[ "$name" == *model* ]] && [ ! -f "$model_dir/models/$model_name" ]; then
        record "test:$name" "not run" 0 \
            "$(cat "$pack_dir/model-note.txt" 2> /dev/null || echo "no $model_name")"
        return
    fi
    (cd "$model_dir" && run_step "test:$name" "$limit" "$skip_rc" env "${envs[@]}" "$@")
}

run_checks() {  # bin_dir tests_json model_dir
    local bin="$1" tests_json="$2" model_dir="$3"
    local backend="cuda" model="random:llama-3.1-8b" lengths=(8192 16384 32768) ranks=4
    local runs=3 warmup=1 emul_runs=2 t_test=150 t_single=(60 80 120) t_emul=(100 130 200)
    if [ "$mode_name" = "dry-run" ]; then
        backend="cpu" model="random:tiny" lengths=(256 512) ranks=2 runs=1 warmup=0 emul_runs=1
        t_test=120 t_single=(60 60) t_emul=(60 60)
    fi
    echo "== steps ($mode_name; budget ${budget} s; $OUT: summary.json, logs.tar.gz, TTFT JSONs)"
    grep -q '"name"' "$tests_json" || record "gpu-tests" "skipped" 0 "no GPU tests in this build" 1

    # 1. Op tests against the CPU backend, then model equality (cuda = cpu).
    run_tests "$tests_json" "$bin" "$model_dir" "$t_test" ops attn flashinfer random model

    # 2. GEMM and attention throughput.
    if [ -x "$bin/bench_gpu_ops" ]; then
        run_step "bench_gpu_ops" 90 77 "$bin/bench_gpu_ops" --runs 20 --warmup 3
    else
        record "bench_gpu_ops" "skipped" 0 "bench_gpu_ops not built (needs CUDA and FlashInfer)" \
            "$([ "$mode_name" = dry-run ] && echo 1 || echo 0)"
    fi

    # 3. Single-GPU full TTFT, one step per length (one process, no NCCL: parallel.comm =
    #    "self"). Each step's --out goes to $RUN; the report merges the rows into
    #    $OUT/ttft_single.json after every step, so a step that times out loses its length alone.
    local common=(--config "$root/configs/gpu-check.toml" --set "model.backend=\"$backend\""
        --set "model.path=\"$model\"" --set 'parallel.comm="self"')
    local i n
    for i in "${!lengths[@]}"; do
        n=${lengths[$i]}
        run_step "ttft_single_${n}" "${t_single[$i]}" -1 "$bin/infoflow_sp" "${common[@]}" \
            --set "bench.lengths=[$n]" --set "bench.runs=$runs" --set "bench.warmup=$warmup" \
            --set 'bench.methods=["full"]' --set "output.csv=\"$RUN/ttft_single_${n}.csv\"" \
            --out "$RUN/ttft_single_${n}.json"
    done

    # 4. The NCCL communicator on one rank (init, ops, watchdog, the point-to-point stream), and
    #    any GPU test not named above.
    run_tests "$tests_json" "$bin" "$model_dir" "$t_test" -ops -attn -flashinfer -random -model \
        nccl +

    # 5. The emulated table, one step per length (its own --out, merged into
    #    $OUT/ttft_emulated.json; `single` is step 3's row; no warm-up: every run is a sample).
    for i in "${!lengths[@]}"; do
        n=${lengths[$i]}
        run_step "ttft_emulated_${n}" "${t_emul[$i]}" -1 "$bin/infoflow_sp" "${common[@]}" \
            --set "bench.lengths=[$n]" --set "bench.runs=$emul_runs" --set "bench.warmup=0" \
            --set 'bench.methods=["ring","infoflow"]' --set "parallel.emulate_ranks=$ranks" \
            --set "bench.emulate_timing=true" --set "output.csv=\"$RUN/ttft_emulated_${n}.csv\"" \
            --out "$RUN/ttft_emulated_${n}.json"
    done

    local rc=0
    publish --final || rc=1
    cat "$RUN/report.txt"
    local files
    files=$(find "$OUT" -type f | wc -l)
    echo "files in $OUT: $files (at most $max_out_files come back): $(cd "$OUT" && ls | tr '\n' ' ')"
    if [ "$files" -gt "$max_out_files" ]; then
        echo "gpu_check.sh: error: $OUT holds $files files, more than the $max_out_files that come back" >&2
        rc=1
    fi
    echo "total: $(($(date +%s) - start_s)) s"
    return "$rc"
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
        mode_name="dry-run"
        build_dir="${build_dir:-$root/build}"
        [ -x "$build_dir/infoflow_sp" ] || die "no $build_dir/infoflow_sp: build first (launch/build.sh)"
        OUT="${out_dir:-${OUT:-$(mktemp -d)}}"
        RUN="$(mktemp -d)"
        trap 'rm -rf "$RUN"' EXIT
        mkdir -p "$OUT" "$RUN/logs"
        rm -f "$OUT"/summary.json "$OUT"/logs.tar.gz "$OUT"/ttft_*.json
        : > "$RUN/steps.jsonl"
        gpu_test_list "$build_dir" > "$RUN/gpu_tests.json" || die "cannot list the GPU tests of $build_dir"
        export OMP_WAIT_POLICY=passive
        run_checks "$build_dir" "$RUN/gpu_tests.json" "$root"
        exit $?
        ;;
    device)
        mode_name="device"
        [ -f "$pack_dir/gpu-pack.tar.xz" ] || die "no $pack_dir/gpu-pack.tar.xz: run bench/gpu_check.sh --pack here first"
        OUT="${out_dir:-${OUT:-$root/out/gpu-check}}"
        work="${TMPDIR:-/tmp}/infoflow-gpu-check"
        RUN="$work/run"
        rm -rf "$work" && mkdir -p "$work" "$RUN/logs" "$OUT" || die "cannot create $work"
        rm -f "$OUT"/summary.json "$OUT"/logs.tar.gz "$OUT"/ttft_*.json
        : > "$RUN/steps.jsonl"
        t0=$(date +%s)
        xz -dc "$pack_dir/gpu-pack.tar.xz" | tar -C "$work" -xf - || die "cannot unpack the pack"
        mkdir -p "$work/pack/models"
        [ -f "$pack_dir/$model_name" ] && ln -sf "$pack_dir/$model_name" "$work/pack/models/$model_name"
        {
            echo "unpacked in $(($(date +%s) - t0)) s: $(head -1 "$work/pack/build-info.txt")"
            python3 -c "import nvidia.cublas, nvidia.nccl" 2>&1 &&
                echo "python3: nvidia.cublas and nvidia.nccl import" ||
                echo "warning: python3 -c 'import nvidia.cublas, nvidia.nccl' failed"
        } > "$RUN/logs/setup.log" 2>&1
        nv="$(nvidia_lib_dirs)"
        [ -n "$nv" ] || echo "warning: no cuBLAS/NCCL libraries found under python3's nvidia/ folder" >> "$RUN/logs/setup.log"
        export LD_LIBRARY_PATH="$work/pack/lib${nv:+:$nv}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        {
            echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
            command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version \
                --format=csv,noheader
            ldd "$work/pack/bin/infoflow_sp" | grep -i 'not found' && echo "warning: missing libraries"
        } >> "$RUN/logs/setup.log" 2>&1
        cat "$RUN/logs/setup.log"
        export OMP_WAIT_POLICY=passive
        run_checks "$work/pack/bin" "$work/pack/gpu_tests.json" "$work/pack"
        exit $?
        ;;
esac
