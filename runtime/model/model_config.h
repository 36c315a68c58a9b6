// Model hyper-parameters, independent of the file format they were read from (docs/design.md §7).
#pragma once

#include <string>
#include <vector>

namespace infoflow {

enum class Arch { llama, qwen2, qwen3 };

const char* arch_name(Arch a);
Arch arch_from_name(const std::string& name);  // throws naming the unknown architecture

struct RopeScaling {
    std::string type = "none";  // none | llama3 | linear
    float factor = 1.0f;
    float low_freq_factor = 1.0f;
    float high_freq_factor = 4.0f;
    int original_context = 8192;
};

struct ModelConfig {
    Arch arch = Arch::llama;
    std::string name;
    int n_layer = 0;
    int n_embd = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int head_dim = 0;
    int n_ff = 0;
    int n_vocab = 0;      // rows of the embedding (logit count)
    int n_ctx_train = 0;  // maximum positions
    float rms_eps = 1e-5f;
    float rope_theta = 10000.0f;
    RopeScaling rope_scaling;
    // GGUF `rope_freqs.weight` [head_dim/2] (Llama-3.1 in llama.cpp files, docs/formats.md §4.5): when
    // non-empty it replaces rope_scaling and inv_freq[i] = base^(-2i/D) / rope_freq_factors[i].
    std::vector<float> rope_freq_factors;
    bool tied_embeddings = true;
    bool has_qkv_bias = false;  // qwen2
    bool has_qk_norm = false;   // qwen3
    int bos_id = -1;
    std::vector<int> eos_ids;

    // Validates internal consistency; `source` names the file in the error.
    void validate(const std::string& source) const;
};

// Inverse RoPE frequencies [head_dim/2] in fp32, including llama3 / linear scaling.
std::vector<float> rope_inv_freq(const ModelConfig& c);

}  // namespace infoflow
