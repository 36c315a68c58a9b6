// The counter-based generator of synthetic weights (random: models, docs/design.md §7), shared by the
// host loader and the device kernel so both give bit-identical fp32 values: element i of a
// tensor with key k is a function of (k, i) alone. The stream is splitmix64 started at k, so
// element i is the output of step i + 2 (the first step is discarded).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define INFOFLOW_HOST_DEVICE __host__ __device__
#else
#define INFOFLOW_HOST_DEVICE
#endif

namespace infoflow {

constexpr uint64_t kSplitmixGamma = 0x9E3779B97F4A7C15ull;

// splitmix64's output function of a state.
INFOFLOW_HOST_DEVICE inline uint64_t splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Approximately normal (Irwin-Hall sum of four 16-bit uniforms, centred) times `scale`; with
// scale = random_weight_scale(sd) the standard deviation is sd. Exact in fp32: the centred sum
// is an integer below 2^18 and one multiply rounds it.
INFOFLOW_HOST_DEVICE inline float random_weight(uint64_t key, uint64_t i, float scale) {
    const uint64_t r = splitmix64_mix(key + (i + 2) * kSplitmixGamma);
    const uint32_t sum = uint32_t(r & 0xFFFF) + uint32_t((r >> 16) & 0xFFFF) +
                         uint32_t((r >> 32) & 0xFFFF) + uint32_t(r >> 48);
    return (float(sum) + 2.0f - 131072.0f) * scale;
}

}  // namespace infoflow
