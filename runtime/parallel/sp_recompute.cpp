// Phase 3 of the sequence-parallel method (docs/design.md §5.2): selective recompute (§3.5) of S,
// each rank running its own selected tokens through the layers, in one of two exchange modes: "kv"
// all-gathers the selected tokens' new K/V per layer (|S|·2·H_kv·D elements in total), so every
// rank's cache holds all of S; "exact" sends the selected queries instead (pass-Q) and merges the
// partial attention of every rank's keys.
#include <algorithm>

#include "runtime/parallel/comm_stage.h"
#include "runtime/parallel/dist_attention.h"
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

// "kv": slots for every other rank's selected tokens, in the order the all-gather delivers
// them (by owner rank, then by position); returns the first.
int append_foreign_slots(const Shard& sh, const SpSelection& sel, int P, KvCache& cache) {
    std::vector<int32_t> fpos;
    for (int p = 0; p < P; ++p) {
        if (p == sh.rank) continue;
        for (int g : sel.selected) {
            if (sh.owner(g) == p) fpos.push_back(sh.gpos[g]);
        }
    }
    if (fpos.empty()) return cache.size();
    return cache.append(int(fpos.size()), fpos.data(), nullptr);
}

}  // namespace

void recompute_kv(Model& model, Communicator& comm, const PreparedRequest& req, const Shard& sh,
                  const SpSelection& sel, KvCache& cache) {
    if (sel.selected.empty()) return;
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    const int P = comm.size(), row = cache.row();
    const int foreign_first = append_foreign_slots(sh, sel, P, cache);
    OwnRows o = own_rows(model, P, req, sh, sel);
    // K/V travel in the cache's storage type (f16/bf16 halve the bytes): each rank sends the
    // rows exactly as its cache holds them, so every rank's copy of S is bit-identical.
    const size_t rb = cache.row_bytes();
    std::vector<size_t> bytes(P);
    for (int p = 0; p < P; ++p) bytes[p] = size_t(o.owner_count[p]) * 2 * rb;
    Buffer send = be.alloc(std::max<size_t>(1, size_t(o.n) * 2 * rb));
    Buffer gathered = be.alloc(std::max<size_t>(1, sel.selected.size() * 2 * rb));
    char* send_k = static_cast<char*>(static_cast<void*>(send.data()));
    AttnParams ap;
    ap.n_head = c.n_head;
    ap.n_head_kv = c.n_head_kv;
    ap.head_dim = c.head_dim;
    for (int l = 0; l < c.n_layer; ++l) {
        // Layers before first_layer (CacheBlend: layer 0) are not recomputed, but the other
        // ranks still need their K/V of the selected tokens. From first_layer on, the new K/V
        // go into the cache first (§3.5).
        if (l >= sel.first_layer) {
            model.layer_qkv(l, o.h.data(), o.n, o.pos.data(), o.q.data(), o.k(), o.v(row));
            cache.write_rows(l, o.slot.data(), o.k(), o.v(row), o.n);
        }
        cache.read_rows_raw(l, o.slot.data(), send_k, send_k + size_t(o.n) * rb, o.n);
        all_gather_v_backend(comm, be, send.data(), bytes[sh.rank], gathered.data(), bytes);
        // Other ranks' blocks of `gathered` ([k rows | v rows] per rank) into their slots.
        int fslot = foreign_first;
        const char* block = static_cast<const char*>(static_cast<const void*>(gathered.data()));
        for (int p = 0; p < P; ++p) {
            const int np = o.owner_count[p];
            if (p != sh.rank) {
                cache.write_range_raw(l, fslot, np, block, block + size_t(np) * rb);
                fslot += np;
            }
            block += size_t(np) * 2 * rb;
        }
        if (l < sel.first_layer) continue;
        ap.q = o.q.data();
        cache.attn_kv(l, 0, ap);
        ap.q_pos = o.pos.data();
        ap.k_pos = cache.pos_data();
        ap.n_q = o.n;
        ap.n_kv = cache.size();
        ap.out = o.out.data();
        be.attention(ap);
        model.layer_post(l, o.h.data(), o.out.data(), o.n);
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
