// Phase 3 of the sequence-parallel method (docs/design.md §5.2): selective recompute (§3.5) of S,
// each rank running its own selected tokens through the layers, in one of two exchange modes: "kv"
// all-gathers the selected tokens' new K/V per layer (|S|·2·H_kv·D elements in total), so every
// rank's cache holds all of S; "exact" sends the selected queries instead (pass-Q) and merges the
// partial attention of every rank's keys.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "runtime/core/pieces.h"
#include "runtime/parallel/comm_stage.h"
#include "runtime/parallel/dist_attention.h"
#include "runtime/parallel/kv_exchange.h"
#include "runtime/parallel/recompute_balance.h"
#include "runtime/parallel/sp_phases.h"

namespace infoflow {
namespace {

// This rank's share of S and the scratch its layers run in.
struct OwnRows {
    int n = 0;                       // own selected tokens
    std::vector<int32_t> pos, slot;  // [n] global positions, local cache slots
    std::vector<int> owner_count;    // [P] selected tokens per owner rank
    Buffer h, q, kv, out, lse;       // [n, n_embd], [n, qd], [k rows | v rows], [n, qd], [n, H]
    float* k() { return kv.data(); }
    float* v(int row) { return kv.data() + size_t(n) * row; }
};

// Own selected tokens in position order, their input to sel.first_layer (embeddings, or
// CacheBlend's layer-0 output) and scratch.
OwnRows own_rows(Model& model, int P, const PreparedRequest& req, const Shard& sh,
                 const SpSelection& sel) {
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    OwnRows o;
    o.owner_count.assign(P, 0);
    std::vector<int32_t> tok;
    std::vector<int> own;
    for (int g : sel.selected) {
        o.owner_count[sh.owner(g)]++;
        if (sh.owner(g) != sh.rank) continue;
        own.push_back(g);
        tok.push_back(sh.token(req, g));
        o.pos.push_back(sh.gpos[g]);
        o.slot.push_back(sh.local_slot(g));
    }
    o.n = int(own.size());
    const size_t m = size_t(std::max(1, o.n));
    const int qd = c.n_head * c.head_dim;
    const int row = c.n_head_kv * c.head_dim;
    o.h = be.alloc_floats(m * c.n_embd);
    o.q = be.alloc_floats(m * qd);
    o.kv = be.alloc_floats(m * 2 * row);
    o.out = be.alloc_floats(m * qd);
    o.lse = be.alloc_floats(m * c.n_head);
    if (sel.first_layer == 0) {
        model.embed(tok.data(), o.n, o.h.data());
    } else {
        for (int i = 0; i < o.n; ++i) {
            const int at = own[i] - sh.own_begin;
            be.copy(o.h.data() + size_t(i) * c.n_embd,
                    sel.own_hidden.data() + size_t(at) * c.n_embd, sizeof(float) * c.n_embd);
        }
    }
    return o;
}

// "kv": slots for every other rank's selected tokens, appended in owner rank order, then by
// position; returns each selected token's slot on this rank ([|S|], index into sel.selected).
std::vector<int32_t> kv_slots(const Shard& sh, const SpSelection& sel, int P, KvCache& cache) {
    const int n = int(sel.selected.size());
    std::vector<int32_t> slot(n, -1), fpos;
    for (int i = 0; i < n; ++i) {
        if (sh.owner(sel.selected[i]) == sh.rank) slot[i] = sh.local_slot(sel.selected[i]);
    }
    for (int p = 0; p < P; ++p) {
        if (p == sh.rank) continue;
        for (int g : sel.selected) {
            if (sh.owner(g) == p) fpos.push_back(sh.gpos[g]);
        }
    }
    if (fpos.empty()) return slot;
    int next = cache.append(int(fpos.size()), fpos.data(), nullptr);
    for (int p = 0; p < P; ++p) {
        if (p == sh.rank) continue;
        for (int i = 0; i < n; ++i) {
            if (sh.owner(sel.selected[i]) == p) slot[i] = next++;
        }
    }
    return slot;
}

// The plan's inputs: each selected token's owner and its visible keys, split as the plan
// splits the work (the owner's shard; chunk 0 and the other shards' selected tokens).
std::vector<RecomputeToken> plan_tokens(const Shard& sh, const SpSelection& sel, int P) {
    const int n = int(sel.selected.size());
    std::vector<RecomputeToken> t(n);
    std::vector<int> shard_begin(P, 0), seen(P, 0);
    for (int p = 0; p < P; ++p) {
        const int fc = sh.place.first_chunk[p];
        shard_begin[p] = fc < int(sh.offsets.size()) ? sh.offsets[fc] : 0;
    }
    // Shards are contiguous position ranges and S is in position order: the selected tokens of
    // other shards before token i are those seen so far minus the owner's own.
    for (int i = 0; i < n; ++i) {
        const int g = sel.selected[i];
        const int o = sh.owner(g);
        t[i].owner = o;
        t[i].shard_keys = g - shard_begin[o] + 1;
        t[i].other_keys = sh.c0 + i - seen[o];
        seen[o]++;
    }
    return t;
}

// Who holds and who runs every selected token (indices into sel.selected), the same on every
// rank. runs[p]: the tokens rank p runs, its own first, then those it helps, grouped by owner
// rank; each group in position order. owns[p]: the tokens of p's shard.
struct KvWork {
    RecomputePlan plan;
    std::vector<std::vector<int>> runs, owns;
    std::vector<int> n_kept;    // [P] leading entries of runs[p] that p owns
    std::vector<int32_t> slot;  // [|S|] this rank's cache slot of each token
};

KvWork kv_work(const Shard& sh, const SpSelection& sel, int P, const RecomputeCost& cost,
               BalanceMode mode, const BalanceModel& bm, KvCache& cache) {
    KvWork w;
    w.plan = plan_recompute(plan_tokens(sh, sel, P), P, cost, mode, bm);
    const int n = int(sel.selected.size());
    w.runs.assign(P, {});
    w.owns.assign(P, {});
    w.n_kept.assign(P, 0);
    for (int i = 0; i < n; ++i) {
        const int o = sh.owner(sel.selected[i]);
        w.owns[o].push_back(i);
        if (w.plan.runner[i] == o) w.runs[o].push_back(i);
    }
    for (int p = 0; p < P; ++p) {
        w.n_kept[p] = int(w.runs[p].size());
        for (int o = 0; o < P; ++o) {
            if (o == p) continue;
            for (int i : w.owns[o]) {
                if (w.plan.runner[i] == p) w.runs[p].push_back(i);
            }
        }
    }
    w.slot = kv_slots(sh, sel, P, cache);
    return w;
}

// The backend's nominal compute rate for the plan (parallel.compute_gmacs = 0).
double nominal_gmacs(const Backend& be) {
    const double g = be.nominal_gmacs();
    return g > 0.0 ? g : 150000.0;  // a device that names none: an H100-class GPU
}

// The plan's cost model for this request (recompute_balance.h): the backend's nominal rate and
// the communicator's link, unless the config names them; *link_name says which link.
BalanceModel balance_model(Model& model, const Communicator& comm, const Config& cfg,
                           const KvCache& cache, const SpSelection& sel, std::string* link_name) {
    const ModelConfig& c = model.config();
    const Config::ParallelSection& par = cfg.parallel;
    BalanceModel m;
    m.gmacs = par.compute_gmacs > 0.0 ? par.compute_gmacs : nominal_gmacs(model.backend());
    Link link = comm.link();
    if (par.link != Config::LinkKind::automatic) {
        const LinkKind k = par.link == Config::LinkKind::shm   ? LinkKind::shm
                           : par.link == Config::LinkKind::tcp ? LinkKind::tcp
                           : par.link == Config::LinkKind::ib  ? LinkKind::ib
                                                               : LinkKind::nvlink;
        link = Link{k, link_defaults(k)};
    }
    if (par.link_alpha_us > 0.0) link.model.alpha_us = par.link_alpha_us;
    if (par.link_gbs > 0.0) link.model.beta_gbs = par.link_gbs;
    *link_name = link_kind_name(link.kind);
    m.link = link.model;
    m.layers = c.n_layer - sel.first_layer;
    m.owner_layers = sel.first_layer;
    m.kv_bytes = 2.0 * double(cache.row_bytes());
    m.query_bytes = 4.0 * c.n_head * c.head_dim;
    m.state_bytes = 4.0 * c.n_head * (c.head_dim + 1);
    m.input_bytes = sel.first_layer > 0 ? 4.0 * c.n_embd : 0.0;
    return m;
}

BalanceMode balance_mode(Config::Balance b) {
    return b == Config::Balance::on    ? BalanceMode::on
           : b == Config::Balance::off ? BalanceMode::off
                                       : BalanceMode::automatic;
}

// Helped tokens' second key set (chunk 0 and the selected tokens outside the owner's shard),
// copied per layer from the cache into a one-layer cache of their own, in position order.
class HelperKeys {
  public:
    HelperKeys(Backend& be, const ModelConfig& c, const KvCache& cache, int c0,
               const std::vector<int32_t>& slots)
        : cache_(cache),
          c0_(c0),
          slots_(slots),
          keys_(be, one_layer(c), std::max(1, c0 + int(slots.size())), cache.dtype()) {
        std::vector<int32_t> pos(cache.pos().begin(), cache.pos().begin() + c0);
        for (int32_t s : slots) pos.push_back(cache.pos()[s]);
        if (!pos.empty()) keys_.append(int(pos.size()), pos.data(), nullptr);
        const size_t n = std::max<size_t>(1, pos.size());
        k_ = be.alloc(n * cache.row_bytes());
        v_ = be.alloc(n * cache.row_bytes());
    }
    int size() const { return keys_.size(); }
    // Loads layer l; the op reads the keys from `p` (n_kv and k_pos set).
    void load(int layer, AttnParams& p) {
        const size_t rb = cache_.row_bytes();
        char* k = static_cast<char*>(static_cast<void*>(k_.data()));
        char* v = static_cast<char*>(static_cast<void*>(v_.data()));
        if (c0_ > 0) cache_.read_range_raw(layer, 0, c0_, k, v);
        const int m = int(slots_.size());
        if (m > 0) {
            cache_.read_rows_raw(layer, slots_.data(), k + size_t(c0_) * rb, v + size_t(c0_) * rb,
                                 m);
        }
        if (keys_.size() > 0) keys_.write_range_raw(0, 0, keys_.size(), k, v);
        keys_.attn_kv(0, 0, p);
        p.n_kv = keys_.size();
        p.k_pos = keys_.pos_data();
    }

  private:
    static ModelConfig one_layer(ModelConfig c) {
        c.n_layer = 1;
        return c;
    }
    const KvCache& cache_;
    int c0_;
    std::vector<int32_t> slots_;
    KvCache keys_;
    Buffer k_, v_;
};

// Attention of `n` queries over the keys `p` points at, or the empty state (0, -inf) when there
// is no key; `lse` may be nullptr (not wanted).
void partial_attention(Backend& be, AttnParams p, const float* q, const int32_t* pos, int n,
                       float* out, float* lse) {
    if (n == 0) return;
    if (p.n_kv == 0) {
        const std::vector<float> zero(size_t(n) * p.n_head * p.head_dim, 0.0f);
        const std::vector<float> ninf(size_t(n) * p.n_head, -INFINITY);
        be.upload(out, zero.data(), zero.size() * sizeof(float));
        if (lse) be.upload(lse, ninf.data(), ninf.size() * sizeof(float));
        return;
    }
    p.q = q;
    p.q_pos = pos;
    p.q_group = p.k_group = nullptr;
    p.n_q = n;
    p.out = out;
    p.lse = lse;
    be.attention(p);
}

// This rank's rows: the tokens it runs (its own first, then those it helps, grouped by owner
// rank), and the tokens of its shard that helpers run, grouped by helper rank (the order in
// which their queries arrive and their partials leave).
struct KvRows {
    int n = 0, n_kept = 0;
    std::vector<int32_t> tok, pos, slot;  // [n]
    std::vector<int> helped;              // tokens of this shard run by helpers
    std::vector<int32_t> helped_pos;      // [helped]
    std::vector<size_t> helped_count;     // [P] tokens of this shard each helper runs
    std::vector<size_t> help_count;       // [P] rows this rank runs for each owner
    std::vector<int> help_first;          // [P] the first of those rows
    int n_help() const { return n - n_kept; }
    int n_helped() const { return int(helped.size()); }
};

KvRows kv_rows(const PreparedRequest& req, const Shard& sh, const SpSelection& sel,
               const KvWork& w, int P) {
    const int me = sh.rank;
    const std::vector<int>& runs = w.runs[me];
    KvRows x;
    x.n = int(runs.size());
    x.n_kept = w.n_kept[me];
    x.helped_count.assign(P, 0);
    x.help_count.assign(P, 0);
    x.help_first.assign(P, x.n_kept);
    for (int r = 0; r < P; ++r) {
        if (r == me) continue;
        for (int i = w.n_kept[r]; i < int(w.runs[r].size()); ++i) {
            const int t = w.runs[r][i];
            if (sh.owner(sel.selected[t]) == me) {
                x.helped.push_back(t);
                x.helped_count[r]++;
            }
        }
    }
    for (int i = x.n_kept; i < x.n; ++i) x.help_count[sh.owner(sel.selected[runs[i]])]++;
    for (int o = 0, at = x.n_kept; o < P; ++o) {
        x.help_first[o] = at;
        at += int(x.help_count[o]);
    }
    for (int i = 0; i < x.n; ++i) {
        const int g = sel.selected[runs[i]];
        x.tok.push_back(sh.token(req, g));
        x.pos.push_back(sh.gpos[g]);
        x.slot.push_back(w.slot[runs[i]]);
    }
    for (int t : x.helped) x.helped_pos.push_back(sh.gpos[sel.selected[t]]);
    return x;
}

// The rows' scratch and the exchange buffers of the moved tokens: queries in, partials (out,
// then lse, per row) out and back.
struct KvBuffers {
    Buffer h, q, kv, out, lse;  // [n, n_embd], [n, qd], [k rows | v rows], [n, qd], [n, H]
    float* k_rows = nullptr;
    float* v_rows = nullptr;
    Buffer q_in, st_own, st_send, st_recv;
    std::vector<size_t> q_send, q_recv, st_sb, st_rb;  // [P] bytes to / from each rank
};

KvBuffers kv_buffers(Backend& be, const ModelConfig& c, int row, const KvRows& x, int P) {
    const int H = c.n_head, D = c.head_dim, qd = H * D;
    const size_t m = size_t(std::max(1, x.n)), state = size_t(H) * (D + 1);
    const size_t helped = size_t(x.n_helped()), help = size_t(x.n_help());
    KvBuffers b;
    b.h = be.alloc_floats(m * c.n_embd);
    b.q = be.alloc_floats(m * qd);
    b.kv = be.alloc_floats(m * 2 * row);
    b.out = be.alloc_floats(m * qd);
    b.lse = be.alloc_floats(m * H);
    b.k_rows = b.kv.data();
    b.v_rows = b.kv.data() + m * row;
    b.q_in = be.alloc_floats(std::max<size_t>(1, helped * qd));
    b.st_own = be.alloc_floats(std::max<size_t>(1, helped * state));
    b.st_send = be.alloc_floats(std::max<size_t>(1, helped * state));
    b.st_recv = be.alloc_floats(std::max<size_t>(1, help * state));
    b.q_send.resize(P);
    b.q_recv.resize(P);
    b.st_sb.resize(P);
    b.st_rb.resize(P);
    for (int p = 0; p < P; ++p) {
        b.q_send[p] = x.help_count[p] * qd * sizeof(float);
        b.q_recv[p] = x.helped_count[p] * qd * sizeof(float);
        b.st_sb[p] = x.helped_count[p] * state * sizeof(float);
        b.st_rb[p] = x.help_count[p] * state * sizeof(float);
    }
    return b;
}

// The rows' input to sel.first_layer: their embeddings, or CacheBlend's layer-0 output, which
// travels once from the owner to the helper of a moved token.
void load_inputs(Model& model, Communicator& comm, const Shard& sh, const SpSelection& sel,
                 const KvWork& w, const KvRows& x, KvBuffers& b) {
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    if (sel.first_layer == 0) {
        model.embed(x.tok.data(), x.n, b.h.data());
        return;
    }
    const std::vector<int>& runs = w.runs[sh.rank];
    for (int i = 0; i < x.n_kept; ++i) {
        const int at = sel.selected[runs[i]] - sh.own_begin;
        be.copy(b.h.data() + size_t(i) * c.n_embd, sel.own_hidden.data() + size_t(at) * c.n_embd,
                sizeof(float) * c.n_embd);
    }
    if (w.plan.moved == 0) return;
    const int P = comm.size();
    const size_t hb = sizeof(float) * c.n_embd;
    Buffer send = be.alloc(std::max<size_t>(1, size_t(x.n_helped()) * hb));
    std::vector<size_t> sb(P), rbytes(P);
    for (int i = 0; i < x.n_helped(); ++i) {
        const int at = sel.selected[x.helped[i]] - sh.own_begin;
        be.copy(static_cast<char*>(static_cast<void*>(send.data())) + size_t(i) * hb,
                sel.own_hidden.data() + size_t(at) * c.n_embd, hb);
    }
    for (int p = 0; p < P; ++p) {
        sb[p] = x.helped_count[p] * hb;
        rbytes[p] = x.help_count[p] * hb;
    }
    all_to_all_v_backend(comm, be, send.data(), sb, b.h.data() + size_t(x.n_kept) * c.n_embd,
                         rbytes);
}

// For each owner this rank helps: the second key set of its tokens (chunk 0 and the selected
// tokens outside the owner's shard).
std::vector<std::unique_ptr<HelperKeys>> helper_keys(Backend& be, const ModelConfig& c,
                                                     const KvCache& cache, const Shard& sh,
                                                     const SpSelection& sel, const KvWork& w,
                                                     const KvRows& x) {
    const int P = int(x.help_count.size());
    std::vector<std::unique_ptr<HelperKeys>> keys(P);
    for (int o = 0; o < P; ++o) {
        if (x.help_count[o] == 0) continue;
        std::vector<int32_t> slots;
        for (int i = 0; i < int(sel.selected.size()); ++i) {
            if (sh.owner(sel.selected[i]) != o) slots.push_back(w.slot[i]);
        }
        keys[o] = std::make_unique<HelperKeys>(be, c, cache, sh.c0, slots);
    }
    return keys;
}

// One layer of the moved tokens' attention after their queries arrived: as owner, the helped
// rows over this shard, their partials sent back; as helper, the rows run for other owners over
// the second key set, merged (§5.3) with the owner's partial.
void moved_attention(Backend& be, Communicator& comm, const ModelConfig& c, KvCache& cache,
                     const Shard& sh, int l, const KvRows& x, KvBuffers& b,
                     std::vector<std::unique_ptr<HelperKeys>>& keys, AttnParams& ap) {
    const int P = comm.size(), H = c.n_head, D = c.head_dim, qd = H * D;
    const int helped = x.n_helped();
    const size_t state = size_t(H) * (D + 1);
    cache.attn_kv(l, sh.c0, ap);
    ap.k_pos = cache.pos_data() + sh.c0;
    ap.n_kv = sh.own_end - sh.own_begin;
    partial_attention(be, ap, b.q_in.data(), x.helped_pos.data(), helped, b.st_own.data(),
                      b.st_own.data() + size_t(helped) * qd);
    for (int r = 0, at = 0; r < P; ++r) {  // packed per helper: its rows' out, then their lse
        const size_t cnt = x.helped_count[r];
        float* dst = b.st_send.data() + size_t(at) * state;
        be.copy(dst, b.st_own.data() + size_t(at) * qd, cnt * qd * sizeof(float));
        be.copy(dst + cnt * qd, b.st_own.data() + size_t(helped) * qd + size_t(at) * H,
                cnt * H * sizeof(float));
        at += int(cnt);
    }
    for (int o = 0; o < P; ++o) {
        if (!keys[o]) continue;
        const int at = x.help_first[o];
        keys[o]->load(l, ap);
        partial_attention(be, ap, b.q.data() + size_t(at) * qd, x.pos.data() + at,
                          int(x.help_count[o]), b.out.data() + size_t(at) * qd,
                          b.lse.data() + size_t(at) * H);
    }
    all_to_all_v_backend(comm, be, b.st_send.data(), b.st_sb, b.st_recv.data(), b.st_rb);
    for (int o = 0, blk = 0; o < P; ++o) {
        const size_t cnt = x.help_count[o];
        if (cnt == 0) continue;
        const int at = x.help_first[o];
        const float* s = b.st_recv.data() + size_t(blk) * state;
        be.lse_merge(b.out.data() + size_t(at) * qd, b.lse.data() + size_t(at) * H, s,
                     s + cnt * qd, int(cnt) * H, D);
        blk += int(cnt);
    }
}

void report_plan(const KvWork& w, const BalanceModel& bm, const std::string& link,
                 MethodResult* result) {
    if (!result) return;
    result->recompute_load = w.plan.load;
    result->recompute_load_owned = w.plan.owned;
    result->recompute_moved = w.plan.moved;
    RecomputePlanReport& rp = result->recompute_plan;
    rp.planned = true;
    rp.mode = balance_mode_name(w.plan.mode);
    rp.link = link;
    rp.alpha_us = bm.link.alpha_us;
    rp.beta_gbs = bm.link.beta_gbs;
    rp.gmacs = bm.gmacs;
    rp.model_ms = w.plan.cost.ms;
    rp.owned_model_ms = w.plan.owned_cost.ms;
    rp.sent = w.plan.cost.sent;
    rp.recv = w.plan.cost.recv;
    rp.owned_sent = w.plan.owned_cost.sent;
    rp.owned_recv = w.plan.owned_cost.recv;
}

}  // namespace

// The rest of one layer, with job serve's scope cutting rows (pieces.h; only where the products
// are row-independent, so the bits are those of one call), after the moved tokens' attention
// (its collective, the same on every rank whatever it cuts): the own tokens' attention and MLP
// a piece of rows at a time, then the moved tokens' MLP.
void own_rows_in_pieces(Model& model, const KvCache& cache, int l, const KvRows& x, KvBuffers& b,
                        AttnParams& ap, const std::vector<std::pair<int, int>>& own) {
    const ModelConfig& c = model.config();
    const int qd = c.n_head * c.head_dim;
    for (const auto& [a, e] : own) {
        cache.attn_kv(l, 0, ap);
        ap.k_pos = cache.pos_data();
        ap.n_kv = cache.size();
        partial_attention(model.backend(), ap, b.q.data() + size_t(a) * qd, x.pos.data() + a, e - a,
                          b.out.data() + size_t(a) * qd, nullptr);
        model.layer_post(l, b.h.data() + size_t(a) * c.n_embd, b.out.data() + size_t(a) * qd,
                         e - a);
        piece_done(double(e - a) / c.n_layer);
    }
    const int help = x.n - x.n_kept;
    if (help > 0) {
        model.layer_post(l, b.h.data() + size_t(x.n_kept) * c.n_embd,
                         b.out.data() + size_t(x.n_kept) * qd, help);
        piece_done(double(help) / c.n_layer);
    }
}

void recompute_kv(Model& model, Communicator& comm, const PreparedRequest& req, const Shard& sh,
                  const SpSelection& sel, KvCache& cache, const Config& cfg,
                  MethodResult* result) {
    if (sel.selected.empty()) return;
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    const int P = comm.size();
    std::string link;
    const BalanceModel bm = balance_model(model, comm, cfg, cache, sel, &link);
    const KvWork w = kv_work(sh, sel, P, recompute_cost(c), balance_mode(cfg.parallel.balance),
                             bm, cache);
    report_plan(w, bm, link, result);
    const KvRows x = kv_rows(req, sh, sel, w, P);
    KvBuffers b = kv_buffers(be, c, cache.row(), x, P);
    load_inputs(model, comm, sh, sel, w, x, b);
    // Layers before first_layer (CacheBlend: layer 0) are not recomputed; each owner sends its
    // selected tokens' K/V as they are. From first_layer on, each runner sends what it computed.
    std::unique_ptr<KvExchange> by_owner;
    if (sel.first_layer > 0)
        by_owner = std::make_unique<KvExchange>(comm, be, cache, w.slot, w.owns);
    KvExchange by_runner(comm, be, cache, w.slot, w.runs);
    auto keys = helper_keys(be, c, cache, sh, sel, w, x);
    const bool any_moved = w.plan.moved > 0;
    const int qd = c.n_head * c.head_dim;
    AttnParams ap;
    ap.n_head = c.n_head;
    ap.n_head_kv = c.n_head_kv;
    ap.head_dim = c.head_dim;
    // Its collectives wait with every row in b's buffers, none in the Model's scratch: job
    // serve's decode steps may run inside them (pieces.h).
    const PieceWaits waits;
    for (int l = 0; l < c.n_layer; ++l) {
        if (l < sel.first_layer) {
            by_owner->run(l);
            continue;
        }
        // New K/V go into the cache first (§3.5), then to every other rank.
        model.layer_qkv(l, b.h.data(), x.n, x.pos.data(), b.q.data(), b.k_rows, b.v_rows);
        cache.write_rows(l, x.slot.data(), b.k_rows, b.v_rows, x.n);
        by_runner.run(l);
        if (any_moved) {  // moved tokens' queries to their owners
            all_to_all_v_backend(comm, be, b.q.data() + size_t(x.n_kept) * qd, b.q_send,
                                 b.q_in.data(), b.q_recv);
        }
        const std::vector<std::pair<int, int>> own = piece_ranges(x.n_kept);
        if (own.size() <= 1) {  // the layer in one piece
            // Own tokens: every key this rank holds; their outputs are final (no lse needed).
            cache.attn_kv(l, 0, ap);
            ap.k_pos = cache.pos_data();
            ap.n_kv = cache.size();
            partial_attention(be, ap, b.q.data(), x.pos.data(), x.n_kept, b.out.data(), nullptr);
            if (any_moved) moved_attention(be, comm, c, cache, sh, l, x, b, keys, ap);
            model.layer_post(l, b.h.data(), b.out.data(), x.n);
            piece_done(double(x.n) / c.n_layer);  // a layer at a time (job serve, pieces.h)
        } else {
            if (any_moved) moved_attention(be, comm, c, cache, sh, l, x, b, keys, ap);
            own_rows_in_pieces(model, cache, l, x, b, ap, own);
        }
    }
}

void recompute_exact(Model& model, Communicator& comm, const PreparedRequest& req, const Shard& sh,
                     const SpSelection& sel, KvCache& cache) {
    if (sel.selected.empty()) return;
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    const int row = cache.row();
    OwnRows o = own_rows(model, comm.size(), req, sh, sel);
    AttnParams local;  // this rank's keys; the queries come from every rank
    local.n_head = c.n_head;
    local.n_head_kv = c.n_head_kv;
    local.head_dim = c.head_dim;
    for (int l = sel.first_layer; l < c.n_layer; ++l) {
        model.layer_qkv(l, o.h.data(), o.n, o.pos.data(), o.q.data(), o.k(), o.v(row));
        cache.write_rows(l, o.slot.data(), o.k(), o.v(row), o.n);  // new K/V first (§3.5)
        cache.attn_kv(l, sh.key_begin(), local);
        local.k_pos = cache.pos_data() + sh.key_begin();
        local.n_kv = cache.size() - sh.key_begin();
        pass_q_attention(comm, be, local, o.q.data(), o.pos.data(), o.n, o.out.data(),
                         o.lse.data());
        model.layer_post(l, o.h.data(), o.out.data(), o.n);
        piece_done(double(o.n) / c.n_layer);
    }
}

void share_selected_kv(Model& model, Communicator& comm, const Shard& sh, const SpSelection& sel,
                       KvCache& cache) {
    if (sel.selected.empty()) return;
    const int P = comm.size();
    std::vector<std::vector<int>> owns(P);
    for (int i = 0; i < int(sel.selected.size()); ++i) owns[sh.owner(sel.selected[i])].push_back(i);
    KvExchange by_owner(comm, model.backend(), cache, kv_slots(sh, sel, P, cache), owns);
    for (int l = 0; l < model.config().n_layer; ++l) by_owner.run(l);
}

}  // namespace infoflow
