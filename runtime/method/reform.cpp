#include "runtime/method/reform.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "runtime/core/error.h"
#include "runtime/core/progress.h"
#include "runtime/method/phases.h"
#include "runtime/method/scoring.h"
#include "runtime/model/generate.h"
#include "runtime/model/kv_evict.h"

namespace infoflow {
namespace {

// Undoes RoPE at `pos` on one head vector (host, fp32 rotation by -pos * inv_freq).
void unrotate(float* x, int head_dim, int32_t pos, const std::vector<float>& inv_freq) {
    const int half = head_dim / 2;
    for (int i = 0; i < half; ++i) {
        const double a = double(pos) * double(inv_freq[i]);
        const float c = float(std::cos(a)), s = float(std::sin(a));
        const float u = x[i], w = x[i + half];
        x[i] = u * c + w * s;
        x[i + half] = w * c - u * s;
    }
}

void normalize(float* x, int n) {
    double ss = 0.0;
    for (int i = 0; i < n; ++i) ss += double(x[i]) * x[i];
    if (ss <= 0.0) return;
    const float inv = float(1.0 / std::sqrt(ss));
    for (int i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace

bool is_long_context_method(Config::Method m) {
    return m == Config::Method::reform || m == Config::Method::h2o ||
           m == Config::Method::streamingllm;
}

RecurrentSpec recurrent_spec(const Config& cfg, const ModelConfig& mc) {
    const Config::ReformSection& rc = cfg.reform;
    RecurrentSpec s;
    s.streaming = cfg.method.name == Config::Method::streamingllm;
    s.chunk = rc.chunk_size;
    s.budget = rc.budget;
    s.recent = rc.recent;
    s.sink = rc.sink;
    IF_CHECK(int64_t(rc.budget) + rc.chunk_size <= mc.n_ctx_train,
             "reform.budget " << rc.budget << " + reform.chunk_size " << rc.chunk_size
                              << " exceed the " << mc.n_ctx_train
                              << " positions of the model: the compressed cache must fit");
    if (cfg.method.name == Config::Method::reform) {
        IF_CHECK(!rc.heads.empty(), "reform.heads is empty: REFORM needs at least one head");
        int deepest = 0;
        for (const auto& h : rc.heads) {
            IF_CHECK(h.layer < mc.n_layer,
                     "reform.heads: layer " << h.layer << " >= n_layer " << mc.n_layer);
            const int n_heads = h.kind == 'q' ? mc.n_head : mc.n_head_kv;
            IF_CHECK(h.head < n_heads, "reform.heads: ["
                                           << h.layer << ", " << h.head << ", \"" << h.kind
                                           << "\"]: the model has " << n_heads << " "
                                           << (h.kind == 'q' ? "query" : "KV") << " heads");
            deepest = std::max(deepest, h.layer);
        }
        s.heads = rc.heads;
        s.n_layers = deepest + 1;  // early exit
    } else {
        s.n_layers = mc.n_layer;
    }
    return s;
}

// Sees every layer of a step: the H2O statistics (attention each key received, summed over
// rows and heads) and the chosen heads' states of the rows.
class RecurrentForward::Tap final : public LayerTap {
  public:
    Tap(RecurrentForward& rf, bool accumulate, Embeddings* emb, int first, int n)
        : rf_(rf), acc_(accumulate), emb_(emb), first_(first), n_(n) {}
    bool wants(int layer) const override {
        if (acc_) return true;
        if (!emb_) return false;
        for (const auto& h : rf_.spec_.heads) {
            if (h.layer == layer) return true;
        }
        return false;
    }
    void on_attention(int layer, const float* q, const float* lse, int n, const int32_t* pos,
                      const int32_t* group, const KvCache& cache) override {
        Backend& be = rf_.model_.backend();
        const ModelConfig& c = rf_.model_.config();
        if (acc_) {
            const int n_cols = cache.size();
            Buffer col = be.alloc_floats(size_t(std::max(n_cols, 1)));
            const std::vector<float> host =
                layer_column_scores(be, col, c, cache, layer, q, lse, n, pos, group, n_cols, true);
            std::vector<double>& a = rf_.acc_[layer];
            for (int j = 0; j < n_cols; ++j) a[j] += host[j];
        }
        if (!emb_) return;
        const int D = c.head_dim;
        const int dim = emb_->dim();
        std::vector<float> qh, kh, vh;
        for (size_t hi = 0; hi < rf_.spec_.heads.size(); ++hi) {
            const Config::ReformHead& h = rf_.spec_.heads[hi];
            if (h.layer != layer) continue;
            const std::vector<float>* src = nullptr;
            int stride = 0;
            if (h.kind == 'q') {
                if (qh.empty()) {
                    qh.resize(size_t(n) * c.n_head * D);
                    be.download(qh.data(), q, qh.size() * sizeof(float));
                }
                src = &qh;
                stride = c.n_head * D;
            } else {
                std::vector<float>& dst = h.kind == 'k' ? kh : vh;
                if (dst.empty()) {
                    const size_t row = size_t(cache.row());
                    Buffer b = be.alloc_floats(size_t(n) * row);
                    cache.read_range(layer, first_, n, h.kind == 'k' ? b.data() : nullptr,
                                     h.kind == 'v' ? b.data() : nullptr);
                    dst.resize(size_t(n) * row);
                    be.download(dst.data(), b.data(), dst.size() * sizeof(float));
                }
                src = &dst;
                stride = cache.row();
            }
            for (int i = 0; i < n; ++i) {
                float* out = emb_->data.data() + size_t(base_ + i) * dim + hi * D;
                std::copy_n(src->data() + size_t(i) * stride + size_t(h.head) * D, D, out);
                if (h.kind != 'v') unrotate(out, D, pos[i], rf_.model_.inv_freq());
                normalize(out, D);
            }
        }
    }
    void set_base(int base) { base_ = base; }

  private:
    RecurrentForward& rf_;
    bool acc_;
    Embeddings* emb_;
    int first_, n_;
    int base_ = 0;
};

RecurrentForward::RecurrentForward(Model& model, const RecurrentSpec& spec, int extra)
    : model_(model),
      spec_(spec),
      cache_(model.make_cache(spec.budget + std::max(spec.chunk, extra))),
      acc_(size_t(model.config().n_layer)) {
    IF_CHECK(spec.n_layers >= 1 && spec.n_layers <= model.config().n_layer,
             "recurrent forward: " << spec.n_layers << " layers");
    IF_CHECK(spec.chunk >= 1 && spec.budget >= 1,
             "reform.chunk_size and reform.budget must be > 0");
    for (auto& a : acc_) a.assign(size_t(cache_.capacity()), 0.0);
}

RecurrentForward::~RecurrentForward() = default;

KvCache& RecurrentForward::cache() { return cache_; }

const std::vector<double>& RecurrentForward::accumulated(int layer) const {
    return acc_.at(size_t(layer));
}

void RecurrentForward::step(const int32_t* tokens, int n, Embeddings* emb, bool accumulate) {
    if (n == 0) return;
    const ModelConfig& c = model_.config();
    Backend& be = model_.backend();
    if (n > hidden_rows_) {
        hidden_ = be.alloc_floats(size_t(n) * c.n_embd);
        hidden_rows_ = n;
    }
    const int first = cache_.size();
    std::vector<int32_t> pos(n), slots(n);
    for (int i = 0; i < n; ++i) pos[i] = slots[i] = first + i;
    cache_.append(n, pos.data(), nullptr);
    peak_ = std::max(peak_, cache_.size());
    Tap tap(*this, accumulate, emb, first, n);
    if (emb) {
        IF_CHECK(emb->heads == int(spec_.heads.size()) && emb->head_dim == c.head_dim,
                 "recurrent forward: embeddings of another shape");
        tap.set_base(emb->size());
        emb->data.resize(emb->data.size() + size_t(n) * emb->dim(), 0.0f);
    }
    model_.embed(tokens, n, hidden_.data());
    for (int l = 0; l < spec_.n_layers; ++l) {
        model_.layer_forward(l, hidden_.data(), n, pos.data(), nullptr, slots.data(), cache_, &tap);
    }
}

void RecurrentForward::compress() {
    const int n = cache_.size();
    if (n <= spec_.budget) return;
    int k = 0;
    for (int l = 0; l < spec_.n_layers; ++l) {
        const std::vector<int> keep = spec_.streaming
                                          ? sink_and_recent(n, spec_.budget, spec_.sink)
                                          : heavy_hitters(acc_[l], n, spec_.budget, spec_.recent);
        compact_layer(model_, cache_, l, keep);
        std::vector<double>& a = acc_[l];
        for (size_t i = 0; i < keep.size(); ++i) a[i] = a[size_t(keep[i])];
        std::fill(a.begin() + long(keep.size()), a.end(), 0.0);
        k = int(keep.size());
    }
    finish_compaction(cache_, k);
    ++compressions_;
}

void RecurrentForward::feed_context(const std::vector<int32_t>& tokens, Embeddings* emb) {
    const int T = int(tokens.size());
    for (int at = 0; at < T; at += spec_.chunk) {
        const int n = std::min(spec_.chunk, T - at);
        step(tokens.data() + at, n, emb, !spec_.streaming);
        compress();
    }
}

std::vector<float> RecurrentForward::feed_rows(const std::vector<int32_t>& tokens, Embeddings* emb,
                                               bool want_logits) {
    const int n = int(tokens.size());
    IF_CHECK(cache_.size() + n <= cache_.capacity(),
             "recurrent forward: " << n << " rows do not fit the cache");
    step(tokens.data(), n, emb, false);
    if (!want_logits || n == 0 || spec_.n_layers < model_.config().n_layer) return {};
    const ModelConfig& c = model_.config();
    Backend& be = model_.backend();
    Buffer out = be.alloc_floats(size_t(c.n_vocab));
    model_.logits(hidden_.data() + size_t(n - 1) * c.n_embd, 1, out.data());
    std::vector<float> host(size_t(c.n_vocab));
    be.download(host.data(), out.data(), host.size() * sizeof(float));
    return host;
}

std::vector<float> retrieval_scores(const Embeddings& ctx, const Embeddings& question) {
    IF_CHECK(ctx.dim() == question.dim(), "retrieval_scores: embeddings of different shapes");
    const int n = ctx.size(), nq = question.size(), dim = ctx.dim();
    std::vector<float> s(size_t(n), nq > 0 ? -std::numeric_limits<float>::infinity() : 0.0f);
    const float inv_heads = ctx.heads > 0 ? 1.0f / float(ctx.heads) : 0.0f;
#pragma omp parallel for schedule(static)
    for (int j = 0; j < n; ++j) {
        const float* c = ctx.row(j);
        float best = -std::numeric_limits<float>::infinity();
        for (int i = 0; i < nq; ++i) {
            const float* q = question.row(i);
            float d = 0.0f;
            for (int x = 0; x < dim; ++x) d += c[x] * q[x];
            best = std::max(best, d * inv_heads);
        }
        if (nq > 0) s[size_t(j)] = best;
    }
    return s;
}

std::vector<float> max_pool(const std::vector<float>& s, int window) {
    IF_CHECK(window >= 1 && window % 2 == 1, "max_pool: window " << window << " must be odd");
    const int n = int(s.size()), r = window / 2;
    std::vector<float> out(s.size());
    // Monotone deque: O(n) for any window.
    std::vector<int> dq(s.size());
    int head = 0, tail = 0, next = 0;
    for (int j = 0; j < n; ++j) {
        const int hi = std::min(n - 1, j + r);
        for (; next <= hi; ++next) {
            while (tail > head && s[size_t(dq[size_t(tail - 1)])] <= s[size_t(next)]) --tail;
            dq[size_t(tail++)] = next;
        }
        while (dq[size_t(head)] < j - r) ++head;
        out[size_t(j)] = s[size_t(dq[size_t(head)])];
    }
    return out;
}

std::vector<int> gather_indices(const std::vector<float>& pooled, int gather, int keep_ends) {
    const int n = int(pooled.size());
    std::vector<uint8_t> take(size_t(n), 0);
    const int e = std::min(std::max(keep_ends, 0), n);
    for (int j = 0; j < e; ++j) take[size_t(j)] = take[size_t(n - 1 - j)] = 1;
    // The top `gather` over the whole context, the kept ends included: where the best-scoring
    // tokens lie in the ends, no lower-scoring ones are taken in their place.
    std::vector<int> cand(static_cast<size_t>(n));
    std::iota(cand.begin(), cand.end(), 0);
    const int k = std::min(std::max(gather, 0), n);
    std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), [&](int a, int b) {
        return pooled[size_t(a)] != pooled[size_t(b)] ? pooled[size_t(a)] > pooled[size_t(b)]
                                                      : a < b;
    });
    for (int i = 0; i < k; ++i) take[size_t(cand[size_t(i)])] = 1;
    std::vector<int> out;
    for (int j = 0; j < n; ++j) {
        if (take[size_t(j)]) out.push_back(j);
    }
    return out;
}

std::vector<int> shard_bounds(int T, int P) {
    IF_CHECK(P >= 1, "shard_bounds: " << P << " ranks");
    std::vector<int> b(size_t(P) + 1);
    for (int s = 0; s <= P; ++s) b[size_t(s)] = int(int64_t(T) * s / P);
    return b;
}

Embeddings reform_compress(Model& model, const PreparedRequest& req, const RecurrentSpec& spec,
                           int begin, int end, Embeddings* question, int* peak) {
    const std::vector<int32_t> seq = req.context_sequence();
    const std::vector<int32_t> own(seq.begin() + begin, seq.begin() + end);
    Embeddings emb;
    emb.heads = int(spec.heads.size());
    emb.head_dim = model.config().head_dim;
    emb.data.reserve(own.size() * size_t(emb.dim()));
    RecurrentForward rf(model, spec, question ? int(req.suffix.size()) : 0);
    rf.feed_context(own, &emb);
    if (question) {
        Embeddings suf;
        suf.heads = emb.heads;
        suf.head_dim = emb.head_dim;
        rf.feed_rows(req.suffix, &suf, false);
        int qb = req.question_begin, qe = req.question_end;
        if (qe <= qb) qb = 0, qe = suf.size();  // no question marked: the whole suffix
        *question = Embeddings{emb.heads, emb.head_dim, {}};
        question->data.assign(suf.data.begin() + long(qb) * emb.dim(),
                              suf.data.begin() + long(qe) * emb.dim());
    }
    if (peak) *peak = rf.peak_slots();
    return emb;
}

void reform_answer(Model& model, const PreparedRequest& req, const Config& cfg,
                   const std::vector<int32_t>& stop_ids, const std::vector<int>& gathered,
                   MethodResult& r) {
    const int n = int(gathered.size());
    const int Q = int(req.suffix.size());
    const int max_new = cfg.decode.max_new_tokens;
    const int n_ctx = model.config().n_ctx_train;
    IF_CHECK(int64_t(n) + Q + std::max(0, max_new - 1) <= n_ctx,
             "reform: " << n << " gathered tokens (reform.gather " << cfg.reform.gather
                        << " + 2 x reform.keep_ends " << cfg.reform.keep_ends << ") + suffix " << Q
                        << " + decode.max_new_tokens - 1 exceed the " << n_ctx
                        << " positions of the model");
    PhaseClock clock(r.phases);
    const std::vector<int32_t> seq = req.context_sequence();
    std::vector<int32_t> ids(static_cast<size_t>(n)), pos(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
        ids[size_t(i)] = seq[size_t(gathered[size_t(i)])];
        pos[size_t(i)] = i;
    }
    KvCache cache = model.make_cache(n + Q + max_new);
    if (n > 0) model.forward(cache, ids, pos);
    clock.mark("recompute");
    std::vector<int32_t> spos(static_cast<size_t>(Q));
    std::iota(spos.begin(), spos.end(), n);
    r.first_logits = model.forward(cache, req.suffix, spos);
    clock.mark("suffix_prefill");
    r.ttft_ms = sum_ms(r.phases);
    const GenerateResult g =
        generate(model, cache, r.first_logits, n + Q, generate_options(cfg, stop_ids));
    r.answer = g.tokens;
    r.stopped = g.stopped;
    clock.mark("decode");
}

MethodResult run_long_context(Model& model, const PreparedRequest& req, const Config& cfg,
                              const std::vector<int32_t>& stop_ids) {
    IF_CHECK(is_long_context_method(cfg.method.name),
             "run_long_context: method " << to_string(cfg.method.name));
    MethodResult r;
    r.method = to_string(cfg.method.name);
    r.ranks = 1;
    r.context_tokens = req.context_tokens();
    r.suffix_tokens = int(req.suffix.size());
    r.chunk_order = identity_order(req.n_chunks());
    const RecurrentSpec spec = recurrent_spec(cfg, model.config());
    const int T = r.context_tokens;
    const int Q = r.suffix_tokens;
    const int max_new = cfg.decode.max_new_tokens;

    if (cfg.method.name != Config::Method::reform) {
        // h2o / streamingllm: the answer from the compressed cache.
        IF_CHECK(int64_t(spec.budget) + Q + std::max(0, max_new - 1) <= model.config().n_ctx_train,
                 "reform.budget " << spec.budget << " + suffix " << Q
                                  << " + decode.max_new_tokens - 1 exceed the "
                                  << model.config().n_ctx_train << " positions of the model");
        PhaseClock clock(r.phases);
        RecurrentForward rf(model, spec, Q + max_new);
        rf.feed_context(req.context_sequence(), nullptr);
        clock.mark("compress");
        const int next = rf.cache().size() + Q;
        r.first_logits = rf.feed_rows(req.suffix, nullptr, true);
        clock.mark("suffix_prefill");
        r.ttft_ms = sum_ms(r.phases);
        const GenerateResult g =
            generate(model, rf.cache(), r.first_logits, next, generate_options(cfg, stop_ids));
        r.answer = g.tokens;
        r.stopped = g.stopped;
        clock.mark("decode");
        return r;
    }

    // REFORM. Emulated ranks: the shards' phase 1 one after another, the question embedded over
    // the last shard's cache (rank 0's in a distributed run).
    const int P = std::max(1, cfg.parallel.emulate_ranks);
    const std::vector<int> bounds = shard_bounds(T, P);
    PhaseClock clock(r.phases);
    Embeddings ctx, question;
    for (int s = 0; s < P; ++s) {
        const bool last = s == P - 1;
        Embeddings e = reform_compress(model, req, spec, bounds[size_t(s)], bounds[size_t(s) + 1],
                                       last ? &question : nullptr);
        if (s == 0) {
            ctx = std::move(e);
        } else {
            ctx.data.insert(ctx.data.end(), e.data.begin(), e.data.end());
        }
    }
    clock.mark("compress");
    const std::vector<float> pooled = max_pool(retrieval_scores(ctx, question), cfg.reform.pool);
    const std::vector<int> gathered =
        gather_indices(pooled, cfg.reform.gather, cfg.reform.keep_ends);
    r.selected_positions.assign(gathered.begin(), gathered.end());
    clock.mark("gather");
    reform_answer(model, req, cfg, stop_ids, gathered, r);
    r.ttft_ms = 0.0;
    for (const PhaseTime& p : r.phases) {
        if (p.name != "decode") r.ttft_ms += p.ms;
    }
    return r;
}

}  // namespace infoflow
