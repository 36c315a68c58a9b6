#include "runtime/jobs/stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "runtime/core/error.h"

namespace infoflow {
namespace {

uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// Percentile of sorted values, linear between the two nearest ranks (numpy's default).
double percentile(const std::vector<double>& sorted, double q) {
    const double at = q * double(sorted.size() - 1);
    const size_t i = size_t(std::floor(at));
    const size_t j = std::min(i + 1, sorted.size() - 1);
    return sorted[i] + (at - double(i)) * (sorted[j] - sorted[i]);
}

std::string num(const char* format, double x) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), format, x);
    return buf;
}

}  // namespace

std::string Interval::str(const char* format) const {
    if (n == 0) return "-";
    return num(format, mean) + " [" + num(format, lo) + ", " + num(format, hi) + "]";
}

nlohmann::json Interval::json() const { return {{"n", n}, {"mean", mean}, {"lo", lo}, {"hi", hi}}; }

Interval bootstrap_mean(const std::vector<double>& x, int resamples, uint64_t seed) {
    IF_CHECK(resamples >= 1, "bootstrap: resamples must be >= 1, got " << resamples);
    Interval iv;
    iv.n = int(x.size());
    if (x.empty()) return iv;
    double sum = 0.0;
    for (double v : x) sum += v;
    iv.mean = sum / double(x.size());
    const bool constant = std::all_of(x.begin(), x.end(), [&](double v) { return v == x[0]; });
    if (constant) {  // every resample has the same mean: the interval is the point
        iv.mean = iv.lo = iv.hi = x[0];
        return iv;
    }
    uint64_t state = seed;
    const uint64_t n = x.size();
    std::vector<double> means(static_cast<size_t>(resamples));
    for (int r = 0; r < resamples; ++r) {
        double s = 0.0;
        for (uint64_t i = 0; i < n; ++i) s += x[size_t(splitmix64(state) % n)];
        means[size_t(r)] = s / double(n);
    }
    std::sort(means.begin(), means.end());
    iv.lo = percentile(means, 0.025);
    iv.hi = percentile(means, 0.975);
    return iv;
}

std::string PairedComparison::str(const char* format) const {
    if (diff.n == 0) return "-";
    return diff.str(format) + (significant ? "" : " (not significant)");
}

nlohmann::json PairedComparison::json() const {
    return {{"n", diff.n},
            {"mean_diff", diff.mean},
            {"lo", diff.lo},
            {"hi", diff.hi},
            {"significant", significant}};
}

PairedComparison paired_comparison(const std::vector<double>& a, const std::vector<double>& b,
                                   int resamples, uint64_t seed) {
    IF_CHECK(a.size() == b.size(), "paired comparison of "
                                       << a.size() << " against " << b.size()
                                       << " values: the cases must be the same");
    std::vector<double> d(a.size());
    for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
    PairedComparison p;
    p.diff = bootstrap_mean(d, resamples, seed);
    // One case has no spread to resample: never significant.
    p.significant = p.diff.n >= 2 && (p.diff.lo > 0.0 || p.diff.hi < 0.0);
    return p;
}

}  // namespace infoflow
