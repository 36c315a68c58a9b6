// Token selection from logits: greedy (temperature 0, ties to the lowest id) or seeded
// temperature sampling with an optional top-k and top-p (nucleus) cut; deterministic for a given
// seed on every platform. An optional logit bias is added first (OpenAI's `logit_bias`).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace infoflow {

struct SamplingParams {
    float temperature = 0.0f;
    uint64_t seed = 0;
    int top_k = 0;       // 0 = whole vocabulary
    double top_p = 1.0;  // (0, 1]: keep the most likely tokens until their mass reaches top_p
    // Added to the logit of each listed token id before sampling (greedy included); ids must
    // be in [0, n_vocab).
    std::vector<std::pair<int32_t, float>> logit_bias;
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
