// AMX tile peak: TDPBF16PS in a register-only loop (docs/benchmarks.md, "bench_amx_peak"). Four
// accumulator tiles and four source tiles stay loaded; each iteration issues four independent
// TDPBF16PS (16 x 16 x 32 multiply-adds each, 16384 flops), so the loop measures the tile unit's
// throughput, not memory. One thread per core (OpenMP), warm-up, then the median of N runs;
// GFLOP/s per core and in total, a human table, then one JSON line per measurement. This file
// alone is compiled with the AMX flags (CMakeLists.txt) and issues tile instructions only after
// cpu_has_amx(); without AMX it prints "no AMX on this CPU" and exits 0.
//
// Usage: bench_amx_peak [--threads N] [--runs N] [--warmup N] [--iters N]
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/cpu_features.h"

namespace {

constexpr double kFlopsPerDp = 16.0 * 16.0 * 32.0 * 2.0;

// `iters` x 4 TDPBF16PS on this thread's tiles; the tiles are configured and released here.
void dp_loop(int64_t iters) {
    const infoflow::cpu::AmxTileConfig cfg =
        infoflow::cpu::amx_tile_config(infoflow::cpu::amx_full_tiles());
    _tile_loadconfig(&cfg);
    alignas(64) static thread_local uint16_t src[16 * 32];
    for (int i = 0; i < 16 * 32; ++i) src[i] = 0x3f80;  // bf16 1.0
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, src, 64);
    _tile_loadd(5, src, 64);
    _tile_loadd(6, src, 64);
    _tile_loadd(7, src, 64);
    for (int64_t i = 0; i < iters; ++i) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    alignas(64) float sink[16 * 16];
    _tile_stored(0, sink, 64);  // keep the result live
    _tile_release();
    if (sink[0] < 0.0f) std::printf("unexpected\n");
}

// Seconds for every thread to run `iters` iterations (the slowest thread's time).
double run_once(int threads, int64_t iters) {
    std::vector<double> sec(threads);
#pragma omp parallel num_threads(threads)
    {
        const auto t0 = std::chrono::steady_clock::now();
        dp_loop(iters);
        sec[omp_get_thread_num()] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    return *std::max_element(sec.begin(), sec.end());
}

}  // namespace

int main(int argc, char** argv) {
    int threads = 1, runs = 10, warmup = 2;
    int64_t iters = 2000000;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--threads")
            threads = std::atoi(argv[i + 1]);
        else if (a == "--runs")
            runs = std::atoi(argv[i + 1]);
        else if (a == "--warmup")
            warmup = std::atoi(argv[i + 1]);
        else if (a == "--iters")
            iters = std::atoll(argv[i + 1]);
        else {
            std::fprintf(
                stderr,
                "usage: bench_amx_peak [--threads N] [--runs N] [--warmup N] [--iters N]\n");
            return 2;
        }
    }
    if (!infoflow::cpu::cpu_has_amx()) {
        std::printf("no AMX on this CPU (%s)\n", infoflow::cpu::cpu_amx_missing().c_str());
        return 0;
    }
    threads = std::max(1, threads);
    runs = std::max(1, runs);
    for (int w = 0; w < warmup; ++w) run_once(threads, iters);
    std::vector<double> t(runs);
    for (int r = 0; r < runs; ++r) t[r] = run_once(threads, iters);
    std::sort(t.begin(), t.end());
    const double med = t[runs / 2];
    const double flops = kFlopsPerDp * 4.0 * double(iters);  // per thread
    const double per_core = flops / med / 1e9;
    std::printf("%-8s %-10s %-14s %-14s %-10s\n", "threads", "median_s", "GFLOP/s/core",
                "GFLOP/s_total", "runs");
    std::printf("%-8d %-10.4f %-14.1f %-14.1f %-10d\n", threads, med, per_core, per_core * threads,
                runs);
    std::printf(
        "{\"bench\":\"amx_peak\",\"op\":\"tdpbf16ps\",\"threads\":%d,\"iters\":%lld,"
        "\"runs\":%d,\"median_s\":%.6f,\"min_s\":%.6f,\"max_s\":%.6f,"
        "\"gflops_per_core\":%.2f,\"gflops_total\":%.2f}\n",
        threads, static_cast<long long>(iters), runs, med, t.front(), t.back(), per_core,
        per_core * threads);
    return 0;
}
