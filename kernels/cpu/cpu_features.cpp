#include "kernels/cpu/cpu_features.h"

#include <atomic>
#include <cstdlib>

#include "runtime/core/error.h"

namespace infoflow::cpu {
namespace {

// -1: not chosen yet; otherwise a CpuIsa value.
std::atomic<int> g_isa{-1};

CpuIsa parse_isa(const std::string& name, const char* where) {
    if (name == "auto") return cpu_has_avx512() ? CpuIsa::avx512 : CpuIsa::avx2;
    if (name == "avx2") return CpuIsa::avx2;
    if (name == "avx512") {
        if (!cpu_has_avx512())
            throw Error(std::string(where) + " = \"avx512\": this CPU has no AVX-512 (F/BW/VL/DQ)");
        return CpuIsa::avx512;
    }
    throw Error(std::string(where) + " = \"" + name +
                "\": unknown CPU path (expected \"auto\", \"avx2\" or \"avx512\")");
}

}  // namespace

bool cpu_has_avx512() {
    static const bool has =
        __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    return has;
}

bool cpu_has_avx512_bf16() {
    static const bool has = cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
    return has;
}

bool cpu_has_avx512_vnni() {
    static const bool has = cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
    return has;
}

CpuIsa active_cpu_isa() {
    int v = g_isa.load(std::memory_order_acquire);
    if (v >= 0) return static_cast<CpuIsa>(v);
    const char* env = std::getenv("INFOFLOW_CPU_ISA");
    const CpuIsa isa = parse_isa(env && *env ? env : "auto", "INFOFLOW_CPU_ISA");
    int expected = -1;
    g_isa.compare_exchange_strong(expected, static_cast<int>(isa), std::memory_order_acq_rel);
    return static_cast<CpuIsa>(g_isa.load(std::memory_order_acquire));
}

void set_cpu_isa_override(const std::string& name) {
    g_isa.store(static_cast<int>(parse_isa(name, "cpu.isa")), std::memory_order_release);
}

const char* cpu_isa_name(CpuIsa isa) { return isa == CpuIsa::avx512 ? "avx512" : "avx2"; }

std::string cpu_isa_summary() {
    const CpuIsa isa = active_cpu_isa();
    std::string s = cpu_isa_name(isa);
    if (isa == CpuIsa::avx512) {
        std::string extra;
        if (cpu_has_avx512_bf16()) extra += "bf16";
        if (cpu_has_avx512_vnni()) extra += extra.empty() ? "vnni" : ", vnni";
        if (!extra.empty()) s += " (" + extra + ")";
    }
    return s;
}

}  // namespace infoflow::cpu
