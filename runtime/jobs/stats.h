// Statistics of the quality jobs (`sweep`, `niah`, `eval`): the mean of a metric over cases with
// a 95 % percentile-bootstrap interval, and the paired comparison of two methods on the same cases
// (the mean of the per-case differences and its interval; "not significant" when the interval
// contains 0). The bootstrap is seeded and uses its own generator (SplitMix64 indices), so the
// same values give the same interval on every machine and standard library.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace infoflow {

struct Interval {
    int n = 0;
    double mean = 0.0;
    double lo = 0.0;  // 2.5 % percentile of the bootstrap means
    double hi = 0.0;  // 97.5 % percentile
    // "0.412 [0.381, 0.440]" with printf `format` for each number; "-" when n = 0.
    std::string str(const char* format = "%.3f") const;
    nlohmann::json json() const;  // {"n", "mean", "lo", "hi"}
};

constexpr int k_bootstrap_resamples = 2000;
constexpr uint64_t k_bootstrap_seed = 0x5eed2026ULL;

// Mean of `x` and its 95 % percentile-bootstrap interval over `resamples` resamples of size n
// (with replacement). n = 0: all zero; n = 1 or constant x: the point [x, x].
Interval bootstrap_mean(const std::vector<double>& x, int resamples = k_bootstrap_resamples,
                        uint64_t seed = k_bootstrap_seed);

// A vs B on the same cases: d_i = a_i - b_i (a and b must have equal sizes).
struct PairedComparison {
    Interval diff;             // mean of d and its bootstrap interval
    bool significant = false;  // n >= 2 and the interval excludes 0
    // "+0.052 [+0.010, +0.094]" or "... (not significant)".
    std::string str(const char* format = "%+.3f") const;
    nlohmann::json json() const;  // {"n", "mean_diff", "lo", "hi", "significant"}
};
PairedComparison paired_comparison(const std::vector<double>& a, const std::vector<double>& b,
                                   int resamples = k_bootstrap_resamples,
                                   uint64_t seed = k_bootstrap_seed);

}  // namespace infoflow
