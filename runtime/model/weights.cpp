// ModelWeights::validate: every tensor's element count against the config, naming the tensor
// and the source it came from.
#include "runtime/model/weights.h"

#include "runtime/core/error.h"

namespace infoflow {

bool ModelWeights::has_stored() const {
    if (!tok_embd_stored.empty() || !output_stored.empty()) return true;
    for (const LayerWeights& l : layers) {
        const LayerWeights::Stored& s = l.stored;
        for (const StoredMatrix* m :
             {&s.wq, &s.wk, &s.wv, &s.wqkv, &s.wo, &s.w_gate, &s.w_up, &s.w_down}) {
            if (!m->empty()) return true;
        }
    }
    return false;
}

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
    // A matrix held in its stored type: the fp32 vector is empty and the stored shape matches.
    auto check_m = [&](const std::string& name, const std::vector<float>& t, const StoredMatrix& s,
                       size_t rows, size_t cols) {
        if (s.empty()) return check(name, t, rows * cols);
        IF_CHECK(t.empty() && size_t(s.rows) == rows && size_t(s.cols) == cols &&
                     s.size_bytes() % rows == 0,
                 source << ": stored tensor " << name << " is [" << s.rows << ", " << s.cols
                        << "], the config needs [" << rows << ", " << cols << "]");
    };
    check_m("tok_embd", tok_embd, tok_embd_stored, V, E);
    check("output_norm", output_norm, E);
    if (!output_stored.empty()) {
        check_m("output", output, output_stored, V, E);
    } else if (!output.empty() || (!c.tied_embeddings && !generated)) {
        check("output", output, V * E);
    }
    IF_CHECK(layers.size() == size_t(c.n_layer),
             source << ": " << layers.size() << " layers, the config needs " << c.n_layer);
    for (size_t l = 0; l < layers.size(); ++l) {
        const LayerWeights& w = layers[l];
        const std::string p = "layers[" + std::to_string(l) + "].";
        check(p + "attn_norm", w.attn_norm, E);
        const LayerWeights::Stored& st = w.stored;
        if (!st.wqkv.empty()) {
            IF_CHECK(w.wq.empty() && w.wk.empty() && w.wv.empty() && st.wq.empty() &&
                         st.wk.empty() && st.wv.empty(),
                     source << ": " << p << "wqkv is stored with wq, wk or wv beside it");
            check_m(p + "wqkv", {}, st.wqkv, q + 2 * kv, E);
        } else {
            check_m(p + "wq", w.wq, st.wq, q, E);
            check_m(p + "wk", w.wk, st.wk, kv, E);
            check_m(p + "wv", w.wv, st.wv, kv, E);
        }
        check_m(p + "wo", w.wo, st.wo, E, q);
        check(p + "bq", w.bq, c.has_qkv_bias ? q : 0);
        check(p + "bk", w.bk, c.has_qkv_bias ? kv : 0);
        check(p + "bv", w.bv, c.has_qkv_bias ? kv : 0);
        check(p + "q_norm", w.q_norm, c.has_qk_norm ? size_t(c.head_dim) : 0);
        check(p + "k_norm", w.k_norm, c.has_qk_norm ? size_t(c.head_dim) : 0);
        check(p + "ffn_norm", w.ffn_norm, E);
        check_m(p + "w_gate", w.w_gate, st.w_gate, F, E);
        check_m(p + "w_up", w.w_up, st.w_up, F, E);
        check_m(p + "w_down", w.w_down, st.w_down, E, F);
    }
}

}  // namespace infoflow
