// Phase 3 of the sequence-parallel method in the whole-context exchanges (docs/design.md §5.2):
// "gather" and "compact-*". After the selection every rank gathers every context token's K/V
// once — the unselected ones never change again, so one all-gather carries them, as stored or
// as compact codes (kv_codec.h) — and then any rank can run any selected token over every key
// with no further partial states: S is dealt out in P contiguous runs of equal work and only the
// new K/V of S travel per layer, as in "kv". The answer then runs on rank 0 over its cache.
#include <algorithm>
#include <memory>

#include "runtime/method/kv_codec.h"
#include "runtime/parallel/comm_stage.h"
#include "runtime/parallel/kv_exchange.h"
#include "runtime/parallel/recompute_balance.h"
#include "runtime/parallel/sp_phases.h"

namespace infoflow {
namespace {

char* bytes_of(Buffer& b) { return static_cast<char*>(static_cast<void*>(b.data())); }

// Rows of `layers` layers from the shard cache's `local` slots into `full`'s `global` slots
// (sorted), as stored.
void copy_rows(const KvCache& shard_cache, const std::vector<int32_t>& local,
               const std::vector<int32_t>& global, int layers, KvCache& full) {
    const int n = int(local.size());
    if (n == 0 || layers == 0) return;
    const size_t rb = full.row_bytes();
    Backend& be = full.backend();
    Buffer k = be.alloc(size_t(n) * rb), v = be.alloc(size_t(n) * rb);
    char* kp = bytes_of(k);
    char* vp = bytes_of(v);
    for (int l = 0; l < layers; ++l) {
        shard_cache.read_rows_raw(l, local.data(), kp, vp, n);
        for (const SlotRun& r : slot_runs(global.data(), n)) {
            full.write_range_raw(l, r.slot, r.n, kp + size_t(r.row) * rb, vp + size_t(r.row) * rb);
        }
    }
}

// Attention of `n` queries over every slot of `cache` (lse not wanted); nothing when n = 0.
void attend_all(Backend& be, const ModelConfig& c, const KvCache& cache, int layer, const float* q,
                const int32_t* pos, int n, float* out) {
    if (n == 0) return;
    AttnParams ap;
    cache.attn_kv(layer, 0, ap);
    ap.q = q;
    ap.q_pos = pos;
    ap.k_pos = cache.pos_data();
    ap.n_q = n;
    ap.n_kv = cache.size();
    ap.n_head = c.n_head;
    ap.n_head_kv = c.n_head_kv;
    ap.head_dim = c.head_dim;
    ap.out = out;
    be.attention(ap);
}

// CacheBlend's layer-1 inputs of the tokens this rank runs, from their owners (all-to-all-v:
// each owner sends, to each runner, the rows of that runner's tokens it owns, in S order).
void load_owned_inputs(Model& model, Communicator& comm, const Shard& sh, const SpSelection& sel,
                       const std::vector<std::vector<int>>& runs, float* h /*[runs[me], n_embd]*/) {
    const int P = comm.size(), me = comm.rank();
    const int E = model.config().n_embd;
    const size_t hb = sizeof(float) * E;
    Backend& be = model.backend();
    std::vector<size_t> sb(P, 0), rbytes(P, 0);
    std::vector<size_t> row_of;  // arrival j (by owner rank, then S order) -> row in runs[me]
    for (int o = 0; o < P; ++o) {
        for (size_t row = 0; row < runs[me].size(); ++row) {
            if (sh.owner(sel.selected[runs[me][row]]) != o) continue;
            row_of.push_back(row);
            rbytes[o] += hb;
        }
    }
    std::vector<int> out;  // the own tokens' inputs, in send order
    for (int r = 0; r < P; ++r) {
        for (int i : runs[r]) {
            if (sh.owner(sel.selected[i]) != me) continue;
            out.push_back(sel.selected[i]);
            sb[r] += hb;
        }
    }
    Buffer send = be.alloc(std::max<size_t>(1, out.size() * hb));
    Buffer recv = be.alloc(std::max<size_t>(1, row_of.size() * hb));
    for (size_t j = 0; j < out.size(); ++j) {
        be.copy(bytes_of(send) + j * hb, sel.own_hidden.data() + size_t(out[j] - sh.own_begin) * E,
                hb);
    }
    all_to_all_v_backend(comm, be, send.data(), sb, recv.data(), rbytes);
    for (size_t j = 0; j < row_of.size(); ++j) {
        be.copy(reinterpret_cast<char*>(h) + row_of[j] * hb, bytes_of(recv) + j * hb, hb);
    }
}

}  // namespace

KvCache whole_context_cache(Model& model, const PreparedRequest& req, const Config& cfg,
                            const Shard& sh, const KvCache& shard_cache) {
    const int T = req.context_tokens();
    KvCache full = model.make_cache(T + int(req.suffix.size()) + cfg.decode.max_new_tokens);
    full.append(T, sh.gpos.data(), nullptr);
    // Zeros into every context slot of every layer first: the pages are touched here, with the
    // shard's own cache, not when the rows arrive.
    const size_t rb = full.row_bytes();
    Backend& be = model.backend();
    Buffer zero = be.alloc(std::max<size_t>(1, size_t(T) * rb));
    const std::vector<char> host(size_t(T) * rb, 0);
    be.upload(zero.data(), host.data(), host.size());
    for (int l = 0; l < full.n_layer(); ++l) full.write_range_raw(l, 0, T, zero.data(), zero.data());
    std::vector<int32_t> chunk0(size_t(sh.c0));  // slots [0, c0) in both caches
    for (int g = 0; g < sh.c0; ++g) chunk0[size_t(g)] = g;
    copy_rows(shard_cache, chunk0, chunk0, full.n_layer(), full);
    return full;
}

void gather_context(Model& model, Communicator& comm, const PreparedRequest& req,
                    const Config& cfg, const Shard& sh, const SpSelection& sel,
                    const KvCache& shard_cache, KvCache& full) {
    Backend& be = model.backend();
    const int P = comm.size(), me = comm.rank();
    const int T = req.context_tokens(), L = model.config().n_layer;
    const Config::Exchange ex = cfg.parallel.exchange;
    const bool raw = ex == Config::Exchange::gather;
    const KvCodec codec = raw ? KvCodec::int8 : exchange_kv_codec(ex);  // int8: unused if raw
    // This rank's selected tokens in the layers that are not recomputed (CacheBlend's layer 0),
    // which the owners send as they are.
    std::vector<int32_t> own_sel_local, own_sel;
    for (int g : sel.selected) {
        if (sh.owner(g) != me) continue;
        own_sel_local.push_back(sh.local_slot(g));
        own_sel.push_back(g);
    }
    copy_rows(shard_cache, own_sel_local, own_sel, sel.first_layer, full);

    // Every rank's unselected tokens outside chunk 0, in position order.
    std::vector<uint8_t> selected(size_t(T), 0);
    for (int g : sel.selected) selected[size_t(g)] = 1;
    std::vector<std::vector<int32_t>> unsel(P);
    for (int g = sh.c0; g < T; ++g) {
        if (!selected[size_t(g)]) unsel[sh.owner(g)].push_back(g);
    }
    // Payload of rank p: per layer, its tokens' rows ([K rows | V rows] as stored, or each
    // token's K and V codes).
    const size_t rb = full.row_bytes();
    const size_t slot_bytes = raw ? 2 * rb : kv_codec_slot_bytes(codec, full);
    std::vector<size_t> bytes(P);
    size_t total = 0;
    for (int p = 0; p < P; ++p) {
        bytes[p] = size_t(L) * unsel[p].size() * slot_bytes;
        total += bytes[p];
    }
    Buffer send = be.alloc(std::max<size_t>(1, bytes[me]));
    Buffer recv = be.alloc(std::max<size_t>(1, total));
    std::vector<int32_t> local;
    for (int g : unsel[me]) local.push_back(sh.local_slot(g));
    const int n_mine = int(local.size());
    const size_t layer_bytes = size_t(n_mine) * slot_bytes;
    if (raw) {
        for (int l = 0; l < L && n_mine > 0; ++l) {
            char* at = bytes_of(send) + size_t(l) * layer_bytes;
            shard_cache.read_rows_raw(l, local.data(), at, at + size_t(n_mine) * rb, n_mine);
        }
    } else if (n_mine > 0) {  // a layer at a time through one host buffer
        std::vector<uint8_t> codes(layer_bytes);
        for (int l = 0; l < L; ++l) {
            encode_cache_rows(codec, shard_cache, l, local, codes.data());
            be.upload(bytes_of(send) + size_t(l) * layer_bytes, codes.data(), layer_bytes);
        }
    }
    all_gather_v_backend(comm, be, send.data(), bytes[me], recv.data(), bytes);

    // Every rank's rows into place, this rank's own included (so every rank holds the same
    // bits, whoever owns the token).
    std::vector<uint8_t> host;  // one rank's codes of one layer at a time
    size_t block = 0;
    for (int p = 0; p < P; ++p) {
        const int np = int(unsel[p].size());
        const size_t per_layer = size_t(np) * slot_bytes;
        for (int l = 0; l < L && np > 0; ++l) {
            const size_t at = block + size_t(l) * per_layer;
            if (raw) {
                const char* k = bytes_of(recv) + at;
                const char* v = k + size_t(np) * rb;
                for (const SlotRun& r : slot_runs(unsel[p].data(), np)) {
                    full.write_range_raw(l, r.slot, r.n, k + size_t(r.row) * rb,
                                         v + size_t(r.row) * rb);
                }
            } else {
                host.resize(per_layer);
                be.download(host.data(), bytes_of(recv) + at, per_layer);
                decode_cache_rows(codec, host.data(), l, unsel[p], full);
            }
        }
        block += bytes[p];
    }
}

std::vector<float> recompute_whole(Model& model, Communicator& comm, const PreparedRequest& req,
                                   const Shard& sh, const SpSelection& sel, KvCache& full,
                                   MethodResult* result) {
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    const int P = comm.size(), me = comm.rank();
    const int n_sel = int(sel.selected.size()), T = req.context_tokens();
    const int Q = int(req.suffix.size()), n_all = n_sel + Q;
    // Rows: S in position order (indices 0 .. n_sel-1), then the suffix (n_sel ..), each seeing
    // every key up to its position.
    std::vector<int32_t> row_pos(n_all), row_tok(n_all), slot(n_all);
    std::vector<int> keys(n_all);
    for (int i = 0; i < n_all; ++i) {
        const bool ctx = i < n_sel;
        row_pos[i] = ctx ? sh.gpos[sel.selected[i]] : int32_t(T + i - n_sel);
        row_tok[i] = ctx ? sh.token(req, sel.selected[i]) : req.suffix[i - n_sel];
        slot[i] = ctx ? sel.selected[i] : T + i - n_sel;
        keys[i] = row_pos[i] + 1;
    }
    if (Q > 0) full.append(Q, row_pos.data() + n_sel, nullptr);  // slots T .. T+Q-1
    const RecomputeCost cost = recompute_cost(c);
    std::vector<double> dealt;
    std::vector<int> runner = deal_recompute(keys, P, cost, &dealt);
    std::vector<double> load(P, 0.0), owned(P, 0.0);
    std::vector<std::vector<int>> runs(P), owns(P);
    for (int i = 0; i < n_all; ++i) {
        runner[i] = P - 1 - runner[i];  // rank 0 takes the last run: the suffix's last row
        load[runner[i]] = dealt[P - 1 - runner[i]];
        runs[runner[i]].push_back(i);
        if (i < n_sel) {
            owns[sh.owner(sel.selected[i])].push_back(i);
            owned[sh.owner(sel.selected[i])] += cost.linear + cost.per_key * keys[i];
        }
    }
    if (result) {
        result->recompute_load = load;
        result->recompute_load_owned = owned;  // S on its owners (the suffix not counted)
    }
    // This rank's rows; those of S start at sel.first_layer, the suffix's at layer 0.
    std::vector<int32_t> tok, pos, slots;
    int n_ctx = 0;  // leading rows of S (runs are contiguous: S first, then suffix rows)
    for (int i : runs[me]) {
        tok.push_back(row_tok[i]);
        pos.push_back(row_pos[i]);
        slots.push_back(slot[i]);
        n_ctx += i < n_sel;
    }
    const int n = int(runs[me].size());
    const size_t m = size_t(std::max(1, n));
    const int qd = c.n_head * c.head_dim, row = full.row();
    Buffer h = be.alloc_floats(m * c.n_embd), q = be.alloc_floats(m * qd);
    Buffer k = be.alloc_floats(m * row), v = be.alloc_floats(m * row);
    Buffer out = be.alloc_floats(m * qd);
    const size_t E = size_t(c.n_embd);
    if (sel.first_layer == 0) {
        model.embed(tok.data(), n, h.data());
    } else {
        std::vector<std::vector<int>> s_runs(P);
        for (int p = 0; p < P; ++p) {
            for (int i : runs[p]) {
                if (i < n_sel) s_runs[p].push_back(i);
            }
        }
        load_owned_inputs(model, comm, sh, sel, s_runs, h.data());
        model.embed(tok.data() + n_ctx, n - n_ctx, h.data() + size_t(n_ctx) * E);
    }
    // The layers before first_layer (CacheBlend: layer 0) are not recomputed: each owner sends
    // its selected tokens' rows as they are, and only the suffix rows run. From first_layer on,
    // each rank sends the rows it computed.
    std::unique_ptr<KvExchange> by_owner;
    if (sel.first_layer > 0) by_owner = std::make_unique<KvExchange>(comm, be, full, slot, owns);
    std::vector<std::vector<int>> suffix_runs(P);
    for (int p = 0; p < P; ++p) {
        for (int i : runs[p]) {
            if (i >= n_sel) suffix_runs[p].push_back(i);
        }
    }
    KvExchange early(comm, be, full, slot, suffix_runs);  // the suffix rows' K/V, early layers
    KvExchange by_runner(comm, be, full, slot, runs);
    for (int l = 0; l < c.n_layer; ++l) {
        const bool early_layer = l < sel.first_layer;
        const int first = early_layer ? n_ctx : 0;  // rows that run this layer: [first, n)
        const int cnt = n - first;
        float* hl = h.data() + size_t(first) * E;
        // New K/V into the cache first (§3.5), then to every other rank, then attention.
        if (cnt > 0) {
            model.layer_qkv(l, hl, cnt, pos.data() + first, q.data(), k.data(), v.data());
            full.write_rows(l, slots.data() + first, k.data(), v.data(), cnt);
        }
        if (early_layer) {
            by_owner->run(l);
            early.run(l);
        } else {
            by_runner.run(l);
        }
        attend_all(be, c, full, l, q.data(), pos.data() + first, cnt, out.data());
        model.layer_post(l, hl, out.data(), cnt);
    }
    if (me != 0 || Q == 0) return {};
    std::vector<float> last(E);
    be.download(last.data(), h.data() + size_t(n - 1) * E, E * sizeof(float));
    return last;
}

std::vector<float> logits_of_row(Model& model, const std::vector<float>& hidden) {
    if (hidden.empty()) return {};
    Backend& be = model.backend();
    const int V = model.config().n_vocab;
    Buffer h = be.alloc_floats(hidden.size()), lg = be.alloc_floats(size_t(V));
    be.upload(h.data(), hidden.data(), hidden.size() * sizeof(float));
    model.logits(h.data(), 1, lg.data());
    std::vector<float> logits(static_cast<size_t>(V));
    be.download(logits.data(), lg.data(), logits.size() * sizeof(float));
    return logits;
}

}  // namespace infoflow
