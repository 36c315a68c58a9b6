// ModelConfig: architecture names, consistency checks, and the RoPE inverse frequencies
// (docs/formats.md §4.5), computed in fp32 the way transformers does so HF and our logits agree.
#include "runtime/model/model_config.h"

#include <cmath>

#include "runtime/core/error.h"

namespace infoflow {

const char* arch_name(Arch a) {
    switch (a) {
        case Arch::llama:
            return "llama";
        case Arch::qwen2:
            return "qwen2";
        case Arch::qwen3:
            return "qwen3";
    }
    return "unknown";
}

Arch arch_from_name(const std::string& name) {
    if (name == "llama") return Arch::llama;
    if (name == "qwen2") return Arch::qwen2;
    if (name == "qwen3") return Arch::qwen3;
    IF_FAIL("unknown model architecture '" << name << "' (supported: llama, qwen2, qwen3)");
}

void ModelConfig::validate(const std::string& source) const {
    auto range = [&](const char* key, long long v, long long lo, long long hi) {
        IF_CHECK(v >= lo && v <= hi, source << ": " << key << " = " << v << " is out of range ["
                                            << lo << ", " << hi << "]");
    };
    range("n_layer", n_layer, 1, 4096);
    range("n_embd", n_embd, 1, 1 << 17);
    range("n_head", n_head, 1, 4096);
    range("n_head_kv", n_head_kv, 1, 4096);
    range("head_dim", head_dim, 2, 4096);
    range("n_ff", n_ff, 1, 1 << 20);
    range("n_vocab", n_vocab, 1, 1 << 24);
    range("n_ctx_train", n_ctx_train, 1, 1 << 30);
    IF_CHECK(n_head % n_head_kv == 0,
             source << ": n_head " << n_head << " is not a multiple of n_head_kv " << n_head_kv);
    IF_CHECK(head_dim % 2 == 0, source << ": head_dim " << head_dim << " is odd (RoPE pairs)");
    IF_CHECK(std::isfinite(rms_eps) && rms_eps > 0.0f && rms_eps < 1.0f,
             source << ": rms_eps " << rms_eps << " must be in (0, 1)");
    IF_CHECK(std::isfinite(rope_theta) && rope_theta > 1.0f,
             source << ": rope_theta " << rope_theta << " must be > 1");
    const RopeScaling& s = rope_scaling;
    if (s.type == "linear") {
        IF_CHECK(std::isfinite(s.factor) && s.factor > 0.0f,
                 source << ": rope_scaling.factor " << s.factor << " must be > 0");
    } else if (s.type == "llama3") {
        IF_CHECK(std::isfinite(s.factor) && s.factor > 0.0f,
                 source << ": rope_scaling.factor " << s.factor << " must be > 0");
        IF_CHECK(std::isfinite(s.low_freq_factor) && std::isfinite(s.high_freq_factor) &&
                     s.low_freq_factor > 0.0f && s.high_freq_factor > s.low_freq_factor,
                 source << ": rope_scaling needs 0 < low_freq_factor (" << s.low_freq_factor
                        << ") < high_freq_factor (" << s.high_freq_factor << ")");
        range("rope_scaling.original_max_position_embeddings", s.original_context, 1, 1 << 30);
    } else {
        IF_CHECK(s.type == "none", source << ": rope_scaling type '" << s.type
                                          << "' is not supported (none, linear, llama3)");
    }
    if (!rope_freq_factors.empty()) {
        IF_CHECK(rope_freq_factors.size() == size_t(head_dim / 2),
                 source << ": rope_freqs has " << rope_freq_factors.size()
                        << " entries, expected head_dim/2 = " << head_dim / 2);
        for (float f : rope_freq_factors) {
            IF_CHECK(std::isfinite(f) && f > 0.0f, source << ": rope_freqs holds " << f);
        }
    }
    range("bos_id", bos_id, -1, n_vocab - 1);
    for (int e : eos_ids) range("eos id", e, 0, n_vocab - 1);
}

std::vector<float> rope_inv_freq(const ModelConfig& c) {
    const int half = c.head_dim / 2;
    std::vector<float> inv(size_t(half > 0 ? half : 0));
    for (int i = 0; i < half; ++i) {
        // HF: 1.0 / base ** (arange(0, dim, 2).float() / dim), all in fp32.
        const float expo = float(2 * i) / float(c.head_dim);
        inv[i] = 1.0f / std::pow(c.rope_theta, expo);
    }
    if (!c.rope_freq_factors.empty()) {
        IF_CHECK(c.rope_freq_factors.size() == inv.size(),
                 "rope_freqs has " << c.rope_freq_factors.size() << " entries, expected " << half);
        for (int i = 0; i < half; ++i) inv[i] = inv[i] / c.rope_freq_factors[i];
        return inv;
    }
    const RopeScaling& s = c.rope_scaling;
    if (s.type == "linear") {
        for (float& f : inv) f = f / s.factor;
    } else if (s.type == "llama3") {
        // transformers _compute_llama3_parameters, element by element in fp32.
        const float old_ctx = float(s.original_context);
        const float low_wavelen = old_ctx / s.low_freq_factor;
        const float high_wavelen = old_ctx / s.high_freq_factor;
        const float two_pi = float(2.0 * M_PI);
        for (float& f : inv) {
            const float wavelen = two_pi / f;
            float g = wavelen > low_wavelen ? f / s.factor : f;
            const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
            if (medium) {
                const float smooth = (old_ctx / wavelen - s.low_freq_factor) /
                                     (s.high_freq_factor - s.low_freq_factor);
                g = (1.0f - smooth) * g / s.factor + smooth * g;
            }
            f = g;
        }
    } else {
        IF_CHECK(s.type == "none", "rope_scaling type '" << s.type << "' is not supported");
    }
    return inv;
}

}  // namespace infoflow
