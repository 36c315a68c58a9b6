// Phase 3 of the sequence-parallel method (docs/design.md §5.2): selective recompute (§3.5) of S,
// each rank running its own selected tokens through the layers, in one of two exchange modes: "kv"
// all-gathers the selected tokens' new K/V per layer (|S|·2·H_kv·D elements in total), so every
// rank's cache holds all of S; "exact" sends the selected queries instead (pass-Q) and merges the
// partial attention of every rank's keys.
#include <algorithm>
#include <cmath>
#include <memory>

#include "runtime/parallel/comm_stage.h"
#include "runtime/parallel/dist_attention.h"
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
               bool balance, KvCache& cache) {
    KvWork w;
    w.plan = plan_recompute(plan_tokens(sh, sel, P), P, cost, balance);
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

// The tokens of `lists[p]` travel from rank p, read from its cache at layer l, to every other
// rank's cache (all-gather of [k rows | v rows] in the storage type, so every copy is
// bit-identical).
class KvExchange {
  public:
    KvExchange(Communicator& comm, Backend& be, KvCache& cache, const std::vector<int32_t>& slot,
               const std::vector<std::vector<int>>& lists)
        : comm_(comm), be_(be), cache_(cache), rb_(cache.row_bytes()) {
        const int P = comm.size();
        size_t total = 0;
        slots_.resize(P);
        bytes_.resize(P);
        for (int p = 0; p < P; ++p) {
            for (int i : lists[p]) slots_[p].push_back(slot[i]);
            bytes_[p] = lists[p].size() * 2 * rb_;
            total += bytes_[p];
        }
        send_ = be.alloc(std::max<size_t>(1, bytes_[comm.rank()]));
        gathered_ = be.alloc(std::max<size_t>(1, total));
    }
    void run(int layer) {
        const int P = comm_.size(), me = comm_.rank();
        char* send = bytes(send_);
        const int n = int(slots_[me].size());
        cache_.read_rows_raw(layer, slots_[me].data(), send, send + size_t(n) * rb_, n);
        all_gather_v_backend(comm_, be_, send_.data(), bytes_[me], gathered_.data(), bytes_);
        const char* block = bytes(gathered_);
        for (int p = 0; p < P; ++p) {
            const int np = int(slots_[p].size());
            if (p != me) {
                for (const SlotRun& r : slot_runs(slots_[p].data(), np)) {
                    cache_.write_range_raw(layer, r.slot, r.n, block + size_t(r.row) * rb_,
                                           block + (size_t(np) + r.row) * rb_);
                }
            }
            block += bytes_[p];
        }
    }

  private:
    static char* bytes(Buffer& b) { return static_cast<char*>(static_cast<void*>(b.data())); }
    Communicator& comm_;
    Backend& be_;
    KvCache& cache_;
    size_t rb_;
    std::vector<std::vector<int32_t>> slots_;
    std::vector<size_t> bytes_;
    Buffer send_, gathered_;
};

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

}  // namespace

void recompute_kv(Model& model, Communicator& comm, const PreparedRequest& req, const Shard& sh,
                  const SpSelection& sel, KvCache& cache, bool balance, MethodResult* result) {
    if (sel.selected.empty()) return;
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    const int P = comm.size(), me = sh.rank, row = cache.row();
    const int H = c.n_head, D = c.head_dim, qd = H * D;
    KvWork w = kv_work(sh, sel, P, recompute_cost(c), balance, cache);
    if (result) {
        result->recompute_load = w.plan.load;
        result->recompute_load_owned = w.plan.owned;
        result->recompute_moved = w.plan.moved;
    }
    const std::vector<int>& runs = w.runs[me];
    const int n = int(runs.size()), n_kept = w.n_kept[me];
    const int n_help = n - n_kept;
    // Tokens of this shard that helpers run, grouped by helper rank (the order in which their
    // queries arrive and their partials leave).
    std::vector<int> helped;
    std::vector<size_t> helped_count(P, 0), help_count(P, 0);
    for (int r = 0; r < P; ++r) {
        if (r == me) continue;
        for (int i = w.n_kept[r]; i < int(w.runs[r].size()); ++i) {
            const int t = w.runs[r][i];
            if (sh.owner(sel.selected[t]) == me) {
                helped.push_back(t);
                helped_count[r]++;
            }
        }
    }
    for (int i = n_kept; i < n; ++i) help_count[sh.owner(sel.selected[runs[i]])]++;
    const int n_helped = int(helped.size());

    // This rank's rows: tokens, positions, slots, input to sel.first_layer.
    std::vector<int32_t> tok(n), pos(n), slot(n), helped_pos(n_helped);
    for (int i = 0; i < n; ++i) {
        const int g = sel.selected[runs[i]];
        tok[i] = sh.token(req, g);
        pos[i] = sh.gpos[g];
        slot[i] = w.slot[runs[i]];
    }
    for (int i = 0; i < n_helped; ++i) helped_pos[i] = sh.gpos[sel.selected[helped[i]]];
    const size_t m = size_t(std::max(1, n));
    Buffer h = be.alloc_floats(m * c.n_embd);
    Buffer q = be.alloc_floats(m * qd);
    Buffer kv = be.alloc_floats(m * 2 * row);
    Buffer out = be.alloc_floats(m * qd);
    Buffer lse = be.alloc_floats(m * H);
    float* k_rows = kv.data();
    float* v_rows = kv.data() + m * row;
    const bool any_moved = w.plan.moved > 0;
    if (sel.first_layer == 0) {
        model.embed(tok.data(), n, h.data());
    } else {
        for (int i = 0; i < n_kept; ++i) {
            const int at = sel.selected[runs[i]] - sh.own_begin;
            be.copy(h.data() + size_t(i) * c.n_embd, sel.own_hidden.data() + size_t(at) * c.n_embd,
                    sizeof(float) * c.n_embd);
        }
        if (any_moved) {  // helped tokens' input travels once from owner to helper
            const size_t hb = sizeof(float) * c.n_embd;
            Buffer send = be.alloc(std::max<size_t>(1, size_t(n_helped) * hb));
            std::vector<size_t> sb(P), rbytes(P);
            for (int i = 0; i < n_helped; ++i) {
                const int at = sel.selected[helped[i]] - sh.own_begin;
                be.copy(static_cast<char*>(static_cast<void*>(send.data())) + size_t(i) * hb,
                        sel.own_hidden.data() + size_t(at) * c.n_embd, hb);
            }
            for (int p = 0; p < P; ++p) {
                sb[p] = helped_count[p] * hb;
                rbytes[p] = help_count[p] * hb;
            }
            all_to_all_v_backend(comm, be, send.data(), sb, h.data() + size_t(n_kept) * c.n_embd,
                                 rbytes);
        }
    }

    // Layers before first_layer (CacheBlend: layer 0) are not recomputed; each owner sends its
    // selected tokens' K/V as they are. From first_layer on, each runner sends what it computed.
    std::unique_ptr<KvExchange> by_owner;
    if (sel.first_layer > 0)
        by_owner = std::make_unique<KvExchange>(comm, be, cache, w.slot, w.owns);
    KvExchange by_runner(comm, be, cache, w.slot, w.runs);

    // Helped tokens: the second key set, per owner, and the exchange buffers of the queries (to
    // the owners) and the partials (back to the helpers).
    std::vector<std::unique_ptr<HelperKeys>> helper_keys(P);
    std::vector<int> help_first(P, n_kept);
    for (int o = 0, at = n_kept; o < P; ++o) {
        help_first[o] = at;
        at += int(help_count[o]);
        if (help_count[o] == 0) continue;
        std::vector<int32_t> keys;  // selected tokens outside o's shard
        for (int i = 0; i < int(sel.selected.size()); ++i) {
            if (sh.owner(sel.selected[i]) != o) keys.push_back(w.slot[i]);
        }
        helper_keys[o] = std::make_unique<HelperKeys>(be, c, cache, sh.c0, keys);
    }
    const size_t state = size_t(H) * (D + 1);  // a partial per row: out, then lse
    Buffer q_in = be.alloc_floats(std::max<size_t>(1, size_t(n_helped) * qd));
    Buffer st_own = be.alloc_floats(std::max<size_t>(1, size_t(n_helped) * state));
    Buffer st_send = be.alloc_floats(std::max<size_t>(1, size_t(n_helped) * state));
    Buffer st_recv = be.alloc_floats(std::max<size_t>(1, size_t(n_help) * state));
    std::vector<size_t> q_send(P), q_recv(P), st_sb(P), st_rb(P);
    for (int p = 0; p < P; ++p) {
        q_send[p] = help_count[p] * qd * sizeof(float);
        q_recv[p] = helped_count[p] * qd * sizeof(float);
        st_sb[p] = helped_count[p] * state * sizeof(float);
        st_rb[p] = help_count[p] * state * sizeof(float);
    }

    AttnParams ap;
    ap.n_head = c.n_head;
    ap.n_head_kv = c.n_head_kv;
    ap.head_dim = c.head_dim;
    const int own_len = sh.own_end - sh.own_begin;
    for (int l = 0; l < c.n_layer; ++l) {
        if (l < sel.first_layer) {
            by_owner->run(l);
            continue;
        }
        // New K/V go into the cache first (§3.5), then to every other rank.
        model.layer_qkv(l, h.data(), n, pos.data(), q.data(), k_rows, v_rows);
        cache.write_rows(l, slot.data(), k_rows, v_rows, n);
        by_runner.run(l);
        if (any_moved) {  // helped tokens' queries to their owners
            all_to_all_v_backend(comm, be, q.data() + size_t(n_kept) * qd, q_send, q_in.data(),
                                 q_recv);
        }
        // Own tokens: every key this rank holds.
        cache.attn_kv(l, 0, ap);
        ap.k_pos = cache.pos_data();
        ap.n_kv = cache.size();
        // Their outputs are final: no normalizer to merge, so none is computed.
        partial_attention(be, ap, q.data(), pos.data(), n_kept, out.data(), nullptr);
        if (!any_moved) {
            model.layer_post(l, h.data(), out.data(), n);
            continue;
        }
        // Tokens of this shard run by helpers: their attention over this shard.
        cache.attn_kv(l, sh.c0, ap);
        ap.k_pos = cache.pos_data() + sh.c0;
        ap.n_kv = own_len;
        partial_attention(be, ap, q_in.data(), helped_pos.data(), n_helped, st_own.data(),
                          st_own.data() + size_t(n_helped) * qd);
        // Packed per helper: its rows' out, then their lse.
        for (int r = 0, at = 0; r < P; ++r) {
            const size_t cnt = helped_count[r];
            float* dst = st_send.data() + size_t(at) * state;
            be.copy(dst, st_own.data() + size_t(at) * qd, cnt * qd * sizeof(float));
            be.copy(dst + cnt * qd, st_own.data() + size_t(n_helped) * qd + size_t(at) * H,
                    cnt * H * sizeof(float));
            at += int(cnt);
        }
        // Tokens this rank helps: their attention over the second key set, per owner.
        for (int o = 0; o < P; ++o) {
            if (!helper_keys[o]) continue;
            const int at = help_first[o];
            helper_keys[o]->load(l, ap);
            partial_attention(be, ap, q.data() + size_t(at) * qd, pos.data() + at,
                              int(help_count[o]), out.data() + size_t(at) * qd,
                              lse.data() + size_t(at) * H);
        }
        all_to_all_v_backend(comm, be, st_send.data(), st_sb, st_recv.data(), st_rb);
        for (int o = 0, blk = 0; o < P; ++o) {
            const size_t cnt = help_count[o];
            if (cnt == 0) continue;
            const int at = help_first[o];
            const float* s = st_recv.data() + size_t(blk) * state;
            be.lse_merge(out.data() + size_t(at) * qd, lse.data() + size_t(at) * H, s, s + cnt * qd,
                         int(cnt) * H, D);
            blk += int(cnt);
        }
        model.layer_post(l, h.data(), out.data(), n);
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
    }
}

}  // namespace infoflow
