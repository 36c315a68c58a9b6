#include "runtime/model/model.h"

#include <cstring>

#include "runtime/core/error.h"
#include "runtime/core/pieces.h"
#include "runtime/model/model_loader.h"

namespace infoflow {

Model::Model(Backend& backend, const ModelWeights& weights) : backend_(backend), weights_(weights) {
    weights_.validate();
    host_weights_ = backend_.name() == "cpu" && !weights_.generated;
    IF_CHECK(!weights_.has_stored() || (host_weights_ && backend_.supports_native_weights()),
             weights_.source << ": weights in their stored type (model.weights = \"native\") "
                             << "need the cpu backend; backend '" << backend_.name()
                             << "' loads model.weights = \"f32\"");
    inv_freq_host_ = rope_inv_freq(config());
    if (!host_weights_) {
        load_weights();
    } else {
        stack_qkv();
    }
    inv_freq_ = backend_.alloc_floats(inv_freq_host_.size());
    backend_.upload(inv_freq_.data(), inv_freq_host_.data(), inv_freq_host_.size() * sizeof(float));
}

void Model::load_weights() {
    // Matrices (the embedding table and LM head included) go to the backend's weight storage,
    // vectors (norms, biases) stay fp32. Generated models never exist on the host, except for
    // their vectors, which are small.
    for (const WeightTensor& t : weight_tensors(weights_)) {
        Buffer b;
        if (t.cols > 0) {
            if (weights_.generated) {
                RandomMatrixSpec spec;
                spec.key = random_tensor_key(weights_.seed, t.name);
                spec.scale = random_weight_scale();
                b = backend_.random_matrix(int(t.rows), int(t.cols), spec);
            } else {
                b = backend_.load_matrix(t.data->data(), int(t.rows), int(t.cols));
            }
        } else {
            const std::vector<float> gen = weights_.generated
                                               ? random_host_tensor(weights_.seed, t.name, t.rows)
                                               : std::vector<float>();
            const std::vector<float>& host = weights_.generated ? gen : *t.data;
            b = backend_.alloc_floats(host.size());
            backend_.upload(b.data(), host.data(), host.size() * sizeof(float));
        }
        device_.emplace(t.data, std::move(b));
    }
}

void Model::stack_qkv() {
    for (const LayerWeights& lw : weights_.layers) {
        std::vector<float> w;
        // Stored-type weights come fused from the loader (or stay apart when their types differ).
        if (!lw.wq.empty() && !lw.wk.empty() && !lw.wv.empty()) {
            w.reserve(lw.wq.size() + lw.wk.size() + lw.wv.size());
            w.insert(w.end(), lw.wq.begin(), lw.wq.end());
            w.insert(w.end(), lw.wk.begin(), lw.wk.end());
            w.insert(w.end(), lw.wv.begin(), lw.wv.end());
        }
        wqkv_.push_back(std::move(w));
        std::vector<float> b;
        if (!lw.bq.empty()) {
            b.insert(b.end(), lw.bq.begin(), lw.bq.end());
            b.insert(b.end(), lw.bk.begin(), lw.bk.end());
            b.insert(b.end(), lw.bv.begin(), lw.bv.end());
        }
        bqkv_.push_back(std::move(b));
    }
}

const float* Model::w(const std::vector<float>& v) {
    if (host_weights_) return v.empty() ? nullptr : v.data();
    const auto it = device_.find(&v);
    return it == device_.end() ? nullptr : it->second.data();  // absent: an optional tensor
}

namespace {
// A stored matrix as the backend takes it (its pass left at the default).
NativeMatrix native_view(const StoredMatrix& st) {
    NativeMatrix nm;
    nm.type = st.type;
    nm.rows = int(st.rows);
    nm.cols = int(st.cols);
    nm.row_bytes = st.row_bytes();
    nm.data = st.data();
    nm.row_group = st.row_group;
    return nm;
}
}  // namespace

void Model::mm(const float* x, const std::vector<float>& w32, const StoredMatrix& stored,
               const float* bias, int n, int k, int m, float* out, bool accumulate, bool lm_head) {
    const NativePass pass = !decoding() ? NativePass::exact
                            : lm_head   ? NativePass::decode_fp32
                                        : NativePass::decode;
    NativeMatrix nm;
    if (stored.empty()) {
        if (!backend_.supports_native_weights()) {
            backend_.matmul(x, w(w32), bias, n, k, m, out, accumulate);
            return;
        }
        // The CPU: fp32 weights (host or generated, both in host memory there) as F32 rows, so
        // they take the products stored weights take in this pass (docs/design.md §6).
        nm.type = uint32_t(GgmlType::F32);
        nm.rows = m;
        nm.cols = k;
        nm.row_bytes = size_t(k) * sizeof(float);
        nm.data = reinterpret_cast<const uint8_t*>(w(w32));
    } else {
        nm = native_view(stored);
    }
    nm.pass = pass;
    backend_.matmul_native(x, nm, bias, n, out, accumulate);
}

const std::vector<float>& Model::lm_head() const {
    // A generated model has no data to tell a tied head from an untied one: the config does.
    if (weights_.generated) return config().tied_embeddings ? weights_.tok_embd : weights_.output;
    return weights_.lm_head();
}

void Model::ensure_scratch(int n) {
    if (n <= s_.n) return;
    const ModelConfig& c = config();
    const size_t qd = size_t(c.n_head) * c.head_dim;
    const size_t kd = size_t(c.n_head_kv) * c.head_dim;
    s_.xn = backend_.alloc_floats(size_t(n) * c.n_embd);
    s_.q = backend_.alloc_floats(size_t(n) * qd);
    s_.k = backend_.alloc_floats(size_t(n) * kd);
    s_.v = backend_.alloc_floats(size_t(n) * kd);
    s_.attn = backend_.alloc_floats(size_t(n) * qd);
    s_.lse = backend_.alloc_floats(size_t(n) * c.n_head);
    s_.gate = backend_.alloc_floats(size_t(n) * c.n_ff);
    s_.up = backend_.alloc_floats(size_t(n) * c.n_ff);
    s_.qkv = backend_.alloc_floats(size_t(n) * (qd + 2 * kd));
    s_.n = n;
}

void Model::embed(const int32_t* ids, int n, float* hidden) {
    const ModelConfig& c = config();
    for (int i = 0; i < n; ++i) {
        IF_CHECK(ids[i] >= 0 && ids[i] < c.n_vocab,
                 "token id " << ids[i] << " outside the vocabulary [0, " << c.n_vocab << ")");
    }
    const StoredMatrix& st = weights_.tok_embd_stored;
    if (!st.empty()) {
        backend_.embed_native(native_view(st), ids, n, hidden);
        return;
    }
    backend_.embed(w(weights_.tok_embd), ids, n, c.n_embd, hidden);
}

void Model::qkv(int l, const float* xn, int n, const int32_t* pos, float* q, float* k, float* v) {
    const ModelConfig& c = config();
    const LayerWeights& lw = weights_.layers[l];
    const int qd = c.n_head * c.head_dim;
    const int kd = c.n_head_kv * c.head_dim;
    const LayerWeights::Stored& st = lw.stored;
    if (q && host_weights_ && (!wqkv_[l].empty() || !st.wqkv.empty())) {
        const int all = qd + 2 * kd;
        float* t = s_.qkv.data();
        mm(xn, wqkv_[l], st.wqkv, w(bqkv_[l]), n, c.n_embd, all, t, false);
        for (int i = 0; i < n; ++i) {
            const float* row = t + size_t(i) * all;
            backend_.copy(q + size_t(i) * qd, row, qd * sizeof(float));
            backend_.copy(k + size_t(i) * kd, row + qd, kd * sizeof(float));
            backend_.copy(v + size_t(i) * kd, row + qd + kd, kd * sizeof(float));
        }
    } else {
        // Backend weight storage: one GEMM per projection, straight into q, k and v.
        if (q) mm(xn, lw.wq, st.wq, w(lw.bq), n, c.n_embd, qd, q, false);
        if (!st.wqkv.empty()) {
            // K and V alone from the fused stored matrix: its rows after the queries'.
            const StoredMatrix& f = st.wqkv;
            const size_t rb = f.row_bytes();
            for (int part = 0; part < 2; ++part) {
                NativeMatrix nm;
                nm.type = f.type;
                nm.rows = kd;
                nm.cols = int(f.cols);
                nm.row_bytes = rb;
                nm.data = f.data() + size_t(qd + part * kd) * rb;
                nm.row_group = f.row_group;  // the loader groups wqkv only where qd, kd allow
                const float* b = bqkv_[l].empty() ? nullptr : w(bqkv_[l]) + qd + part * kd;
                backend_.matmul_native(xn, nm, b, n, part == 0 ? k : v, false);
            }
        } else {
            mm(xn, lw.wk, st.wk, w(lw.bk), n, c.n_embd, kd, k, false);
            mm(xn, lw.wv, st.wv, w(lw.bv), n, c.n_embd, kd, v, false);
        }
    }
    if (c.has_qk_norm) {
        if (q) backend_.rms_norm(q, w(lw.q_norm), n * c.n_head, c.head_dim, c.rms_eps, q);
        backend_.rms_norm(k, w(lw.k_norm), n * c.n_head_kv, c.head_dim, c.rms_eps, k);
    }
    if (q) backend_.rope(q, pos, n, c.n_head, c.head_dim, inv_freq_.data());
    backend_.rope(k, pos, n, c.n_head_kv, c.head_dim, inv_freq_.data());
}

void Model::layer_qkv(int l, const float* hidden, int n, const int32_t* pos, float* q_out,
                      float* k_out, float* v_out) {
    IF_CHECK(l >= 0 && l < config().n_layer, "layer " << l << " out of range");
    if (n == 0) return;
    const ModelConfig& c = config();
    ensure_scratch(n);
    backend_.rms_norm(hidden, w(weights_.layers[l].attn_norm), n, c.n_embd, c.rms_eps,
                      s_.xn.data());
    qkv(l, s_.xn.data(), n, pos, q_out, k_out, v_out);
}

void Model::layer_post(int l, float* hidden, const float* attn, int n) {
    if (n == 0) return;
    const ModelConfig& c = config();
    const LayerWeights& lw = weights_.layers[l];
    ensure_scratch(n);
    const LayerWeights::Stored& st = lw.stored;
    mm(attn, lw.wo, st.wo, nullptr, n, c.n_head * c.head_dim, c.n_embd, hidden, true);
    backend_.rms_norm(hidden, w(lw.ffn_norm), n, c.n_embd, c.rms_eps, s_.xn.data());
    mm(s_.xn.data(), lw.w_gate, st.w_gate, nullptr, n, c.n_embd, c.n_ff, s_.gate.data(), false);
    mm(s_.xn.data(), lw.w_up, st.w_up, nullptr, n, c.n_embd, c.n_ff, s_.up.data(), false);
    backend_.swiglu(s_.gate.data(), s_.up.data(), size_t(n) * c.n_ff, s_.gate.data());
    mm(s_.gate.data(), lw.w_down, st.w_down, nullptr, n, c.n_ff, c.n_embd, hidden, true);
}

void Model::layer_forward(int l, float* hidden, int n, const int32_t* pos, const int32_t* group,
                          const int32_t* slots, KvCache& cache, LayerTap* tap) {
    layer_forward_rows(l, hidden, n, pos, group, slots, cache, tap, false);
}

void Model::layer_forward_pieces(int l, float* hidden, int n, const int32_t* pos,
                                 const int32_t* group, const int32_t* slots, KvCache& cache) {
    layer_forward_rows(l, hidden, n, pos, group, slots, cache, nullptr, true);
}

void Model::layer_forward_rows(int l, float* hidden, int n, const int32_t* pos,
                               const int32_t* group, const int32_t* slots, KvCache& cache,
                               LayerTap* tap, bool pieces) {
    if (n == 0) return;
    const ModelConfig& c = config();
    ensure_scratch(n);
    layer_qkv(l, hidden, n, pos, s_.q.data(), s_.k.data(), s_.v.data());
    // New K/V go into the cache before attention (docs/design.md §3.5).
    cache.write_rows(l, slots, s_.k.data(), s_.v.data(), n);
    AttnParams ap;
    cache.attn_kv(l, 0, ap);
    ap.k_pos = cache.pos_data();
    const bool groups = group != nullptr || cache.has_groups();
    std::vector<int32_t> zero_groups;
    if (groups && group == nullptr) zero_groups.assign(n, 0);
    const int32_t* q_group = groups ? (group ? group : zero_groups.data()) : nullptr;
    ap.k_group = groups ? cache.group_data() : nullptr;
    ap.n_kv = cache.size();
    ap.n_head = c.n_head;
    ap.n_head_kv = c.n_head_kv;
    ap.head_dim = c.head_dim;
    const size_t q_row = size_t(c.n_head) * c.head_dim;
    const bool tapped = tap && tap->wants(l);
    // With `pieces`, the rows' attention and MLP run in piece_ranges(n), each reported to
    // piece_done (one row's result does not depend on the rows beside it: pieces.h); else at once.
    const std::vector<std::pair<int, int>> ranges =
        pieces ? piece_ranges(n) : std::vector<std::pair<int, int>>{{0, n}};
    // Between pieces the caller's decode steps use this Model's scratch, and a step of more rows
    // than n grows (reallocates) it: the queries of the pieces to come and the attention output
    // are then held apart from it.
    Buffer q_own, attn_own;
    const float* q = s_.q.data();
    float* attn = s_.attn.data();
    if (ranges.size() > 1) {
        q_own = backend_.alloc_floats(size_t(n) * q_row);
        attn_own = backend_.alloc_floats(size_t(n) * q_row);
        backend_.copy(q_own.data(), s_.q.data(), size_t(n) * q_row * sizeof(float));
        q = q_own.data();
        attn = attn_own.data();
    }
    for (const auto& [a, b] : ranges) {
        ap.q = q + size_t(a) * q_row;
        ap.q_pos = pos + a;
        ap.q_group = q_group ? q_group + a : nullptr;
        ap.n_q = b - a;
        ap.out = attn + size_t(a) * q_row;
        ap.lse = tapped ? s_.lse.data() : nullptr;
        backend_.attention(ap);
        if (tapped) tap->on_attention(l, q, s_.lse.data(), n, pos, q_group, cache);
        layer_post(l, hidden + size_t(a) * c.n_embd, attn + size_t(a) * q_row, b - a);
        if (pieces) piece_done(double(b - a) / c.n_layer);
    }
}

void Model::layer_kv(int l, const float* hidden, int n, const int32_t* pos, float* k_out,
                     float* v_out) {
    layer_qkv(l, hidden, n, pos, nullptr, k_out, v_out);
}

void Model::logits(const float* hidden, int n, float* out) {
    const ModelConfig& c = config();
    ensure_scratch(n);
    backend_.rms_norm(hidden, w(weights_.output_norm), n, c.n_embd, c.rms_eps, s_.xn.data());
    const StoredMatrix& head =
        weights_.output_stored.empty() && weights_.output.empty() && !weights_.generated
            ? weights_.tok_embd_stored
            : weights_.output_stored;
    // The LM head multiplies fp32 activations: its products are the logits themselves, and 8-bit
    // activations here would flip near-tied greedy choices the fp32 reference makes.
    mm(s_.xn.data(), lm_head(), head, nullptr, n, c.n_embd, c.n_vocab, out, false, true);
}

void Model::rerotate_keys(float* k, int n, const int32_t* delta) {
    const ModelConfig& c = config();
    backend_.rope(k, delta, n, c.n_head_kv, c.head_dim, inv_freq_.data());
}

std::vector<float> Model::forward(KvCache& cache, const std::vector<int32_t>& tokens,
                                  const std::vector<int32_t>& pos, bool all_logits,
                                  const std::vector<int32_t>* group) {
    const int n = int(tokens.size());
    IF_CHECK(pos.size() == tokens.size(),
             "forward: " << tokens.size() << " tokens but " << pos.size() << " positions");
    const ModelConfig& c = config();
    const int first = cache.append(n, pos.data(), group ? group->data() : nullptr);
    std::vector<int32_t> slots(n);
    for (int i = 0; i < n; ++i) slots[i] = first + i;
    Buffer hidden = backend_.alloc_floats(size_t(std::max(n, 1)) * c.n_embd);
    embed(tokens.data(), n, hidden.data());
    for (int l = 0; l < c.n_layer; ++l) {
        layer_forward(l, hidden.data(), n, pos.data(), group ? group->data() : nullptr,
                      slots.data(), cache);
    }
    const int n_out = all_logits ? n : 1;
    const float* rows = hidden.data() + size_t(all_logits ? 0 : n - 1) * c.n_embd;
    Buffer out = backend_.alloc_floats(size_t(n_out) * c.n_vocab);
    logits(rows, n_out, out.data());
    std::vector<float> host(size_t(n_out) * c.n_vocab);
    backend_.download(host.data(), out.data(), host.size() * sizeof(float));
    return host;
}

}  // namespace infoflow
