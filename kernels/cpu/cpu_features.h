// CPU instruction-set paths chosen at run time (docs/design.md §10). The binary is built for an
// AVX2/FMA baseline; kernels that have an AVX-512 variant compile it in its own translation unit
// (with the AVX-512 flags set on that file alone) and pick it through active_cpu_isa(), so the same
// binary runs on an AVX2-only machine and uses AVX-512 (with BF16/VNNI) where the CPU has it. The
// AMX path is the AVX-512 path with the many-row products (the exact-pass GEMM, the tiled
// attention's Q·Kᵀ) on bf16 tiles (kernels/cpu/amx_tiles.h).
#pragma once

#include <string>
#include <vector>

namespace infoflow::cpu {

enum class CpuIsa {
    avx2,    // AVX2 + FMA + F16C: the build baseline
    avx512,  // AVX-512 F/BW/VL/DQ (+ BF16 and VNNI when has_avx512_bf16()/has_avx512_vnni())
    amx,     // avx512 + AMX-TILE/BF16 tiles for prefill products (kernels/cpu/amx_tiles.h)
};

// What this CPU supports (cpuid, read once).
bool cpu_has_avx512();  // F, BW, VL and DQ
bool cpu_has_avx512_bf16();
bool cpu_has_avx512_vnni();
// AMX usable by this process: cpuid leaf 7 AMX-TILE, AMX-BF16 and AMX-INT8, the OS enabling the
// tile state (XCR0 bits 17 and 18) and Linux granting it (arch_prctl ARCH_REQ_XCOMP_PERM for
// XTILEDATA), plus AVX-512. When false, cpu_amx_missing() says which of these failed.
bool cpu_has_amx();
std::string cpu_amx_missing();  // "" when cpu_has_amx(); else e.g. "cpu lacks amx_tile"

// Test hook INFOFLOW_CPU_CEILING = "avx2" | "avx512" (never set by default): the CPU is taken to
// have no path above it, as a CPU without AVX-512 (or without AMX) reports, so one machine can
// run the suite as those would: cpu_has_avx512() and cpu_has_amx() answer accordingly (the
// latter's reason names the hook), "auto" picks at most that path and asking for more is refused.

// The tiles run by the software emulator instead of the CPU (kernels/cpu/amx_tiles.h): a test
// hook, set by the environment variable INFOFLOW_AMX_EMULATE=1 and never by default. With it,
// cpu.isa = "amx" is accepted on a CPU without AMX (it still needs AVX-512).
bool amx_emulated();

// The path the kernels use: the best one the CPU supports, unless overridden by
// set_cpu_isa_override() (config cpu.isa) or the environment variable INFOFLOW_CPU_ISA
// ("avx2" | "avx512" | "amx" | "auto"). Fixed after the first kernel call reads it. "auto" picks
// amx only on a CPU with usable AMX (cpu_has_amx()), never the emulator.
CpuIsa active_cpu_isa();

// Which products take the tiles on the amx path: both (the default), or one of them alone for a
// measurement of the choice (bench/bench_cpu_paths.cpp, docs/design.md §6 "Numerics per CPU
// path"): the measurement hook INFOFLOW_AMX_TILES = "gemm,attention" (default) | "gemm" |
// "attention"; the products left out run their avx512 code.
bool amx_tiles_for_gemm();
bool amx_tiles_for_attention();
void set_amx_tiles(const std::string& products);  // the same choice, from code; "" = both

// Whether a path runs the AVX-512 kernels (avx512 and amx: AMX tiles only replace the many-row
// products, everything else is the AVX-512 code).
inline bool isa_uses_avx512(CpuIsa isa) { return isa == CpuIsa::avx512 || isa == CpuIsa::amx; }

// Forces a path ("avx2", "avx512", "amx" or "auto"). Throws infoflow::Error when the name is
// unknown or the CPU lacks the requested path (naming what is missing). Call before the first
// kernel runs.
void set_cpu_isa_override(const std::string& name);

const char* cpu_isa_name(CpuIsa isa);

// The paths this process can run, in order: avx2, then avx512 where cpu_has_avx512(), then amx
// where AMX is usable or emulated (amx_emulated()) on an AVX-512 CPU.
std::vector<CpuIsa> cpu_paths_runnable();

// Test hook INFOFLOW_EXPECT_ISA = a path name: throws infoflow::Error naming both when the path in
// use is another one (a test variant that silently ran another path fails). Unset: nothing.
void cpu_check_expected_path();

// The line printed in the run summary: "avx2", "avx512 (bf16, vnni; no amx: cpu lacks
// amx_tile)", "amx (bf16, vnni, tiles)" or "amx (bf16, vnni, emulated tiles: test hook)".
std::string cpu_isa_summary();

// Which kernels carry the matrix products on this path, for the run summary and the result's
// provenance (docs/design.md §6, "Numerics per CPU path"): "exact pass (avx512 fma), decode steps
// fused dots (avx512); no BLAS library", or "bf16 tiles (amx), ...". Every product is the
// project's own code: no BLAS library whose kernel choice depends on the CPU model.
std::string cpu_products_summary();

}  // namespace infoflow::cpu
