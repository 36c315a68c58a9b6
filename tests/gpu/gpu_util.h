// Helpers of the GPU tests: host vectors to and from a backend, seeded inputs, and the error
// measure the tolerances are stated in (docs/design.md §6).
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace infoflow::gpu_test {

// Tolerances, as max |a - b| / max |b| over a tensor: fp32 kernels against the fp32 CPU
// backend, and anything that passes through bf16 weights or activations (docs/design.md §6).
constexpr double kTolFp32 = 1e-4;
constexpr double kTolBf16 = 2e-2;

struct Pair {
    std::unique_ptr<Backend> cpu = make_cpu_backend(2);
    std::unique_ptr<Backend> gpu = make_backend("cuda", 1);
};

// A CUDA backend made with INFOFLOW_CUDA_ATTENTION = mode ("auto", "own", "flashinfer"; read
// once, when the backend is made); the variable's previous value is restored.
inline std::unique_ptr<Backend> cuda_with(const char* mode) {
    const char* old = std::getenv("INFOFLOW_CUDA_ATTENTION");
    const bool had = old != nullptr;
    const std::string saved = had ? old : "";
    const auto restore = [&] {
        if (had) {
            setenv("INFOFLOW_CUDA_ATTENTION", saved.c_str(), 1);
        } else {
            unsetenv("INFOFLOW_CUDA_ATTENTION");
        }
    };
    setenv("INFOFLOW_CUDA_ATTENTION", mode, 1);
    std::unique_ptr<Backend> b;
    try {
        b = make_backend("cuda", 1);
    } catch (...) {
        restore();
        throw;
    }
    restore();
    return b;
}

inline Buffer to_backend(Backend& be, const std::vector<float>& h) {
    Buffer b = be.alloc_floats(std::max<size_t>(h.size(), 1));
    be.upload(b.data(), h.data(), h.size() * sizeof(float));
    return b;
}

inline std::vector<float> to_host(Backend& be, const Buffer& b, size_t n) {
    std::vector<float> h(n);
    be.download(h.data(), b.data(), n * sizeof(float));
    return h;
}

inline std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, sd);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

// max |a - b| / max |b|; inf and NaN must agree position by position (-inf LSE rows).
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        if (std::isinf(b[i]) || std::isinf(a[i])) {
            if (a[i] != b[i]) return INFINITY;
            continue;
        }
        if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
        num = std::max(num, std::fabs(double(a[i]) - b[i]));
        den = std::max(den, std::fabs(double(b[i])));
    }
    return den > 0.0 ? num / den : num;
}

}  // namespace infoflow::gpu_test
