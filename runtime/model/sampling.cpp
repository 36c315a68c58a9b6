#include "runtime/model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/core/error.h"

namespace infoflow {

Sampler::Sampler(const SamplingParams& p) : p_(p), state_(p.seed ^ 0x9E3779B97F4A7C15ull) {
    IF_CHECK(p.temperature >= 0.0f, "temperature must be >= 0, got " << p.temperature);
    IF_CHECK(p.top_p > 0.0 && p.top_p <= 1.0, "top_p must be in (0, 1], got " << p.top_p);
}

// splitmix64: a fixed, platform-independent generator.
double Sampler::next_uniform() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return double(z >> 11) * (1.0 / 9007199254740992.0);
}

int32_t Sampler::sample(const float* logits, int n_vocab) {
    for (int i = 0; i < n_vocab; ++i) {
        IF_CHECK(std::isfinite(logits[i]),
                 "non-finite logit " << logits[i] << " at token id " << i);
    }
    std::vector<float> biased;
    if (!p_.logit_bias.empty()) {
        biased.assign(logits, logits + n_vocab);
        for (const auto& [id, b] : p_.logit_bias) {
            IF_CHECK(id >= 0 && id < n_vocab,
                     "logit_bias: token id " << id << " is outside the vocabulary of " << n_vocab);
            biased[size_t(id)] += b;
        }
        logits = biased.data();
    }
    if (p_.temperature == 0.0f) return argmax(logits, n_vocab);
    std::vector<std::pair<int32_t, float>> cand;
    if (p_.top_k > 0 && p_.top_k < n_vocab) {
        cand = top_logits(logits, n_vocab, p_.top_k);
    } else {
        cand.reserve(n_vocab);
        for (int i = 0; i < n_vocab; ++i) cand.emplace_back(i, logits[i]);
    }
    double mx = -INFINITY;
    for (auto& c : cand) mx = std::max(mx, double(c.second));
    std::vector<double> w(cand.size());
    double total = 0.0;
    for (size_t i = 0; i < cand.size(); ++i) {
        w[i] = std::exp((cand[i].second - mx) / p_.temperature);
        total += w[i];
    }
    if (p_.top_p < 1.0) {
        // The nucleus: candidates by decreasing weight (ties to the lower id) until their mass
        // reaches top_p of the total; the rest get weight 0.
        std::vector<size_t> order(cand.size());
        std::iota(order.begin(), order.end(), size_t(0));
        std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
            return w[a] > w[b] || (w[a] == w[b] && cand[a].first < cand[b].first);
        });
        double kept = 0.0;
        size_t n_keep = 0;
        while (n_keep < order.size() && kept < p_.top_p * total) kept += w[order[n_keep++]];
        for (size_t i = n_keep; i < order.size(); ++i) w[order[i]] = 0.0;
        total = kept;
    }
    const double u = next_uniform() * total;
    double acc = 0.0;
    for (size_t i = 0; i < cand.size(); ++i) {
        acc += w[i];
        if (u < acc) return cand[i].first;
    }
    return cand.back().first;
}

int32_t argmax(const float* logits, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; ++i) {
        if (logits[i] > logits[best]) best = i;
    }
    return best;
}

std::vector<std::pair<int32_t, float>> top_logits(const float* logits, int n, int k) {
    k = std::min(k, n);
    std::vector<int32_t> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    auto better = [&](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), better);
    std::vector<std::pair<int32_t, float>> out;
    for (int i = 0; i < k; ++i) out.emplace_back(idx[i], logits[idx[i]]);
    return out;
}

std::vector<double> log_softmax(const float* logits, int n) {
    double mx = -INFINITY;
    for (int i = 0; i < n; ++i) mx = std::max(mx, double(logits[i]));
    double s = 0.0;
    for (int i = 0; i < n; ++i) s += std::exp(double(logits[i]) - mx);
    const double lse = mx + std::log(s);
    std::vector<double> out(n);
    for (int i = 0; i < n; ++i) out[i] = double(logits[i]) - lse;
    return out;
}

}  // namespace infoflow
