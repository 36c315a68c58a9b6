#include "runtime/parallel/sp_pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "runtime/core/error.h"
#include "runtime/method/chunk_kv.h"
#include "runtime/method/chunk_store.h"
#include "runtime/method/placement.h"
#include "runtime/method/scoring.h"
#include "runtime/method/selection.h"
#include "runtime/model/generate.h"
#include "runtime/model/sampling.h"
#include "runtime/parallel/dist_attention.h"
#include "runtime/parallel/phase_clock.h"

namespace infoflow {
namespace {

// A chunk this rank does not hold: sizes and local positions only (for layouts).
ChunkKv shadow_chunk(const std::vector<int32_t>& tokens, int32_t sink_id) {
    ChunkKv c;
    c.tokens = tokens;
    const int lead = sink_id >= 0 ? 1 : 0;
    for (size_t i = 0; i < tokens.size(); ++i) c.local_pos.push_back(int32_t(lead + i));
    return c;
}

struct Shard {
    Placement place;
    std::vector<ChunkKv> chunks;       // every chunk; foreign ones are shadows
    std::vector<int32_t> gpos;         // [T] global positions
    std::vector<int> chunk_of;         // [T] chunk of each global index
    std::vector<int> offsets;          // [K+1]
    std::vector<int> local_order;      // chunk 0 then own chunks
    std::vector<int32_t> slot_global;  // local slot -> global index (context slots)
    int own_begin = 0, own_end = 0;    // own global index range
    int c0 = 0;                        // chunk 0 size
};

std::vector<double> score_sp(Model& model, Communicator& comm, const Shard& sh,
                             const std::vector<int32_t>& rows, const ScoreOptions& opt,
                             bool global_softmax) {
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    const int rank = comm.rank();
    const int T = int(sh.gpos.size());
    const int n = int(rows.size());
    const int max_layer = *std::max_element(opt.layers.begin(), opt.layers.end());
    std::vector<int> ident(sh.chunks.size());
    std::iota(ident.begin(), ident.end(), 0);
    const LayoutPositions lp = layout_positions(opt.layout, sh.chunks, ident);

    // Global softmax: chunk 0 and the rows' own keys live on rank 0 only (counted once).
    std::vector<int> order;
    if (!global_softmax || rank == 0) order.push_back(0);
    for (size_t k = 1; k < sh.local_order.size(); ++k) order.push_back(sh.local_order[k]);
    std::vector<int32_t> kpos, col_global;
    for (int ci : order) {
        for (int t = 0; t < sh.chunks[ci].size(); ++t) {
            kpos.push_back(lp.key_pos[sh.offsets[ci] + t]);
            col_global.push_back(sh.offsets[ci] + t);
        }
    }
    const bool store_rows = !global_softmax || rank == 0;
    const int n_cols = int(kpos.size());
    KvCache cache = model.make_cache(n_cols + n);
    assemble_cache(model, sh.chunks, order, kpos, nullptr, cache, max_layer + 1);
    std::vector<int32_t> pos(n), slots(n);
    for (int i = 0; i < n; ++i) pos[i] = lp.row_start + i;
    if (store_rows) {
        const int first = cache.append(n, pos.data(), nullptr);
        for (int i = 0; i < n; ++i) slots[i] = first + i;
    }

    std::vector<double> total(T, 0.0);
    Buffer col = be.alloc_floats(std::max(1, n_cols));
    std::vector<float> host_col(n_cols);
    auto on_layer = [&](int l, const float* q, const float* lse) {
        if (std::find(opt.layers.begin(), opt.layers.end(), l) == opt.layers.end()) return;
        if (n_cols == 0) return;
        std::fill(host_col.begin(), host_col.end(), 0.0f);
        be.upload(col.data(), host_col.data(), host_col.size() * sizeof(float));
        ScoreParams sp;
        sp.q = q;
        sp.k = cache.k(l);
        sp.lse = lse;
        sp.q_pos = pos.data();
        sp.k_pos = cache.pos_data();
        sp.n_q = n;
        sp.n_cols = n_cols;
        sp.n_head = c.n_head;
        sp.n_head_kv = c.n_head_kv;
        sp.head_dim = c.head_dim;
        sp.aggregate_sum = opt.aggregate_sum;
        sp.col = col.data();
        be.attention_scores(sp);
        be.download(host_col.data(), col.data(), host_col.size() * sizeof(float));
        for (int j = 0; j < n_cols; ++j) {
            const int g = col_global[j];
            if (rank != 0 && sh.chunk_of[g] == 0) continue;  // chunk 0 is scored by rank 0
            total[g] += opt.aggregate_sum ? double(host_col[j]) : std::sqrt(double(host_col[j]));
        }
    };

    Buffer hidden = be.alloc_floats(size_t(n) * c.n_embd);
    model.embed(rows.data(), n, hidden.data());
    if (global_softmax) {
        forward_replicated(model, comm, cache, 0, hidden.data(), n, pos.data(),
                           store_rows ? slots.data() : nullptr, max_layer + 1, on_layer);
    } else {
        auto self = make_self_communicator();
        forward_replicated(model, *self, cache, 0, hidden.data(), n, pos.data(), slots.data(),
                           max_layer + 1, on_layer);
    }
    if (!opt.aggregate_sum) {
        for (double& x : total) x /= double(opt.layers.size());
    }
    // One all-reduce of the per-token scores: each rank filled its own slots (§5.2 phase 2).
    comm.all_reduce(total.data(), total.size(), DType::f64, ReduceOp::sum);
    return total;
}

}  // namespace

void forward_replicated(Model& model, Communicator& comm, KvCache& cache, int key_begin,
                        float* hidden, int n, const int32_t* pos, const int32_t* row_slots,
                        int n_layers,
                        const std::function<void(int, const float*, const float*)>& on_layer) {
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    const int row = c.n_head_kv * c.head_dim;
    const int qd = c.n_head * c.head_dim;
    Buffer q = be.alloc_floats(size_t(std::max(n, 1)) * qd);
    Buffer k = be.alloc_floats(size_t(std::max(n, 1)) * row);
    Buffer v = be.alloc_floats(size_t(std::max(n, 1)) * row);
    Buffer out = be.alloc_floats(size_t(std::max(n, 1)) * qd);
    Buffer lse = be.alloc_floats(size_t(std::max(n, 1)) * c.n_head);
    for (int l = 0; l < n_layers; ++l) {
        model.layer_qkv(l, hidden, n, pos, q.data(), k.data(), v.data());
        if (row_slots) {
            for (int i = 0; i < n; ++i) {
                be.copy(cache.k(l) + size_t(row_slots[i]) * row, k.data() + size_t(i) * row,
                        row * sizeof(float));
                be.copy(cache.v(l) + size_t(row_slots[i]) * row, v.data() + size_t(i) * row,
                        row * sizeof(float));
            }
        }
        AttnParams ap;
        ap.q = q.data();
        ap.k = cache.k(l) + size_t(key_begin) * row;
        ap.v = cache.v(l) + size_t(key_begin) * row;
        ap.q_pos = pos;
        ap.k_pos = cache.pos_data() + key_begin;
        ap.n_q = n;
        ap.n_kv = cache.size() - key_begin;
        ap.n_head = c.n_head;
        ap.n_head_kv = c.n_head_kv;
        ap.head_dim = c.head_dim;
        ap.out = out.data();
        ap.lse = lse.data();
        if (ap.n_kv > 0) {
            be.attention(ap);
        } else {
            std::fill(out.data(), out.data() + size_t(n) * qd, 0.0f);
            std::fill(lse.data(), lse.data() + size_t(n) * c.n_head, -INFINITY);
        }
        merge_partials_allgather(comm, be, out.data(), lse.data(), n * c.n_head, c.head_dim);
        if (on_layer) on_layer(l, q.data(), lse.data());
        model.layer_post(l, hidden, out.data(), n);
    }
}

std::vector<int32_t> generate_replicated(Model& model, Communicator& comm, KvCache& cache,
                                         int key_begin, const std::vector<float>& first_logits,
                                         int32_t next_pos, const Config& cfg,
                                         const std::vector<int32_t>& stop_ids, bool* stopped) {
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    SamplingParams sp;
    sp.temperature = float(cfg.decode.temperature);
    sp.seed = cfg.decode.seed;
    sp.top_k = cfg.decode.top_k ? *cfg.decode.top_k : 0;
    Sampler sampler(sp);
    std::vector<float> logits = first_logits;
    std::vector<int32_t> out;
    *stopped = false;
    Buffer h = be.alloc_floats(c.n_embd);
    Buffer lg = be.alloc_floats(c.n_vocab);
    for (int step = 0; step < cfg.decode.max_new_tokens; ++step) {
        int32_t tok = comm.rank() == 0 ? sampler.sample(logits.data(), c.n_vocab) : 0;
        comm.broadcast(&tok, sizeof(tok), 0);  // rank 0 samples, everyone follows
        if (std::find(stop_ids.begin(), stop_ids.end(), tok) != stop_ids.end()) {
            *stopped = true;
            break;
        }
        out.push_back(tok);
        if (step + 1 == cfg.decode.max_new_tokens) break;
        IF_CHECK(next_pos < c.n_ctx_train,
                 "decode position " << next_pos << " exceeds the model's positions");
        int32_t slot = -1;
        if (comm.rank() == 0) slot = cache.append(1, &next_pos, nullptr);
        model.embed(&tok, 1, h.data());
        forward_replicated(model, comm, cache, comm.rank() == 0 ? 0 : key_begin, h.data(), 1,
                           &next_pos, comm.rank() == 0 ? &slot : nullptr, c.n_layer, nullptr);
        model.logits(h.data(), 1, lg.data());
        be.download(logits.data(), lg.data(), logits.size() * sizeof(float));
        ++next_pos;
    }
    return out;
}

void gather_phases(Communicator& comm, MethodResult& r) {
    const int P = comm.size();
    const size_t n = r.phases.size();
    std::vector<double> mine(n * 4), all(n * 4 * P);
    for (size_t i = 0; i < n; ++i) {
        mine[i * 4 + 0] = r.phases[i].ms;
        mine[i * 4 + 1] = double(r.phases[i].bytes_sent);
        mine[i * 4 + 2] = double(r.phases[i].bytes_recv);
        mine[i * 4 + 3] = r.phases[i].wait_ms;
    }
    comm.all_gather(mine.data(), mine.size() * sizeof(double), all.data());
    r.phases_per_rank.assign(n, std::vector<PhaseTime>(P));
    for (size_t i = 0; i < n; ++i) {
        for (int q = 0; q < P; ++q) {
            const double* x = all.data() + size_t(q) * n * 4 + i * 4;
            PhaseTime& p = r.phases_per_rank[i][q];
            p.name = r.phases[i].name;
            p.ms = x[0];
            p.bytes_sent = uint64_t(x[1]);
            p.bytes_recv = uint64_t(x[2]);
            p.wait_ms = x[3];
        }
    }
}

MethodResult run_method_sp(Model& model, const PreparedRequest& req, const Config& cfg,
                           Communicator& comm, const std::vector<int32_t>& stop_ids) {
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    const int P = comm.size();
    const int rank = comm.rank();
    const Config::Method method = cfg.method.name;
    IF_CHECK(method == Config::Method::none || method == Config::Method::infoflow ||
                 method == Config::Method::cacheblend || method == Config::Method::epic,
             "method.name = \"" << to_string(method) << "\" is not a sequence-parallel method");
    IF_CHECK(!cfg.method.reorder, "method.reorder = true runs on one rank only");
    const bool exact = cfg.parallel.exchange == Config::Exchange::exact;

    MethodResult r;
    r.method = to_string(method);
    r.ranks = P;
    r.context_tokens = req.context_tokens();
    r.suffix_tokens = int(req.suffix.size());
    const int T = r.context_tokens;
    const int Q = r.suffix_tokens;
    const int max_new = cfg.decode.max_new_tokens;
    IF_CHECK(T + Q + std::max(0, max_new - 1) <= c.n_ctx_train,
             "the request needs " << T + Q + std::max(0, max_new - 1)
                                  << " positions but the model has " << c.n_ctx_train);
    const int row = c.n_head_kv * c.head_dim;
    const int L = c.n_layer;
    SpClock clock(comm, r.phases);

    // ---- phase 1: shard prefill (no messages); this shard's chunks found in the KV store are
    // loaded instead (phase store_load, every rank reading the same file) ----
    if (!cfg.store.path.empty()) clock.begin("store_load");
    ChunkSource source(model, req, cfg);
    Shard sh;
    std::vector<int> sizes;
    for (const auto& ch : req.chunks) sizes.push_back(int(ch.size()));
    sh.place = place_chunks(sizes, P);
    const int first_chunk = sh.place.first_chunk[rank];
    const int end_chunk = sh.place.end_chunk[rank];
    std::vector<int> own_ids;
    for (int i = first_chunk; i < end_chunk; ++i) own_ids.push_back(i);
    if (source.uses_store()) {
        source.load(own_ids);
        clock.end();
    }
    clock.begin("shard_prefill");
    std::vector<ChunkKv> own = source.take(own_ids);
    for (int i = 0; i < req.n_chunks(); ++i) {
        if (i == 0) {
            sh.chunks.push_back(prefill_chunk(model, req.chunks[0], -1));
        } else if (i >= first_chunk && i < end_chunk) {
            sh.chunks.push_back(std::move(own[i - first_chunk]));
        } else {
            sh.chunks.push_back(shadow_chunk(req.chunks[i], req.sink_id));
        }
    }
    std::vector<int> ident(sh.chunks.size());
    std::iota(ident.begin(), ident.end(), 0);
    sh.gpos = global_positions(sh.chunks, ident);
    for (int i = 0, at = 0; i < req.n_chunks(); ++i) {
        sh.offsets.push_back(at);
        for (int t = 0; t < sh.chunks[i].size(); ++t) sh.chunk_of.push_back(i);
        at += sh.chunks[i].size();
    }
    sh.c0 = sh.chunks[0].size();
    sh.local_order.push_back(0);
    for (int i = first_chunk; i < end_chunk; ++i) sh.local_order.push_back(i);
    sh.own_begin = first_chunk < end_chunk ? sh.offsets[first_chunk] : 0;
    sh.own_end =
        first_chunk < end_chunk ? sh.offsets[first_chunk] + sh.place.shard_tokens[rank] : 0;
    std::vector<int32_t> local_pos;
    for (int ci : sh.local_order) {
        for (int t = 0; t < sh.chunks[ci].size(); ++t) {
            sh.slot_global.push_back(sh.offsets[ci] + t);
            local_pos.push_back(sh.gpos[sh.offsets[ci] + t]);
        }
    }
    KvCache cache = model.make_cache(int(local_pos.size()) + T + Q + max_new);
    assemble_cache(model, sh.chunks, sh.local_order, local_pos, nullptr, cache);
    auto local_slot = [&](int g) { return sh.c0 + (g - sh.own_begin); };
    clock.end();

    // ---- phase 2: scoring and selection (identical on every rank) ----
    clock.begin("scoring");
    std::vector<uint8_t> eligible(T);
    for (int j = 0; j < T; ++j) eligible[j] = sh.chunk_of[j] != 0;
    const int k_budget = recompute_budget(cfg.method.ratio, T);
    std::vector<int> selected;
    std::vector<float> h_blend;  // cacheblend: own tokens' hidden states after layer 0
    int first_layer = 0;
    if (method == Config::Method::infoflow && k_budget > 0) {
        ScoreOptions so;
        so.layers = resolve_scoring_layers(cfg.scoring.layers, c.n_layer);
        so.aggregate_sum = cfg.scoring.aggregate == Config::Aggregate::sum;
        so.layout = cfg.scoring.layout;
        const std::vector<double> score =
            score_sp(model, comm, sh, scoring_rows(req, cfg.scoring.query), so,
                     cfg.scoring.softmax == Config::Softmax::global);
        selected = select_top_k(score, sh.gpos, eligible, k_budget);
    } else if (method == Config::Method::epic) {
        std::vector<int> sz(sizes.begin(), sizes.end());
        selected = epic_selection(ident, sh.offsets, sz, cfg.epic.mode == Config::EpicMode::fixed,
                                  cfg.method.ratio, cfg.epic.k);
    } else if (method == Config::Method::cacheblend && k_budget > 0 && L > 1) {
        // Layer 0 exact for every context token (pass-Q over all ranks' keys), then the layer-1
        // deviation of each rank's own tokens, all-reduced into one T-vector.
        const int n_own = sh.own_end - sh.own_begin;
        std::vector<int32_t> toks, pos, slots;
        for (int g = sh.own_begin; g < sh.own_end; ++g) {
            toks.push_back(req.chunks[sh.chunk_of[g]][g - sh.offsets[sh.chunk_of[g]]]);
            pos.push_back(sh.gpos[g]);
            slots.push_back(local_slot(g));
        }
        const int qd = c.n_head * c.head_dim;
        Buffer h = be.alloc_floats(size_t(std::max(1, n_own)) * c.n_embd);
        Buffer q = be.alloc_floats(size_t(std::max(1, n_own)) * qd);
        Buffer k = be.alloc_floats(size_t(std::max(1, n_own)) * row);
        Buffer v = be.alloc_floats(size_t(std::max(1, n_own)) * row);
        Buffer out = be.alloc_floats(size_t(std::max(1, n_own)) * qd);
        Buffer lse = be.alloc_floats(size_t(std::max(1, n_own)) * c.n_head);
        model.embed(toks.data(), n_own, h.data());
        model.layer_qkv(0, h.data(), n_own, pos.data(), q.data(), k.data(), v.data());
        const int key_begin = rank == 0 ? 0 : sh.c0;
        AttnParams local;
        local.k = cache.k(0) + size_t(key_begin) * row;
        local.v = cache.v(0) + size_t(key_begin) * row;
        local.k_pos = cache.pos_data() + key_begin;
        local.n_kv = cache.size() - key_begin;
        local.n_head = c.n_head;
        local.n_head_kv = c.n_head_kv;
        local.head_dim = c.head_dim;
        pass_q_attention(comm, be, local, q.data(), pos.data(), n_own, out.data(), lse.data());
        model.layer_post(0, h.data(), out.data(), n_own);
        Buffer k1 = be.alloc_floats(size_t(std::max(1, n_own)) * row);
        Buffer v1 = be.alloc_floats(size_t(std::max(1, n_own)) * row);
        model.layer_kv(1, h.data(), n_own, pos.data(), k1.data(), v1.data());
        const bool use_k = cfg.cacheblend.metric == Config::BlendMetric::k;
        std::vector<double> dev(T, 0.0);
        std::vector<float> old_rows(size_t(std::max(1, n_own)) * row);
        for (int i = 0; i < n_own; ++i) {
            be.copy(old_rows.data() + size_t(i) * row,
                    (use_k ? cache.k(1) : cache.v(1)) + size_t(slots[i]) * row,
                    row * sizeof(float));
        }
        const std::vector<double> own_dev =
            kv_deviation(use_k ? k1.data() : v1.data(), old_rows.data(), n_own, row);
        for (int i = 0; i < n_own; ++i) dev[sh.own_begin + i] = own_dev[i];
        comm.all_reduce(dev.data(), dev.size(), DType::f64, ReduceOp::sum);
        selected = select_top_k(dev, sh.gpos, eligible, k_budget);
        for (int i = 0; i < n_own; ++i) {  // every own token's layer-1 K/V becomes the fresh one
            be.copy(cache.k(1) + size_t(slots[i]) * row, k1.data() + size_t(i) * row,
                    row * sizeof(float));
            be.copy(cache.v(1) + size_t(slots[i]) * row, v1.data() + size_t(i) * row,
                    row * sizeof(float));
        }
        h_blend.assign(h.data(), h.data() + size_t(n_own) * c.n_embd);
        first_layer = 1;
    }
    clock.end();

    // ---- phase 3: selective recompute ----
    clock.begin("recompute");
    std::vector<int> own_s, foreign_s;
    std::vector<int> owner_count(P, 0);
    for (int g : selected) {
        const int owner = sh.place.chunk_rank[sh.chunk_of[g]];
        owner_count[owner]++;
        (owner == rank ? own_s : foreign_s).push_back(g);
    }
    const int n_own = int(own_s.size());
    std::vector<int32_t> own_tok, own_pos, own_slot;
    for (int g : own_s) {
        own_tok.push_back(req.chunks[sh.chunk_of[g]][g - sh.offsets[sh.chunk_of[g]]]);
        own_pos.push_back(sh.gpos[g]);
        own_slot.push_back(local_slot(g));
    }
    // "kv": every selected token of other ranks gets a slot here, filled layer by layer.
    if (!exact && !foreign_s.empty()) {
        // Slots in the order the all-gather delivers them: by owner rank, then by position.
        std::vector<int32_t> fpos;
        for (int p = 0; p < P; ++p) {
            if (p == rank) continue;
            for (int g : selected) {
                if (sh.place.chunk_rank[sh.chunk_of[g]] == p) fpos.push_back(sh.gpos[g]);
            }
        }
        cache.append(int(fpos.size()), fpos.data(), nullptr);
    }
    const int foreign_first = cache.size() - (exact ? 0 : int(foreign_s.size()));
    if (!selected.empty()) {
        const int qd = c.n_head * c.head_dim;
        Buffer h = be.alloc_floats(size_t(std::max(1, n_own)) * c.n_embd);
        Buffer q = be.alloc_floats(size_t(std::max(1, n_own)) * qd);
        Buffer kv = be.alloc_floats(size_t(std::max(1, n_own)) * 2 * row);
        Buffer out = be.alloc_floats(size_t(std::max(1, n_own)) * qd);
        Buffer lse = be.alloc_floats(size_t(std::max(1, n_own)) * c.n_head);
        if (first_layer == 0) {
            model.embed(own_tok.data(), n_own, h.data());
        } else {
            for (int i = 0; i < n_own; ++i) {
                const int at = own_s[i] - sh.own_begin;
                be.copy(h.data() + size_t(i) * c.n_embd, h_blend.data() + size_t(at) * c.n_embd,
                        sizeof(float) * c.n_embd);
            }
        }
        std::vector<size_t> recv_bytes(P);
        for (int p = 0; p < P; ++p)
            recv_bytes[p] = size_t(owner_count[p]) * 2 * row * sizeof(float);
        std::vector<float> gathered(std::max<size_t>(1, selected.size() * 2 * row));
        // Other ranks' blocks of `gathered` ([k rows | v rows] per rank) into their slots.
        auto store_foreign = [&](int l) {
            int fslot = foreign_first;
            size_t off = 0;
            for (int p = 0; p < P; ++p) {
                const int np = owner_count[p];
                if (p != rank) {
                    const float* kp = gathered.data() + off;
                    const float* vp = kp + size_t(np) * row;
                    for (int i = 0; i < np; ++i, ++fslot) {
                        be.copy(cache.k(l) + size_t(fslot) * row, kp + size_t(i) * row,
                                row * sizeof(float));
                        be.copy(cache.v(l) + size_t(fslot) * row, vp + size_t(i) * row,
                                row * sizeof(float));
                    }
                }
                off += size_t(np) * 2 * row;
            }
        };
        const int key_begin = rank == 0 ? 0 : sh.c0;
        // Layers before first_layer (cacheblend: layer 0) are not recomputed; in "kv" mode the
        // other ranks still need those layers' K/V of the selected tokens.
        for (int l = 0; l < first_layer && !exact; ++l) {
            for (int i = 0; i < n_own; ++i) {
                be.copy(kv.data() + size_t(i) * row, cache.k(l) + size_t(own_slot[i]) * row,
                        row * sizeof(float));
                be.copy(kv.data() + size_t(n_own + i) * row, cache.v(l) + size_t(own_slot[i]) * row,
                        row * sizeof(float));
            }
            comm.all_gather_v(kv.data(), recv_bytes[rank], gathered.data(), recv_bytes);
            store_foreign(l);
        }
        for (int l = first_layer; l < L; ++l) {
            float* k_own = kv.data();
            float* v_own = kv.data() + size_t(n_own) * row;
            model.layer_qkv(l, h.data(), n_own, own_pos.data(), q.data(), k_own, v_own);
            for (int i = 0; i < n_own; ++i) {  // new K/V into the cache first (§3.5)
                be.copy(cache.k(l) + size_t(own_slot[i]) * row, k_own + size_t(i) * row,
                        row * sizeof(float));
                be.copy(cache.v(l) + size_t(own_slot[i]) * row, v_own + size_t(i) * row,
                        row * sizeof(float));
            }
            AttnParams ap;
            ap.n_head = c.n_head;
            ap.n_head_kv = c.n_head_kv;
            ap.head_dim = c.head_dim;
            if (!exact) {
                // All-gather of the selected tokens' K/V: |S|·2·H_kv·D elements per layer.
                comm.all_gather_v(kv.data(), recv_bytes[rank], gathered.data(), recv_bytes);
                store_foreign(l);
                ap.q = q.data();
                ap.k = cache.k(l);
                ap.v = cache.v(l);
                ap.q_pos = own_pos.data();
                ap.k_pos = cache.pos_data();
                ap.n_q = n_own;
                ap.n_kv = cache.size();
                ap.out = out.data();
                be.attention(ap);
            } else {
                ap.k = cache.k(l) + size_t(key_begin) * row;
                ap.v = cache.v(l) + size_t(key_begin) * row;
                ap.k_pos = cache.pos_data() + key_begin;
                ap.n_kv = cache.size() - key_begin;
                pass_q_attention(comm, be, ap, q.data(), own_pos.data(), n_own, out.data(),
                                 lse.data());
            }
            model.layer_post(l, h.data(), out.data(), n_own);
        }
    }
    for (int g : selected) r.selected_positions.push_back(sh.gpos[g]);
    clock.end();

    // ---- phase 4: the answer on rank 0 ----
    std::vector<int32_t> spos(Q);
    std::iota(spos.begin(), spos.end(), T);
    r.chunk_order = ident;
    if (!exact) {
        clock.begin("suffix_prefill");
        if (rank == 0) r.first_logits = model.forward(cache, req.suffix, spos);
        clock.end();
        r.ttft_ms = 0.0;
        for (const auto& p : r.phases) r.ttft_ms += p.ms;
        clock.begin("decode");
        if (rank == 0) {
            GenerateOptions g;
            g.max_new_tokens = max_new;
            g.stop_ids = stop_ids;
            g.sampling.temperature = float(cfg.decode.temperature);
            g.sampling.seed = cfg.decode.seed;
            g.sampling.top_k = cfg.decode.top_k ? *cfg.decode.top_k : 0;
            const GenerateResult gr = generate(model, cache, r.first_logits, T + Q, g);
            r.answer = gr.tokens;
            r.stopped = gr.stopped;
        }
        clock.end();
    } else {
        // SPMD suffix prefill and decode, partial attention merged across ranks.
        clock.begin("suffix_prefill");
        const int key_begin = rank == 0 ? 0 : sh.c0;
        std::vector<int32_t> slots;
        if (rank == 0) {
            const int first = cache.append(Q, spos.data(), nullptr);
            for (int i = 0; i < Q; ++i) slots.push_back(first + i);
        }
        Buffer h = be.alloc_floats(size_t(Q) * c.n_embd);
        model.embed(req.suffix.data(), Q, h.data());
        forward_replicated(model, comm, cache, key_begin, h.data(), Q, spos.data(),
                           rank == 0 ? slots.data() : nullptr, L, nullptr);
        Buffer lg = be.alloc_floats(c.n_vocab);
        model.logits(h.data() + size_t(Q - 1) * c.n_embd, 1, lg.data());
        r.first_logits.resize(c.n_vocab);
        be.download(r.first_logits.data(), lg.data(), r.first_logits.size() * sizeof(float));
        clock.end();
        r.ttft_ms = 0.0;
        for (const auto& p : r.phases) r.ttft_ms += p.ms;
        clock.begin("decode");
        r.answer = generate_replicated(model, comm, cache, key_begin, r.first_logits, T + Q, cfg,
                                       stop_ids, &r.stopped);
        clock.end();
    }
    if (source.uses_store() && cfg.store.mode == Config::StoreMode::read_write) {
        clock.begin(
            "store_write");  // each rank adds its own prefilled chunks (the lock serializes)
        source.save(sh.chunks);
        clock.end();
    }
    if (source.uses_store()) {  // the same on every rank (the configs agree)
        double use[4] = {double(source.use().chunks_loaded), double(source.use().tokens_loaded),
                         double(source.use().bytes_loaded), double(source.use().chunks_added)};
        comm.all_reduce(use, 4, DType::f64, ReduceOp::sum);
        r.store_chunks = int(use[0]);
        r.store_tokens = int(use[1]);
        r.store_bytes = uint64_t(use[2]);
        r.store_added = int(use[3]);
    }
    gather_phases(comm, r);
    return r;
}

}  // namespace infoflow
