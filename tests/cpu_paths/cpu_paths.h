// The tolerances each CPU kernel path promises (docs/design.md §6, "Numerics per CPU path"), in
// one place for the tests that compare two runs whose arithmetic differs only in order, so that
// each CPU-path variant of a test (CMakeLists.txt, "CPU-path variants") holds its own path to
// what that path promises, none looser; and IsaScope, for the tests that visit other paths.
//
//  - avx2, avx512: every product is the fp32 exact pass (a token's bits fixed whatever its call);
//    two runs of one request differ only where attention sums are merged in another order (P
//    ranks or one, partials of ranks, the few-row and the tiled kernels), ~1e-7 relative per op:
//    first-token logits within 1e-4 of their largest magnitude, mean teacher-forced KL within
//    1e-4 nats (the bars these tests always had).
//  - amx: every product rounds its inputs to bf16 (2^-9 relative) and sums in fp32; Q·Kᵀ too.
//    The ~1e-7 differences above then cross a bf16 rounding boundary here and there, and each
//    crossing is a 2^-8-relative step of one input: measured 6e-4 to 2.3e-3 of the largest logit
//    on the tiny test models and 3e-3 to 6.4e-3 on SmolLM2 (2 ranks against one, emulated
//    tiles); bar 1e-2. Mean-KL differences: measured up to 4.9e-3 nats; bar 2e-2.
//  - a 16-bit KV cache or store on one side rounds every K/V element (f16: 2^-11 relative):
//    1e-3 on the fp32 paths (the bar the store tests always had); on amx measured 2.7e-3 (AMX
//    Xeon, SmolLM2) and 6.2e-3 (emulated, tiny model); bar 1e-2.
//  - a compact-code exchange (parallel.exchange = compact-int8/int4/int4h) against its
//    emulated oracle: the context rows pass through 8- or 4-bit codes, and where a bf16 step
//    moves a row's value across a code boundary the decoded value moves by a whole code step
//    (1/255 or 1/15 of its group's range). Equal to the fp32 paths' bar there (the K/V before
//    the codes are the same bits); on amx measured 1.1e-2 (CacheBlend, compact-int8, 4 ranks,
//    emulated tiles); bar 2e-2.
//  - against llama.cpp's fp32 logits of SmolLM2 (tests/model/test_oracle.cpp): top-1 agreement
//    >= 0.98 on every path; max |dlogit| < 0.005 on the fp32 paths (the fixture is rounded to
//    1e-4), and on amx (measured max 0.27, mean 0.037 over 717 positions) max < 0.5, mean < 0.1.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_features.h"

namespace infoflow::test {

struct PathTolerance {
    const char* numerics;
    // Relative error (max |a - b| / max |b|) of logits between two runs of the same request
    // that differ only in the order of attention sums.
    double logits;
    // The same with a 16-bit KV cache (or store) on one side.
    double logits_kv16;
    // The same for a compact-code exchange against its emulated oracle.
    double logits_codes;
    // Absolute difference of mean teacher-forced KLs (nats) between two such runs.
    double kl;
    // Against llama.cpp's fp32 logits: max and mean |dlogit| over the fixture's positions.
    double oracle_max_dlogit, oracle_mean_dlogit;
};

inline const PathTolerance& path_tolerance() {
    static const PathTolerance fp32{"fp32 exact pass", 1e-4, 1e-3, 1e-4, 1e-4, 0.005, 0.005};
    static const PathTolerance amx{"amx bf16 tiles", 1e-2, 1e-2, 2e-2, 2e-2, 0.5, 0.1};
    return cpu::active_cpu_isa() == cpu::CpuIsa::amx ? amx : fp32;
}

// A bar a test sets for the fp32 paths (tighter than path_tolerance() where its comparison allows)
// as it holds on the path in use: the bar itself on the fp32 paths, the amx bar of its kind on
// amx, where one bf16 step swamps any fp32 bar.
inline double logits_bar(double fp32_bar) {
    return cpu::active_cpu_isa() == cpu::CpuIsa::amx ? std::max(fp32_bar, path_tolerance().logits)
                                                     : fp32_bar;
}
inline double kl_bar(double fp32_bar) {
    return cpu::active_cpu_isa() == cpu::CpuIsa::amx ? std::max(fp32_bar, path_tolerance().kl)
                                                     : fp32_bar;
}

// Runs the enclosed code on another path and puts the one in use back when it ends (a test that
// visits every path must leave its CPU-path variant on the path it was given).
class IsaScope {
  public:
    explicit IsaScope(const std::string& path) : before_(cpu::active_cpu_isa()) {
        cpu::set_cpu_isa_override(path);
    }
    ~IsaScope() { cpu::set_cpu_isa_override(cpu::cpu_isa_name(before_)); }
    IsaScope(const IsaScope&) = delete;
    IsaScope& operator=(const IsaScope&) = delete;

  private:
    cpu::CpuIsa before_;
};

}  // namespace infoflow::test
