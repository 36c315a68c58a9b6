// Batched decode steps and the step-at-a-time generation (batch_decode.h).
#include "runtime/model/batch_decode.h"

#include <algorithm>
#include <utility>

#include "runtime/core/error.h"

namespace infoflow {

namespace {

// The per-layer work buffers of one step: the rows' queries, keys, values and attention output.
struct StepBuffers {
    StepBuffers(Backend& be, const ModelConfig& c, int n) {
        const size_t qd = size_t(c.n_head) * c.head_dim, kd = size_t(c.n_head_kv) * c.head_dim;
        hidden = be.alloc_floats(size_t(n) * c.n_embd);
        q = be.alloc_floats(size_t(n) * qd);
        k = be.alloc_floats(size_t(n) * kd);
        v = be.alloc_floats(size_t(n) * kd);
        attn = be.alloc_floats(size_t(n) * qd);
    }
    Buffer hidden, q, k, v, attn;
};

// Row i's attention over its own cache, with layer_forward's visibility rule (groups when the
// row has one or its cache does).
void attend_own_cache(Model& model, int l, const DecodeRow& row, const float* q, float* out) {
    const ModelConfig& c = model.config();
    const KvCache& cache = *row.cache;
    AttnParams ap;
    ap.q = q;
    cache.attn_kv(l, 0, ap);
    ap.q_pos = &row.pos;
    ap.k_pos = cache.pos_data();
    const bool groups = row.group >= 0 || cache.has_groups();
    const int32_t q_group = row.group >= 0 ? row.group : 0;
    ap.q_group = groups ? &q_group : nullptr;
    ap.k_group = groups ? cache.group_data() : nullptr;
    ap.n_q = 1;
    ap.n_kv = cache.size();
    ap.n_head = c.n_head;
    ap.n_head_kv = c.n_head_kv;
    ap.head_dim = c.head_dim;
    ap.out = out;
    model.backend().attention(ap);
}

// The rows of one step through every layer and the LM head in one batch: out [n, n_vocab].
void forward_rows(Model& model, const std::vector<DecodeRow>& rows, const int32_t* slots,
                  float* out) {
    const int n = int(rows.size());
    const ModelConfig& c = model.config();
    const size_t qd = size_t(c.n_head) * c.head_dim, kd = size_t(c.n_head_kv) * c.head_dim;
    std::vector<int32_t> tokens(n), pos(n);
    for (int i = 0; i < n; ++i) {
        tokens[i] = rows[size_t(i)].token;
        pos[i] = rows[size_t(i)].pos;
    }
    StepBuffers b(model.backend(), c, n);
    model.embed(tokens.data(), n, b.hidden.data());
    for (int l = 0; l < c.n_layer; ++l) {
        model.layer_qkv(l, b.hidden.data(), n, pos.data(), b.q.data(), b.k.data(), b.v.data());
        for (int i = 0; i < n; ++i) {  // each row's K/V into its own cache, then its attention
            KvCache& cache = *rows[size_t(i)].cache;
            cache.write_rows(l, &slots[i], b.k.data() + i * kd, b.v.data() + i * kd, 1);
            attend_own_cache(model, l, rows[size_t(i)], b.q.data() + i * qd,
                             b.attn.data() + i * qd);
        }
        model.layer_post(l, b.hidden.data(), b.attn.data(), n);
    }
    model.logits(b.hidden.data(), n, out);
}

bool stored(const StoredMatrix& m) { return !m.empty(); }

}  // namespace

bool products_row_independent(Model& model) {
    const ModelWeights& w = model.weights();
    if (model.backend().name() != "cpu" || w.generated) return false;
    for (const LayerWeights& l : w.layers) {
        const LayerWeights::Stored& s = l.stored;
        const bool qkv = stored(s.wqkv) || (stored(s.wq) && stored(s.wk) && stored(s.wv));
        if (!qkv || !stored(s.wo) || !stored(s.w_gate) || !stored(s.w_up) || !stored(s.w_down)) {
            return false;
        }
    }
    const bool tied = w.output_stored.empty() && w.output.empty();
    return stored(tied ? w.tok_embd_stored : w.output_stored);
}

std::vector<float> decode_batch(Model& model, const std::vector<DecodeRow>& rows) {
    const int n = int(rows.size());
    if (n == 0) return {};
    const size_t V = size_t(model.config().n_vocab);
    for (int i = 0; i < n; ++i) {  // checked before any cache changes
        IF_CHECK(rows[size_t(i)].cache != nullptr, "decode_batch: row " << i << " has no cache");
        for (int j = 0; j < i; ++j) {
            IF_CHECK(rows[size_t(j)].cache != rows[size_t(i)].cache,
                     "decode_batch: rows " << j << " and " << i << " share a cache");
        }
    }
    std::vector<int32_t> slots(n);
    for (int i = 0; i < n; ++i) {
        const DecodeRow& r = rows[size_t(i)];
        slots[i] = r.cache->append(1, &r.pos, r.group >= 0 ? &r.group : nullptr);
    }
    const Model::DecodeScope decoding(model);
    Buffer out = model.backend().alloc_floats(size_t(n) * V);
    if (products_row_independent(model)) {
        forward_rows(model, rows, slots.data(), out.data());
    } else {
        for (int i = 0; i < n; ++i) {  // one row per pass: the bits of decode_step
            forward_rows(model, {rows[size_t(i)]}, &slots[i], out.data() + size_t(i) * V);
        }
    }
    std::vector<float> host(size_t(n) * V);
    model.backend().download(host.data(), out.data(), host.size() * sizeof(float));
    return host;
}

Generator::Generator(const Model& model, std::vector<float> first_logits, int32_t next_pos,
                     GenerateOptions opt)
    : opt_(std::move(opt)),
      sampler_(opt_.sampling),
      n_vocab_(model.config().n_vocab),
      n_ctx_(model.config().n_ctx_train),
      logits_(std::move(first_logits)),
      next_pos_(next_pos) {
    IF_CHECK(opt_.max_new_tokens <= 0 || int(logits_.size()) == n_vocab_,
             "generate: logits of size " << logits_.size() << ", expected " << n_vocab_);
}

bool Generator::sample() {
    if (done_) return false;
    done_ = true;  // until this step proves otherwise
    if (step_ >= opt_.max_new_tokens) return false;
    const int32_t tok = sampler_.sample(logits_.data(), n_vocab_);
    if (std::find(opt_.stop_ids.begin(), opt_.stop_ids.end(), tok) != opt_.stop_ids.end()) {
        result_.stopped = true;
        return false;
    }
    result_.tokens.push_back(tok);
    if (opt_.on_token && !opt_.on_token(tok)) {
        result_.cancelled = true;
        return false;
    }
    if (step_ + 1 == opt_.max_new_tokens) return false;
    IF_CHECK(next_pos_ < n_ctx_,
             "decode position " << next_pos_ << " exceeds the model's " << n_ctx_ << " positions");
    token_ = tok;
    done_ = false;
    return true;
}

void Generator::set_logits(const float* row) {
    IF_CHECK(!done_, "Generator::set_logits after the generation ended");
    std::copy(row, row + n_vocab_, logits_.begin());
    ++next_pos_;
    ++step_;
}

}  // namespace infoflow
