// Phase 2 of the sequence-parallel method (docs/design.md §5.2): scoring and selection, identical
// on every rank. InfoFlow: the replicated scoring rows run with a globally merged softmax (or each
// rank's local one), each rank scores its own columns, one all-reduce of the per-token scores.
// CacheBlend: layer 0 exact for every context token (pass-Q), each rank's layer-1 deviations,
// one all-reduce. EPIC needs no messages.
#include <algorithm>
#include <cmath>
#include <memory>

#include "runtime/core/error.h"
#include "runtime/method/phases.h"
#include "runtime/method/scoring.h"
#include "runtime/method/selection.h"
#include "runtime/parallel/dist_attention.h"
#include "runtime/parallel/sp_phases.h"
#include "runtime/parallel/sp_pipeline.h"

namespace infoflow {
namespace {

// The key columns one rank scores: its cache's context slots at layout positions.
struct ScoreColumns {
    std::vector<int> order;           // chunks in the scoring cache
    std::vector<int32_t> key_pos;     // [n_cols] layout positions
    std::vector<int32_t> col_global;  // [n_cols] global index of each column
    int32_t row_start = 0;            // position of the first scoring row
};

ScoreColumns score_columns(const Shard& sh, Config::Layout layout, bool global_softmax) {
    const LayoutPositions lp =
        layout_positions(layout, sh.chunks, identity_order(int(sh.chunks.size())));
    // Global softmax: chunk 0 and the rows' own keys live on rank 0 only (counted once).
    ScoreColumns sc;
    sc.row_start = lp.row_start;
    if (!global_softmax || sh.rank == 0) sc.order.push_back(0);
    for (size_t k = 1; k < sh.local_order.size(); ++k) sc.order.push_back(sh.local_order[k]);
    for (int ci : sc.order) {
        for (int t = 0; t < sh.chunks[ci].size(); ++t) {
            sc.key_pos.push_back(lp.key_pos[sh.offsets[ci] + t]);
            sc.col_global.push_back(sh.offsets[ci] + t);
        }
    }
    return sc;
}

// Whether the shard's cache, from slot `key_begin` on, holds exactly the scoring columns (the
// `global` layout: keys at their global positions, in the same order) and has room for the rows.
bool shard_cache_scores(const KvCache& cache, int key_begin, const ScoreColumns& sc, int n_rows) {
    const int n_cols = int(sc.key_pos.size());
    if (cache.size() - key_begin != n_cols || cache.capacity() - cache.size() < n_rows) {
        return false;
    }
    return std::equal(sc.key_pos.begin(), sc.key_pos.end(), cache.pos().begin() + key_begin);
}

// InfoFlow's scores of all T context tokens (§3.3), the same on every rank. In the `global`
// layout the shard's cache already holds the columns at their scoring positions: the rows attend
// over it directly (their K/V appended for the scoring pass, dropped after). Other layouts
// assemble a scoring cache of the first max_layer + 1 layers from the chunks.
std::vector<double> score_sp(Model& model, Communicator& comm, const Shard& sh,
                             KvCache& shard_cache, const std::vector<int32_t>& rows,
                             const ScoreOptions& opt, bool global_softmax) {
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    const int n = int(rows.size());
    const int max_layer = *std::max_element(opt.layers.begin(), opt.layers.end());
    const ScoreColumns sc = score_columns(sh, opt.layout, global_softmax);
    const bool store_rows = !global_softmax || sh.rank == 0;
    const int n_cols = int(sc.key_pos.size());
    const int shard_begin = global_softmax && sh.rank != 0 ? sh.c0 : 0;
    const bool reuse = shard_cache_scores(shard_cache, shard_begin, sc, store_rows ? n : 0);
    std::unique_ptr<KvCache> own;
    if (!reuse) {
        own = std::make_unique<KvCache>(model.make_cache(n_cols + n));
        assemble_cache(model, sh.chunks, sc.order, sc.key_pos, nullptr, *own, max_layer + 1);
    }
    KvCache& cache = reuse ? shard_cache : *own;
    const int key_begin = reuse ? shard_begin : 0;
    const int restore_size = cache.size();
    std::vector<int32_t> pos(n), slots(n);
    for (int i = 0; i < n; ++i) pos[i] = sc.row_start + i;
    if (store_rows) {
        const int first = cache.append(n, pos.data(), nullptr);
        for (int i = 0; i < n; ++i) slots[i] = first + i;
    }

    std::vector<double> total(sh.gpos.size(), 0.0);
    Buffer col = be.alloc_floats(std::max(1, n_cols));
    std::vector<float> host_col(n_cols);
    auto on_layer = [&](int l, const float* q, const float* lse) {
        if (std::find(opt.layers.begin(), opt.layers.end(), l) == opt.layers.end()) return;
        if (n_cols == 0) return;
        std::fill(host_col.begin(), host_col.end(), 0.0f);
        be.upload(col.data(), host_col.data(), host_col.size() * sizeof(float));
        ScoreParams sp;
        sp.q = q;
        cache.score_k(l, key_begin, sp);
        sp.lse = lse;
        sp.q_pos = pos.data();
        sp.k_pos = cache.pos_data() + key_begin;
        sp.n_q = n;
        sp.n_cols = n_cols;
        sp.n_head = c.n_head;
        sp.n_head_kv = c.n_head_kv;
        sp.head_dim = c.head_dim;
        sp.aggregate_sum = opt.aggregate_sum;
        sp.col = col.data();
        be.attention_scores(sp);
        be.download(host_col.data(), col.data(), host_col.size() * sizeof(float));
        const std::vector<double> vn = opt.value_norm
                                           ? value_row_norms(be, cache, l, key_begin, n_cols)
                                           : std::vector<double>();
        for (int j = 0; j < n_cols; ++j) {
            const int g = sc.col_global[j];
            if (sh.rank != 0 && sh.chunk_of[g] == 0) continue;  // chunk 0 is scored by rank 0
            const double x =
                opt.aggregate_sum ? double(host_col[j]) : std::sqrt(double(host_col[j]));
            total[g] += opt.value_norm ? x * vn[size_t(j)] : x;
        }
    };

    Buffer hidden = be.alloc_floats(size_t(n) * c.n_embd);
    model.embed(rows.data(), n, hidden.data());
    const std::unique_ptr<Communicator> self = global_softmax ? nullptr : make_self_communicator();
    forward_replicated(model, global_softmax ? comm : *self, cache, key_begin, hidden.data(), n,
                       pos.data(), store_rows ? slots.data() : nullptr, max_layer + 1, on_layer);
    cache.truncate(restore_size);  // the rows' K/V were for scoring only
    if (!opt.aggregate_sum) {
        for (double& x : total) x /= double(opt.layers.size());
    }
    // One all-reduce of the per-token scores: each rank filled its own slots (§5.2 phase 2).
    comm.all_reduce(total.data(), total.size(), DType::f64, ReduceOp::sum);
    return total;
}

// CacheBlend across ranks: layer 0 exact for every context token (pass-Q over all ranks' keys),
// then the layer-1 deviation of each rank's own tokens, all-reduced into one T-vector. Every own
// token's layer-1 K/V becomes the fresh one.
SpSelection cacheblend_select_sp(Model& model, Communicator& comm, const PreparedRequest& req,
                                 const Config& cfg, const Shard& sh, KvCache& cache,
                                 const SelectionInputs& in) {
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    const int row = cache.row();
    const int qd = c.n_head * c.head_dim;
    const int n_own = sh.own_end - sh.own_begin;
    std::vector<int32_t> toks, pos, slots;
    for (int g = sh.own_begin; g < sh.own_end; ++g) {
        toks.push_back(sh.token(req, g));
        pos.push_back(sh.gpos[g]);
        slots.push_back(sh.local_slot(g));
    }
    const size_t m = size_t(std::max(1, n_own));
    SpSelection s;
    s.own_hidden = be.alloc_floats(m * c.n_embd);
    Buffer q = be.alloc_floats(m * qd), k = be.alloc_floats(m * row), v = be.alloc_floats(m * row);
    Buffer out = be.alloc_floats(m * qd), lse = be.alloc_floats(m * c.n_head);
    float* h = s.own_hidden.data();
    model.embed(toks.data(), n_own, h);
    model.layer_qkv(0, h, n_own, pos.data(), q.data(), k.data(), v.data());
    AttnParams local;
    cache.attn_kv(0, sh.key_begin(), local);
    local.k_pos = cache.pos_data() + sh.key_begin();
    local.n_kv = cache.size() - sh.key_begin();
    local.n_head = c.n_head;
    local.n_head_kv = c.n_head_kv;
    local.head_dim = c.head_dim;
    pass_q_attention(comm, be, local, q.data(), pos.data(), n_own, out.data(), lse.data());
    model.layer_post(0, h, out.data(), n_own);

    Buffer k1 = be.alloc_floats(m * row), v1 = be.alloc_floats(m * row);
    Buffer old = be.alloc_floats(m * row);
    model.layer_kv(1, h, n_own, pos.data(), k1.data(), v1.data());
    const bool use_k = cfg.cacheblend.metric == Config::BlendMetric::k;
    cache.read_rows(1, slots.data(), use_k ? old.data() : nullptr, use_k ? nullptr : old.data(),
                    n_own);
    const size_t own_floats = size_t(n_own) * row;
    std::vector<float> fresh(m * row), cached(m * row);
    be.download(fresh.data(), use_k ? k1.data() : v1.data(), own_floats * sizeof(float));
    be.download(cached.data(), old.data(), own_floats * sizeof(float));
    const std::vector<double> own_dev = kv_deviation(fresh.data(), cached.data(), n_own, row);
    std::vector<double> dev(sh.gpos.size(), 0.0);
    for (int i = 0; i < n_own; ++i) dev[sh.own_begin + i] = own_dev[i];
    comm.all_reduce(dev.data(), dev.size(), DType::f64, ReduceOp::sum);
    s.selected = select_top_k(dev, sh.gpos, in.eligible, in.k_budget);
    cache.write_rows(1, slots.data(), k1.data(), v1.data(), n_own);
    s.first_layer = 1;
    return s;
}

}  // namespace

SpSelection score_and_select(Model& model, Communicator& comm, const PreparedRequest& req,
                             const Config& cfg, const Shard& sh, KvCache& cache) {
    const SelectionInputs in = selection_inputs(cfg, sh.chunk_of);
    SpSelection s;
    switch (cfg.method.name) {
        case Config::Method::infoflow:
            IF_CHECK(cfg.scoring.deviation_weight == 0.0,
                     "scoring.deviation_weight on more than one rank is not implemented yet");
            if (in.k_budget > 0) {
                const std::vector<double> score =
                    score_sp(model, comm, sh, cache, scoring_rows(req, cfg.scoring.query),
                             score_options(cfg, model.config().n_layer),
                             cfg.scoring.softmax == Config::Softmax::global);
                s.selected = select_infoflow(score, sh.gpos, in.eligible, sh.chunk_of, in.k_budget,
                                             select_options(cfg));
            }
            break;
        case Config::Method::epic: {
            std::vector<int> sizes;
            for (const auto& ch : req.chunks) sizes.push_back(int(ch.size()));
            s.selected = epic_select(cfg, identity_order(req.n_chunks()), sh.offsets, sizes);
            break;
        }
        case Config::Method::cacheblend:
            if (in.k_budget > 0 && model.config().n_layer > 1) {
                s = cacheblend_select_sp(model, comm, req, cfg, sh, cache, in);
            }
            break;
        default:
            break;
    }
    return s;
}

}  // namespace infoflow
