#include "kernels/cpu/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "runtime/core/error.h"

namespace infoflow::cpu {
namespace {

// -1: not chosen yet; otherwise a CpuIsa value.
std::atomic<int> g_isa{-1};

// The test hook INFOFLOW_CPU_CEILING ("avx2" or "avx512"): the highest path the CPU is taken to
// have; unset: the CPU's own. Read once.
int ceiling() {
    static const int c = [] {
        const char* env = std::getenv("INFOFLOW_CPU_CEILING");
        if (!env || !*env) return int(CpuIsa::amx);
        if (std::strcmp(env, "avx2") == 0) return int(CpuIsa::avx2);
        if (std::strcmp(env, "avx512") == 0) return int(CpuIsa::avx512);
        throw Error(
            std::string("INFOFLOW_CPU_CEILING = \"") + env +
            "\": expected \"avx2\" or \"avx512\" (a test hook: the CPU is taken to have no path "
            "above it)");
    }();
    return c;
}

// Linux: ask for the AMX tile data state (XFEATURE_XTILEDATA) for this process; without the
// grant the first tile instruction faults (SIGILL). Numbers from the kernel's uapi
// (asm/prctl.h, asm/fpu xfeatures), written out so older headers build.
constexpr long kArchReqXcompPerm = 0x1023;
constexpr long kXfeatureXtiledata = 18;

uint64_t read_xcr0() {
    uint32_t lo = 0, hi = 0;
    // xgetbv without -mxsave on the baseline build; only reached when cpuid reports OSXSAVE.
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t(hi) << 32) | lo;
}

// "" when AMX is usable, else the first requirement that fails, in the order the checks run.
std::string probe_amx() {
    if (ceiling() < int(CpuIsa::amx))
        return std::string("hidden by the test hook INFOFLOW_CPU_CEILING=") +
               cpu_isa_name(CpuIsa(ceiling()));
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return "cpu lacks cpuid leaf 7";
    if (!(d & (1u << 24))) return "cpu lacks amx_tile";
    if (!(d & (1u << 22))) return "cpu lacks amx_bf16";
    if (!(d & (1u << 25))) return "cpu lacks amx_int8";
    if (!cpu_has_avx512()) return "cpu lacks avx512";
    unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    if (!__get_cpuid(1, &a1, &b1, &c1, &d1) || !(c1 & (1u << 27)))
        return "os has not enabled xsave (osxsave)";
    const uint64_t xcr0 = read_xcr0();
    if (!(xcr0 & (1ull << 17)) || !(xcr0 & (1ull << 18)))
        return "os has not enabled the tile state (xcr0 xtilecfg/xtiledata)";
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0)
        return std::string("linux refused the tile state (arch_prctl ARCH_REQ_XCOMP_PERM: ") +
               std::strerror(errno) + ")";
    return "";
}

const std::string& amx_missing_cached() {
    static const std::string missing = probe_amx();
    return missing;
}

CpuIsa parse_isa(const std::string& name, const char* where) {
    if (name == "auto") {
        if (cpu_has_amx()) return CpuIsa::amx;
        return cpu_has_avx512() ? CpuIsa::avx512 : CpuIsa::avx2;
    }
    if (name == "avx2") return CpuIsa::avx2;
    if (name == "avx512") {
        if (!cpu_has_avx512())
            throw Error(std::string(where) + " = \"avx512\": this CPU has no AVX-512 (F/BW/VL/DQ)");
        return CpuIsa::avx512;
    }
    if (name == "amx") {
        if (!cpu_has_avx512())
            throw Error(std::string(where) +
                        " = \"amx\": this CPU has no AVX-512 (F/BW/VL/DQ), which the amx path "
                        "runs besides the tiles");
        if (!cpu_has_amx() && !amx_emulated())
            throw Error(std::string(where) +
                        " = \"amx\": AMX is not usable here: " + cpu_amx_missing());
        return CpuIsa::amx;
    }
    throw Error(std::string(where) + " = \"" + name +
                "\": unknown CPU path (expected \"auto\", \"avx2\", \"avx512\" or \"amx\")");
}

}  // namespace

bool cpu_has_avx512() {
    static const bool has = ceiling() >= int(CpuIsa::avx512) && __builtin_cpu_supports("avx512f") &&
                            __builtin_cpu_supports("avx512bw") &&
                            __builtin_cpu_supports("avx512vl") &&
                            __builtin_cpu_supports("avx512dq");
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

bool cpu_has_amx() { return amx_missing_cached().empty(); }

std::string cpu_amx_missing() { return amx_missing_cached(); }

bool amx_emulated() {
    static const bool on = [] {
        const char* env = std::getenv("INFOFLOW_AMX_EMULATE");
        return env && std::strcmp(env, "1") == 0;
    }();
    return on;
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

const char* cpu_isa_name(CpuIsa isa) {
    switch (isa) {
        case CpuIsa::amx:
            return "amx";
        case CpuIsa::avx512:
            return "avx512";
        case CpuIsa::avx2:
            break;
    }
    return "avx2";
}

std::string cpu_isa_summary() {
    const CpuIsa isa = active_cpu_isa();
    std::string s = cpu_isa_name(isa);
    if (isa_uses_avx512(isa)) {
        std::string extra;
        if (cpu_has_avx512_bf16()) extra += "bf16";
        if (cpu_has_avx512_vnni()) extra += extra.empty() ? "vnni" : ", vnni";
        if (isa == CpuIsa::amx) {
            extra += amx_emulated() ? "; emulated tiles: INFOFLOW_AMX_EMULATE test hook"
                                    : (extra.empty() ? "tiles" : ", tiles");
        } else if (!cpu_has_amx()) {
            extra += (extra.empty() ? "no amx: " : "; no amx: ") + cpu_amx_missing();
        }
        if (!extra.empty()) s += " (" + extra + ")";
    }
    return s;
}

namespace {
// Bit 0: gemm, bit 1: attention; -1: not read yet (INFOFLOW_AMX_TILES, set_amx_tiles).
std::atomic<int> g_amx_tiles{-1};

int parse_amx_tiles(const std::string& s, const char* where) {
    if (s.empty() || s == "gemm,attention" || s == "attention,gemm") return 3;
    if (s == "gemm") return 1;
    if (s == "attention") return 2;
    throw Error(std::string(where) + " = \"" + s +
                "\": expected \"gemm,attention\", \"gemm\" or \"attention\"");
}

int amx_tile_products() {
    int v = g_amx_tiles.load(std::memory_order_acquire);
    if (v >= 0) return v;
    const char* env = std::getenv("INFOFLOW_AMX_TILES");
    int expected = -1;
    g_amx_tiles.compare_exchange_strong(expected,
                                        parse_amx_tiles(env ? env : "", "INFOFLOW_AMX_TILES"));
    return g_amx_tiles.load(std::memory_order_acquire);
}
}  // namespace

bool amx_tiles_for_gemm() { return amx_tile_products() & 1; }
bool amx_tiles_for_attention() { return amx_tile_products() & 2; }
void set_amx_tiles(const std::string& products) {
    g_amx_tiles.store(parse_amx_tiles(products, "amx tiles"), std::memory_order_release);
}

std::vector<CpuIsa> cpu_paths_runnable() {
    std::vector<CpuIsa> paths{CpuIsa::avx2};
    if (cpu_has_avx512()) paths.push_back(CpuIsa::avx512);
    if (cpu_has_avx512() && (cpu_has_amx() || amx_emulated())) paths.push_back(CpuIsa::amx);
    return paths;
}

void cpu_check_expected_path() {
    const char* env = std::getenv("INFOFLOW_EXPECT_ISA");
    if (!env || !*env) return;
    const char* used = cpu_isa_name(active_cpu_isa());
    if (std::strcmp(env, used) != 0)
        throw Error(std::string("test hook INFOFLOW_EXPECT_ISA=") + env + ": this run used the " +
                    used + " path");
}

std::string cpu_products_summary() {
    const CpuIsa isa = active_cpu_isa();
    const char* name = cpu_isa_name(isa);
    std::string s;
    if (isa == CpuIsa::amx) {
        s = amx_emulated() ? "bf16 tiles (emulated)" : "bf16 tiles (amx)";
        if (!amx_tiles_for_attention()) s += " for gemm only";
        if (!amx_tiles_for_gemm()) s += " for attention only";
        name = "avx512";
    } else {
        s = std::string("exact pass (") + name + " fma)";
    }
    return s + ", decode steps fused dots (" + name + "); no BLAS library";
}

}  // namespace infoflow::cpu
