// ModelWeights::validate: every tensor's element count against the config, naming the tensor
// and the source it came from.
#include "runtime/model/weights.h"

#include "runtime/core/error.h"

namespace infoflow {

void ModelWeights::validate() const {
    const ModelConfig& c = config;
    c.validate(source);
    const size_t E = size_t(c.n_embd), F = size_t(c.n_ff), V = size_t(c.n_vocab);
    const size_t q = size_t(c.n_head) * c.head_dim, kv = size_t(c.n_head_kv) * c.head_dim;
    auto check = [&](const std::string& name, const std::vector<float>& t, size_t want) {
        if (generated) want = 0;  // the backend generates the data
        IF_CHECK(t.size() == want, source << ": tensor " << name << " has " << t.size()
                                          << " elements, the config needs " << want);
    };
    check("tok_embd", tok_embd, V * E);
    check("output_norm", output_norm, E);
    if (!output.empty() || (!c.tied_embeddings && !generated)) check("output", output, V * E);
    IF_CHECK(layers.size() == size_t(c.n_layer),
             source << ": " << layers.size() << " layers, the config needs " << c.n_layer);
    for (size_t l = 0; l < layers.size(); ++l) {
        const LayerWeights& w = layers[l];
        const std::string p = "layers[" + std::to_string(l) + "].";
        check(p + "attn_norm", w.attn_norm, E);
        check(p + "wq", w.wq, q * E);
        check(p + "wk", w.wk, kv * E);
        check(p + "wv", w.wv, kv * E);
        check(p + "wo", w.wo, E * q);
        check(p + "bq", w.bq, c.has_qkv_bias ? q : 0);
        check(p + "bk", w.bk, c.has_qkv_bias ? kv : 0);
        check(p + "bv", w.bv, c.has_qkv_bias ? kv : 0);
        check(p + "q_norm", w.q_norm, c.has_qk_norm ? size_t(c.head_dim) : 0);
        check(p + "k_norm", w.k_norm, c.has_qk_norm ? size_t(c.head_dim) : 0);
        check(p + "ffn_norm", w.ffn_norm, E);
        check(p + "w_gate", w.w_gate, F * E);
        check(p + "w_up", w.w_up, F * E);
        check(p + "w_down", w.w_down, E * F);
    }
}

}  // namespace infoflow
