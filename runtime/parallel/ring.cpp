#include "runtime/parallel/ring.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "runtime/core/error.h"
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

MethodResult run_ring(Model& model, const PreparedRequest& req, const Config& cfg,
                      Communicator& comm, const std::vector<int32_t>& stop_ids) {
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    const int P = comm.size();
    const int rank = comm.rank();
    const bool zigzag = cfg.ring.layout == Config::RingLayout::zigzag;
    const bool allgather = cfg.ring.exchange == Config::RingExchange::allgather;
    MethodResult r;
    r.method = "ring";
    r.ranks = P;
    r.context_tokens = req.context_tokens();
    r.suffix_tokens = int(req.suffix.size());
    const std::vector<int32_t> seq = req.full_sequence();
    const int N = int(seq.size());
    const int max_new = cfg.decode.max_new_tokens;
    IF_CHECK(N + std::max(0, max_new - 1) <= c.n_ctx_train,
             "the request needs " << N + std::max(0, max_new - 1) << " positions but the model has "
                                  << c.n_ctx_train);
    r.chunk_order.resize(req.n_chunks());
    for (int i = 0; i < req.n_chunks(); ++i) r.chunk_order[i] = i;

    const auto shards = ring_shards(N, P, zigzag);
    const std::vector<int32_t>& mine = shards[rank];
    const int n = int(mine.size());
    const int row = c.n_head_kv * c.head_dim;
    const int qd = c.n_head * c.head_dim;
    const size_t n_max =
        std::max_element(shards.begin(), shards.end(), [](const auto& a, const auto& b) {
            return a.size() < b.size();
        })->size();

    SpClock clock(comm, r.phases);
    clock.begin("ring_prefill");
    KvCache cache = model.make_cache(n + max_new);
    cache.append(n, mine.data(), nullptr);
    std::vector<int32_t> toks(n);
    for (int i = 0; i < n; ++i) toks[i] = seq[mine[i]];
    Buffer h = be.alloc_floats(size_t(std::max(1, n)) * c.n_embd);
    Buffer q = be.alloc_floats(size_t(std::max(1, n)) * qd);
    Buffer out = be.alloc_floats(size_t(std::max(1, n)) * qd);
    Buffer lse = be.alloc_floats(size_t(std::max(1, n)) * c.n_head);
    Buffer o_step = be.alloc_floats(size_t(std::max(1, n)) * qd);
    Buffer l_step = be.alloc_floats(size_t(std::max(1, n)) * c.n_head);
    // Double buffers of [k rows | v rows] for the ring.
    std::vector<float> buf[2] = {std::vector<float>(std::max<size_t>(1, n_max * 2 * row)),
                                 std::vector<float>(std::max<size_t>(1, n_max * 2 * row))};
    std::vector<float> all_kv;
    std::vector<int32_t> all_pos;
    model.embed(toks.data(), n, h.data());

    AttnParams ap;
    ap.n_head = c.n_head;
    ap.n_head_kv = c.n_head_kv;
    ap.head_dim = c.head_dim;
    ap.kv_stride = row;
    ap.q = q.data();
    ap.q_pos = mine.data();
    ap.n_q = n;
    for (int l = 0; l < c.n_layer; ++l) {
        float* k_own = buf[0].data();
        float* v_own = buf[0].data() + size_t(n) * row;
        model.layer_qkv(l, h.data(), n, mine.data(), q.data(), k_own, v_own);
        be.copy(cache.k(l), k_own, size_t(n) * row * sizeof(float));
        be.copy(cache.v(l), v_own, size_t(n) * row * sizeof(float));
        if (allgather) {
            std::vector<size_t> bytes(P);
            size_t total = 0;
            for (int p = 0; p < P; ++p) {
                bytes[p] = shards[p].size() * 2 * row * sizeof(float);
                total += shards[p].size();
            }
            all_kv.resize(std::max<size_t>(1, total * 2 * row));
            comm.all_gather_v(buf[0].data(), bytes[rank], all_kv.data(), bytes);
            // Keys of rank p: [k rows | v rows] at its offset; attend block by block, merged.
            size_t off = 0;
            bool first = true;
            for (int p = 0; p < P; ++p) {
                const int np = int(shards[p].size());
                if (np > 0) {
                    ap.k = all_kv.data() + off;
                    ap.v = all_kv.data() + off + size_t(np) * row;
                    ap.k_pos = shards[p].data();
                    ap.n_kv = np;
                    ap.out = first ? out.data() : o_step.data();
                    ap.lse = first ? lse.data() : l_step.data();
                    be.attention(ap);
                    if (!first)
                        be.lse_merge(out.data(), lse.data(), o_step.data(), l_step.data(),
                                     n * c.n_head, c.head_dim);
                    first = false;
                }
                off += size_t(np) * 2 * row;
            }
        } else {
            int cur = 0;
            for (int s = 0; s < P; ++s) {
                const int src = (rank - s + P) % P;  // owner of the block in buf[cur]
                const int np = int(shards[src].size());
                Request send, recv;
                if (s < P - 1) {
                    const int next_src = (rank - s - 1 + P) % P;
                    const size_t in_bytes = shards[next_src].size() * 2 * row * sizeof(float);
                    recv = comm.irecv(buf[1 - cur].data(), in_bytes, (rank - 1 + P) % P, l);
                    send = comm.isend(buf[cur].data(), size_t(np) * 2 * row * sizeof(float),
                                      (rank + 1) % P, l);
                }
                if (np > 0 && n > 0) {  // attention on the current block while it travels on
                    ap.k = buf[cur].data();
                    ap.v = buf[cur].data() + size_t(np) * row;
                    ap.k_pos = shards[src].data();
                    ap.n_kv = np;
                    ap.out = s == 0 ? out.data() : o_step.data();
                    ap.lse = s == 0 ? lse.data() : l_step.data();
                    be.attention(ap);
                    if (s > 0)
                        be.lse_merge(out.data(), lse.data(), o_step.data(), l_step.data(),
                                     n * c.n_head, c.head_dim);
                }
                send.wait();
                recv.wait();
                cur = 1 - cur;
            }
        }
        model.layer_post(l, h.data(), out.data(), n);
    }
    // The last position (N-1) is rank 0's last token.
    r.first_logits.assign(c.n_vocab, 0.0f);
    if (rank == 0) {
        IF_CHECK(n > 0 && mine.back() == N - 1, "ring: rank 0 must hold the last position");
        Buffer lg = be.alloc_floats(c.n_vocab);
        model.logits(h.data() + size_t(n - 1) * c.n_embd, 1, lg.data());
        be.download(r.first_logits.data(), lg.data(), r.first_logits.size() * sizeof(float));
    }
    clock.end();
    r.ttft_ms = r.phases.back().ms;
    clock.begin("decode");
    r.answer =
        generate_replicated(model, comm, cache, 0, r.first_logits, N, cfg, stop_ids, &r.stopped);
    clock.end();
    gather_phases(comm, r);
    return r;
}

}  // namespace infoflow
