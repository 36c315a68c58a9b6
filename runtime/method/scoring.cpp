#include "runtime/method/scoring.h"

#include <algorithm>
#include <cmath>

#include "runtime/core/error.h"

namespace infoflow {

std::vector<int32_t> global_positions(const std::vector<ChunkKv>& chunks,
                                      const std::vector<int>& order) {
    std::vector<int32_t> pos;
    int32_t at = 0;
    for (int ci : order) {
        for (int t = 0; t < chunks[ci].size(); ++t) pos.push_back(at++);
    }
    return pos;
}

LayoutPositions layout_positions(Config::Layout layout, const std::vector<ChunkKv>& chunks,
                                 const std::vector<int>& order) {
    LayoutPositions lp;
    int32_t T = 0;
    for (int ci : order) T += chunks[ci].size();
    int32_t at = 0;
    int32_t max_local_end = 0;
    for (size_t k = 0; k < order.size(); ++k) {
        const ChunkKv& ck = chunks[order[k]];
        const int n = ck.size();
        const bool is_prefix = order[k] == 0;  // chunk 0 sits at 0.. in every layout
        for (int t = 0; t < n; ++t) {
            int32_t p = at + t;
            if (!is_prefix) {
                switch (layout) {
                    case Config::Layout::global:
                        p = at + t;
                        break;
                    case Config::Layout::hl_tp:
                    case Config::Layout::hl_hp:
                        p = ck.local_pos[t];
                        break;
                    case Config::Layout::tl_tp:
                        p = T - n + t;
                        break;
                }
            }
            lp.key_pos.push_back(p);
        }
        if (n > 0) {
            const int32_t local_end = is_prefix ? n : ck.local_pos.back() + 1;
            max_local_end = std::max(max_local_end, local_end);
        }
        at += n;
    }
    lp.row_start = layout == Config::Layout::hl_hp ? max_local_end : T;
    return lp;
}

namespace {

class ScoreTap final : public LayerTap {
  public:
    ScoreTap(Backend& be, const ModelConfig& c, const std::vector<int>& layers, int n_cols,
             bool aggregate_sum, bool value_norm)
        : be_(be),
          c_(c),
          layers_(layers),
          n_cols_(n_cols),
          sum_(aggregate_sum),
          value_norm_(value_norm),
          total_(n_cols, 0.0) {
        col_ = be_.alloc_floats(size_t(std::max(n_cols, 1)));
    }
    bool wants(int layer) const override {
        return std::find(layers_.begin(), layers_.end(), layer) != layers_.end();
    }
    void on_attention(int layer, const float* q, const float* lse, int n, const int32_t* pos,
                      const int32_t* group, const KvCache& cache) override {
        const std::vector<float> col =
            layer_column_scores(be_, col_, c_, cache, layer, q, lse, n, pos, group, n_cols_, sum_);
        const std::vector<double> vn =
            value_norm_ ? value_row_norms(be_, cache, layer, 0, n_cols_) : std::vector<double>();
        for (int j = 0; j < n_cols_; ++j) {
            const double x = sum_ ? double(col[j]) : std::sqrt(double(col[j]));
            total_[j] += value_norm_ ? x * vn[j] : x;
        }
    }
    std::vector<double> result() const {
        std::vector<double> s = total_;
        if (!sum_) {
            for (double& x : s) x /= double(layers_.size());
        }
        return s;
    }

  private:
    Backend& be_;
    const ModelConfig& c_;
    std::vector<int> layers_;
    int n_cols_;
    bool sum_;
    bool value_norm_;
    Buffer col_;
    std::vector<double> total_;
};

}  // namespace

std::vector<double> score_context(Model& model, const std::vector<ChunkKv>& chunks,
                                  const std::vector<int>& order, const std::vector<int32_t>& rows,
                                  const ScoreOptions& opt) {
    IF_CHECK(!opt.layers.empty(), "scoring needs at least one layer");
    const int max_layer = *std::max_element(opt.layers.begin(), opt.layers.end());
    IF_CHECK(max_layer < model.config().n_layer,
             "scoring layer " << max_layer << " >= n_layer " << model.config().n_layer);
    const LayoutPositions lp = layout_positions(opt.layout, chunks, order);
    const int T = int(lp.key_pos.size());
    KvCache cache = model.make_cache(T + int(rows.size()));
    assemble_cache(model, chunks, order, lp.key_pos, nullptr, cache, max_layer + 1);
    return score_assembled(model, cache, T, lp.row_start, rows, opt);
}

std::vector<double> score_assembled(Model& model, KvCache& cache, int T, int32_t row_start,
                                    const std::vector<int32_t>& rows, const ScoreOptions& opt) {
    const ModelConfig& c = model.config();
    IF_CHECK(!opt.layers.empty(), "scoring needs at least one layer");
    IF_CHECK(!rows.empty(), "scoring needs at least one row");
    const int max_layer = *std::max_element(opt.layers.begin(), opt.layers.end());
    IF_CHECK(max_layer < c.n_layer, "scoring layer " << max_layer << " >= n_layer " << c.n_layer);
    IF_CHECK(cache.size() == T, "score_assembled: the cache holds "
                                    << cache.size() << " slots, not the " << T << " context slots");
    const int n = int(rows.size());
    std::vector<int32_t> pos(n);
    for (int i = 0; i < n; ++i) pos[i] = row_start + i;
    const int first = cache.append(n, pos.data(), nullptr);
    std::vector<int32_t> slots(n);
    for (int i = 0; i < n; ++i) slots[i] = first + i;

    ScoreTap tap(model.backend(), c, opt.layers, T, opt.aggregate_sum, opt.value_norm);
    Buffer hidden = model.backend().alloc_floats(size_t(n) * c.n_embd);
    model.embed(rows.data(), n, hidden.data());
    for (int l = 0; l <= max_layer; ++l) {  // early exit after the deepest scoring layer
        model.layer_forward(l, hidden.data(), n, pos.data(), nullptr, slots.data(), cache, &tap);
    }
    cache.truncate(T);
    return tap.result();
}

std::vector<double> value_row_norms(Backend& be, const KvCache& cache, int layer, int first,
                                    int n) {
    std::vector<double> out(size_t(std::max(n, 0)), 0.0);
    if (n <= 0) return out;
    const size_t row = size_t(cache.row());
    Buffer v = be.alloc_floats(size_t(n) * row);
    cache.read_range(layer, first, n, nullptr, v.data());
    std::vector<float> host(size_t(n) * row);
    be.download(host.data(), v.data(), host.size() * sizeof(float));
    for (int j = 0; j < n; ++j) {
        double s = 0.0;
        for (size_t e = 0; e < row; ++e)
            s += double(host[size_t(j) * row + e]) * host[size_t(j) * row + e];
        out[size_t(j)] = std::sqrt(s);
    }
    return out;
}

std::vector<float> layer_column_scores(Backend& be, Buffer& col, const ModelConfig& c,
                                       const KvCache& cache, int layer, const float* q,
                                       const float* lse, int n, const int32_t* pos,
                                       const int32_t* group, int n_cols, bool aggregate_sum) {
    std::vector<float> host(size_t(n_cols), 0.0f);
    if (n_cols == 0) return host;
    be.upload(col.data(), host.data(), host.size() * sizeof(float));
    ScoreParams sp;
    sp.q = q;
    cache.score_k(layer, 0, sp);  // k (or k16) in the cache's storage type
    sp.lse = lse;
    sp.q_pos = pos;
    sp.k_pos = cache.pos_data();
    sp.q_group = group;
    sp.k_group = group ? cache.group_data() : nullptr;
    sp.n_q = n;
    sp.n_cols = n_cols;
    sp.n_head = c.n_head;
    sp.n_head_kv = c.n_head_kv;
    sp.head_dim = c.head_dim;
    sp.aggregate_sum = aggregate_sum;
    sp.col = col.data();
    be.attention_scores(sp);
    be.download(host.data(), col.data(), host.size() * sizeof(float));
    return host;
}

}  // namespace infoflow
