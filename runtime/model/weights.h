// Model weights in the compute type (fp32 on the CPU), PyTorch layout: a matrix is
// [out, in] row-major. Q/K rows are in Hugging Face half-split order for every source format
// (llama GGUF files are un-permuted at load, FORMATS §4), so one RoPE kernel serves all.
#pragma once

#include <string>
#include <vector>

#include "runtime/model/model_config.h"

namespace infoflow {

struct LayerWeights {
    std::vector<float> attn_norm;   // [n_embd]
    std::vector<float> wq;          // [n_head*head_dim, n_embd]
    std::vector<float> wk;          // [n_head_kv*head_dim, n_embd]
    std::vector<float> wv;          // [n_head_kv*head_dim, n_embd]
    std::vector<float> wo;          // [n_embd, n_head*head_dim]
    std::vector<float> bq, bk, bv;  // [n_head*head_dim], [n_head_kv*head_dim] x2; empty if none
    std::vector<float> q_norm;      // [head_dim] (qwen3); empty if none
    std::vector<float> k_norm;      // [head_dim] (qwen3); empty if none
    std::vector<float> ffn_norm;    // [n_embd]
    std::vector<float> w_gate;      // [n_ff, n_embd]
    std::vector<float> w_up;        // [n_ff, n_embd]
    std::vector<float> w_down;      // [n_embd, n_ff]
};

struct ModelWeights {
    ModelConfig config;
    std::vector<float> tok_embd;  // [n_vocab, n_embd]
    std::vector<LayerWeights> layers;
    std::vector<float> output_norm;  // [n_embd]
    std::vector<float> output;       // [n_vocab, n_embd]; empty when tied to tok_embd
    std::string source;              // file or directory it came from
    std::string fingerprint;         // stable hash of config + weights (KV store, §8)

    const std::vector<float>& lm_head() const { return output.empty() ? tok_embd : output; }
    // Checks every tensor's size against the config; `source` names the file in errors.
    void validate() const;
};

}  // namespace infoflow
