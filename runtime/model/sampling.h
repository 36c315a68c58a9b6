// Token selection from logits: greedy (temperature 0, ties to the lowest id) or seeded
// temperature sampling with an optional top-k; deterministic for a given seed on every platform.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace infoflow {

struct SamplingParams {
    float temperature = 0.0f;
    uint64_t seed = 0;
    int top_k = 0;  // 0 = whole vocabulary
};

class Sampler {
  public:
    explicit Sampler(const SamplingParams& p);
    int32_t sample(const float* logits /*[n_vocab]*/, int n_vocab);

  private:
    double next_uniform();  // [0, 1)
    SamplingParams p_;
    uint64_t state_;
};

int32_t argmax(const float* logits /*[n]*/, int n);
// The k largest logits, largest first (ties to the lower id).
std::vector<std::pair<int32_t, float>> top_logits(const float* logits /*[n]*/, int n, int k);
// log-softmax of a row in double precision.
std::vector<double> log_softmax(const float* logits /*[n]*/, int n);

}  // namespace infoflow
