#include "runtime/parallel/ring.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "runtime/core/error.h"
#include "runtime/method/phases.h"
#include "runtime/parallel/comm_stage.h"
#include "runtime/parallel/phase_clock.h"
#include "runtime/parallel/sp_pipeline.h"

namespace infoflow {

std::vector<std::vector<int32_t>> ring_shards(int n, int n_ranks, bool zigzag) {
    const int P = n_ranks;
    std::vector<std::vector<int32_t>> out(P);
    const int n_blocks = zigzag ? 2 * P : P;
    auto bound = [&](int b) { return int(int64_t(b) * n / n_blocks); };
    for (int b = 0; b < n_blocks; ++b) {
        int rank;
        if (zigzag) {
            rank = b < P ? b : 2 * P - 1 - b;
        } else {
            rank = P - 1 - b;
        }
        for (int t = bound(b); t < bound(b + 1); ++t) out[rank].push_back(t);
    }
    for (auto& s : out) std::sort(s.begin(), s.end());
    return out;
}

std::vector<uint64_t> ring_prefill_bytes(int n, int n_ranks, bool zigzag, size_t row_bytes,
                                         int n_layer) {
    const int P = n_ranks;
    const auto shards = ring_shards(n, P, zigzag);
    std::vector<uint64_t> out(P, 0);
    for (int r = 0; r < P; ++r) {
        uint64_t rows = 0;
        for (int s = 0; s + 1 < P; ++s) {
            rows += shards[(r - s + P) % P].size() + shards[(r - s - 1 + 2 * P) % P].size();
        }
        out[r] = rows * 2 * row_bytes * uint64_t(n_layer);
    }
    return out;
}

namespace {

// One rank's share of the ring prefill: its tokens' hidden states and attention scratch. K/V
// rows travel in the KV cache's storage type (model.kv_dtype), `rb` bytes each.
struct RingRows {
    RingRows(const std::vector<std::vector<int32_t>>& s, int n_rows, KvDtype t, size_t row_bytes)
        : shards(s), n(n_rows), dtype(t), rb(row_bytes) {}
    const std::vector<std::vector<int32_t>>& shards;  // positions of every rank's shard
    int n = 0;                                        // this rank's tokens
    KvDtype dtype;
    size_t rb;  // bytes of one K (or V) row
    Buffer h, q, out, lse, o_step, l_step;
    Buffer kv32;    // 16-bit caches: this layer's own K/V in fp32, before they are narrowed
    Buffer buf[2];  // double buffers of [k rows | v rows] travelling around the ring
    Buffer all_kv;  // ring.exchange = "allgather": every rank's [k rows | v rows]
    char* block(int i) { return reinterpret_cast<char*>(buf[i].data()); }
};

// Attention of this rank's queries over one block of np keys ([k rows | v rows] at `kv`, in the
// cache's type), merged into (out, lse) unless it is the first block.
void attend_block(Backend& be, AttnParams& ap, RingRows& w, const void* kv,
                  const std::vector<int32_t>& k_pos, bool first, int n_states, int head_dim) {
    const char* k = static_cast<const char*>(kv);
    const char* v = k + k_pos.size() * w.rb;
    ap.kv_dtype = w.dtype;
    if (w.dtype == KvDtype::f32) {
        ap.k = reinterpret_cast<const float*>(k);
        ap.v = reinterpret_cast<const float*>(v);
    } else {
        ap.k16 = reinterpret_cast<const uint16_t*>(k);
        ap.v16 = reinterpret_cast<const uint16_t*>(v);
    }
    ap.k_pos = k_pos.data();
    ap.n_kv = int(k_pos.size());
    ap.out = first ? w.out.data() : w.o_step.data();
    ap.lse = first ? w.lse.data() : w.l_step.data();
    be.attention(ap);
    if (!first) {
        be.lse_merge(w.out.data(), w.lse.data(), w.o_step.data(), w.l_step.data(), n_states,
                     head_dim);
    }
}

// ring.exchange = "allgather" (the authors' baseline): every rank's K/V of layer l at once,
// then attention block by block.
void attend_allgather(Model& model, Communicator& comm, AttnParams& ap, RingRows& w) {
    const ModelConfig& c = model.config();
    const int P = comm.size();
    std::vector<size_t> bytes(P);
    for (int p = 0; p < P; ++p) bytes[p] = w.shards[p].size() * 2 * w.rb;
    all_gather_v_backend(comm, model.backend(), w.block(0), bytes[comm.rank()], w.all_kv.data(),
                         bytes);
    const char* block = reinterpret_cast<const char*>(w.all_kv.data());
    bool first = true;
    for (int p = 0; p < P; ++p) {
        if (!w.shards[p].empty()) {
            attend_block(model.backend(), ap, w, block, w.shards[p], first, w.n * c.n_head,
                         c.head_dim);
            first = false;
        }
        block += bytes[p];
    }
}

// The ring: P steps; at each, post the next block's receive and this block's send, start them
// (test(): a device communicator defers point-to-point work until then, and runs it on its own
// stream), attend the current block while it travels on, wait, swap buffers.
void attend_ring(Model& model, Communicator& comm, AttnParams& ap, RingRows& w, int l) {
    const ModelConfig& c = model.config();
    const int P = comm.size(), rank = comm.rank();
    BackendP2P p2p(comm, model.backend());
    int cur = 0;
    for (int s = 0; s < P; ++s) {
        const int src = (rank - s + P) % P;  // owner of the block in buf[cur]
        const size_t np = w.shards[src].size();
        Request send, recv;
        if (s < P - 1) {
            const int next_src = (rank - s - 1 + P) % P;
            const size_t in_bytes = w.shards[next_src].size() * 2 * w.rb;
            recv = p2p.irecv(w.block(1 - cur), in_bytes, (rank - 1 + P) % P, l);
            send = p2p.isend(w.block(cur), np * 2 * w.rb, (rank + 1) % P, l);
            recv.test();  // the transfer starts before the attention below is queued
        }
        if (np > 0 && w.n > 0) {
            attend_block(model.backend(), ap, w, w.block(cur), w.shards[src], s == 0,
                         w.n * c.n_head, c.head_dim);
        }
        send.wait();
        recv.wait();
        p2p.complete();
        cur = 1 - cur;
    }
}

// The exact causal prefill of this rank's shard `mine` over every rank's keys; its K/V are
// stored in `cache`. Returns the last position's logits on rank 0 (zeros elsewhere).
std::vector<float> ring_prefill(Model& model, Communicator& comm, const Config& cfg,
                                const std::vector<int32_t>& seq,
                                const std::vector<std::vector<int32_t>>& shards, KvCache& cache) {
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    const std::vector<int32_t>& mine = shards[comm.rank()];
    const int row = c.n_head_kv * c.head_dim, qd = c.n_head * c.head_dim;
    size_t n_max = 0, n_all = 0;
    for (const auto& s : shards) {
        n_max = std::max(n_max, s.size());
        n_all += s.size();
    }
    RingRows w(shards, int(mine.size()), cache.dtype(), cache.row_bytes());
    const bool wide = w.dtype == KvDtype::f32;
    const size_t m = size_t(std::max(1, w.n));
    w.h = be.alloc_floats(m * c.n_embd);
    w.q = be.alloc_floats(m * qd);
    w.out = be.alloc_floats(m * qd);
    w.lse = be.alloc_floats(m * c.n_head);
    w.o_step = be.alloc_floats(m * qd);
    w.l_step = be.alloc_floats(m * c.n_head);
    if (!wide) w.kv32 = be.alloc_floats(m * 2 * row);
    for (Buffer& b : w.buf) b = be.alloc(std::max<size_t>(1, n_max * 2 * w.rb));
    const bool allgather = cfg.ring.exchange == Config::RingExchange::allgather;
    if (allgather) w.all_kv = be.alloc(std::max<size_t>(1, n_all * 2 * w.rb));
    cache.append(w.n, mine.data(), nullptr);
    std::vector<int32_t> toks(w.n);
    for (int i = 0; i < w.n; ++i) toks[i] = seq[mine[i]];
    model.embed(toks.data(), w.n, w.h.data());

    AttnParams ap;
    ap.n_head = c.n_head;
    ap.n_head_kv = c.n_head_kv;
    ap.head_dim = c.head_dim;
    ap.kv_stride = row;
    ap.q = w.q.data();
    ap.q_pos = mine.data();
    ap.n_q = w.n;
    for (int l = 0; l < c.n_layer; ++l) {
        // The own block in the cache's type: fp32 rows go straight into the ring buffer; 16-bit
        // ones are narrowed into the cache and copied from there as stored.
        float* k_own = wide ? w.buf[0].data() : w.kv32.data();
        float* v_own = k_own + size_t(w.n) * row;
        model.layer_qkv(l, w.h.data(), w.n, mine.data(), w.q.data(), k_own, v_own);
        cache.write_range(l, 0, w.n, k_own, v_own);
        if (!wide) cache.read_range_raw(l, 0, w.n, w.block(0), w.block(0) + size_t(w.n) * w.rb);
        if (allgather) {
            attend_allgather(model, comm, ap, w);
        } else {
            attend_ring(model, comm, ap, w, l);
        }
        model.layer_post(l, w.h.data(), w.out.data(), w.n);
    }
    // The last position (N-1) is rank 0's last token.
    std::vector<float> logits(c.n_vocab, 0.0f);
    if (comm.rank() == 0) {
        IF_CHECK(w.n > 0 && mine.back() == int(seq.size()) - 1,
                 "ring: rank 0 must hold the last position");
        Buffer lg = be.alloc_floats(c.n_vocab);
        model.logits(w.h.data() + size_t(w.n - 1) * c.n_embd, 1, lg.data());
        be.download(logits.data(), lg.data(), logits.size() * sizeof(float));
    }
    return logits;
}

}  // namespace

MethodResult run_ring(Model& model, const PreparedRequest& req, const Config& cfg,
                      Communicator& comm, const std::vector<int32_t>& stop_ids,
                      const TokenCallback& on_token) {
    MethodResult r = start_result(model, req, cfg, comm.size());
    r.method = "ring";
    r.chunk_order = identity_order(req.n_chunks());
    const std::vector<int32_t> seq = req.full_sequence();
    const auto shards =
        ring_shards(int(seq.size()), comm.size(), cfg.ring.layout == Config::RingLayout::zigzag);
    SpClock clock(comm, r.phases);
    clock.begin("ring_prefill");
    KvCache cache = model.make_cache(int(shards[comm.rank()].size()) + cfg.decode.max_new_tokens);
    r.first_logits = ring_prefill(model, comm, cfg, seq, shards, cache);
    clock.end();
    r.ttft_ms = r.phases.back().ms;
    clock.begin("decode");
    r.answer = generate_replicated(model, comm, cache, 0, r.first_logits, int(seq.size()), cfg,
                                   stop_ids, &r.stopped, on_token, &r.cancelled);
    clock.end();
    gather_phases(comm, r);
    return r;
}

}  // namespace infoflow
