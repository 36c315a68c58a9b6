// CPU instruction-set paths chosen at run time (docs/design.md §10). The binary is built for an
// AVX2/FMA baseline; kernels that have an AVX-512 variant compile it in its own translation unit
// (with the AVX-512 flags set on that file alone) and pick it through active_cpu_isa(), so the same
// binary runs on an AVX2-only machine and uses AVX-512 (with BF16/VNNI) where the CPU has it.
#pragma once

#include <string>

namespace infoflow::cpu {

enum class CpuIsa {
    avx2,    // AVX2 + FMA + F16C: the build baseline
    avx512,  // AVX-512 F/BW/VL/DQ (+ BF16 and VNNI when has_avx512_bf16()/has_avx512_vnni())
};

// What this CPU supports (cpuid, read once).
bool cpu_has_avx512();  // F, BW, VL and DQ
bool cpu_has_avx512_bf16();
bool cpu_has_avx512_vnni();

// The path the kernels use: the best one the CPU supports, unless overridden by
// set_cpu_isa_override() (config cpu.isa) or the environment variable INFOFLOW_CPU_ISA
// ("avx2" | "avx512" | "auto"). Fixed after the first kernel call reads it.
CpuIsa active_cpu_isa();

// Forces a path ("avx2", "avx512" or "auto"). Throws infoflow::Error when the name is unknown or
// the CPU lacks the requested path. Call before the first kernel runs.
void set_cpu_isa_override(const std::string& name);

const char* cpu_isa_name(CpuIsa isa);

// "avx512 (bf16, vnni)" or "avx2": the line printed in the run summary.
std::string cpu_isa_summary();

}  // namespace infoflow::cpu
