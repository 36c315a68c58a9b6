// Phase 4 of the sequence-parallel method (docs/design.md §5.2): the answer. "kv": rank 0's cache
// holds chunk 0, its shard and all of S, so it prefills the suffix and decodes alone (the
// single-rank steps). "exact": suffix and decode run SPMD, every rank attending the replicated rows
// over its local keys, partial states merged (forward_replicated); rank 0 samples and broadcasts.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/core/error.h"
#include "runtime/core/pieces.h"
#include "runtime/method/phases.h"
#include "runtime/model/sampling.h"
#include "runtime/parallel/dist_attention.h"
#include "runtime/parallel/sp_phases.h"
#include "runtime/parallel/sp_pipeline.h"

namespace infoflow {

void forward_replicated(Model& model, Communicator& comm, KvCache& cache, int key_begin,
                        float* hidden, int n, const int32_t* pos, const int32_t* row_slots,
                        int n_layers,
                        const std::function<void(int, const float*, const float*)>& on_layer) {
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    const int row = c.n_head_kv * c.head_dim;
    const int qd = c.n_head * c.head_dim;
    const size_t m = size_t(std::max(n, 1));
    Buffer q = be.alloc_floats(m * qd), k = be.alloc_floats(m * row), v = be.alloc_floats(m * row);
    Buffer out = be.alloc_floats(m * qd), lse = be.alloc_floats(m * c.n_head);
    std::vector<float> empty_out, empty_lse;  // the state of rows with no local key (§5.3)
    for (int l = 0; l < n_layers; ++l) {
        model.layer_qkv(l, hidden, n, pos, q.data(), k.data(), v.data());
        if (row_slots) cache.write_rows(l, row_slots, k.data(), v.data(), n);
        AttnParams ap;
        ap.q = q.data();
        cache.attn_kv(l, key_begin, ap);
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
            empty_out.assign(size_t(n) * qd, 0.0f);
            empty_lse.assign(size_t(n) * c.n_head, -INFINITY);
            be.upload(out.data(), empty_out.data(), empty_out.size() * sizeof(float));
            be.upload(lse.data(), empty_lse.data(), empty_lse.size() * sizeof(float));
        }
        merge_partials_allgather(comm, be, out.data(), lse.data(), n * c.n_head, c.head_dim);
        if (on_layer) on_layer(l, q.data(), lse.data());
        model.layer_post(l, hidden, out.data(), n);
        // A point for job serve's time slice (pieces.h; no tokens counted: the callers count
        // their rows): this pass keeps its state in its own buffers, `hidden` and the cache.
        piece_done(0.0);
    }
}

std::vector<int32_t> generate_replicated(Model& model, Communicator& comm, KvCache& cache,
                                         int key_begin, const std::vector<float>& first_logits,
                                         int32_t next_pos, const Config& cfg,
                                         const std::vector<int32_t>& stop_ids, bool* stopped,
                                         const TokenCallback& on_token, bool* cancelled) {
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    Sampler sampler(generate_options(cfg, stop_ids).sampling);
    std::vector<float> logits = first_logits;
    std::vector<int32_t> out;
    *stopped = false;
    if (cancelled) *cancelled = false;
    Buffer h = be.alloc_floats(c.n_embd);
    Buffer lg = be.alloc_floats(c.n_vocab);
    const Model::DecodeScope decoding(model);
    for (int step = 0; step < cfg.decode.max_new_tokens; ++step) {
        int32_t tok = comm.rank() == 0 ? sampler.sample(logits.data(), c.n_vocab) : 0;
        const bool is_stop = std::find(stop_ids.begin(), stop_ids.end(), tok) != stop_ids.end();
        // Rank 0 hands the token to on_token before anyone goes on; an end it asks for travels
        // with the token (-2 - tok), so the ranks stay in step.
        if (comm.rank() == 0 && !is_stop && on_token && !on_token(tok)) tok = -2 - tok;
        comm.broadcast(&tok, sizeof(tok), 0);  // rank 0 samples, everyone follows
        if (std::find(stop_ids.begin(), stop_ids.end(), tok) != stop_ids.end()) {
            *stopped = true;
            break;
        }
        if (tok <= -2) {
            out.push_back(-2 - tok);
            if (cancelled) *cancelled = true;
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

std::vector<float> prefill_suffix_kv(Model& model, Communicator& comm, const PreparedRequest& req,
                                     KvCache& cache) {
    if (comm.rank() != 0) return {};
    return prefill_suffix(model, cache, req, -1);
}

std::vector<float> prefill_suffix_exact(Model& model, Communicator& comm,
                                        const PreparedRequest& req, const Shard& sh,
                                        KvCache& cache) {
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    const int Q = int(req.suffix.size());
    std::vector<int32_t> spos(Q), slots;
    std::iota(spos.begin(), spos.end(), req.context_tokens());
    if (comm.rank() == 0) {  // the suffix's K/V are stored on rank 0
        const int first = cache.append(Q, spos.data(), nullptr);
        for (int i = 0; i < Q; ++i) slots.push_back(first + i);
    }
    Buffer h = be.alloc_floats(size_t(Q) * c.n_embd);
    model.embed(req.suffix.data(), Q, h.data());
    forward_replicated(model, comm, cache, sh.key_begin(), h.data(), Q, spos.data(),
                       comm.rank() == 0 ? slots.data() : nullptr, c.n_layer, nullptr);
    Buffer lg = be.alloc_floats(c.n_vocab);
    model.logits(h.data() + size_t(Q - 1) * c.n_embd, 1, lg.data());
    std::vector<float> logits(c.n_vocab);
    be.download(logits.data(), lg.data(), logits.size() * sizeof(float));
    return logits;
}

std::vector<float> forced_rows_kv(Model& model, Communicator& comm, const PreparedRequest& req,
                                  KvCache& cache, const std::vector<float>& first_logits,
                                  const std::vector<int32_t>& ref) {
    if (comm.rank() != 0) return {};
    const int prompt = req.context_tokens() + int(req.suffix.size());
    return teacher_forced_logits(model, cache, prompt, first_logits, ref, -1, cache.size());
}

std::vector<float> forced_rows_exact(Model& model, Communicator& comm, const PreparedRequest& req,
                                     const Shard& sh, KvCache& cache,
                                     const std::vector<float>& first_logits,
                                     const std::vector<int32_t>& ref) {
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    const int fed = std::max(0, int(ref.size()) - 1);
    std::vector<float> rows;
    if (comm.rank() == 0) rows = first_logits;
    if (fed == 0) return rows;
    const int restore = cache.size();
    std::vector<int32_t> pos(fed), slots;
    std::iota(pos.begin(), pos.end(), req.context_tokens() + int(req.suffix.size()));
    if (comm.rank() == 0) {  // the fed rows' K/V are stored on rank 0, as the decode's are
        const int first = cache.append(fed, pos.data(), nullptr);
        for (int i = 0; i < fed; ++i) slots.push_back(first + i);
    }
    Buffer h = be.alloc_floats(size_t(fed) * c.n_embd);
    model.embed(ref.data(), fed, h.data());
    forward_replicated(model, comm, cache, sh.key_begin(), h.data(), fed, pos.data(),
                       comm.rank() == 0 ? slots.data() : nullptr, c.n_layer, nullptr);
    cache.truncate(restore);
    if (comm.rank() != 0) return rows;
    Buffer lg = be.alloc_floats(size_t(fed) * c.n_vocab);
    model.logits(h.data(), fed, lg.data());
    const size_t at = rows.size();
    rows.resize(at + size_t(fed) * c.n_vocab);
    be.download(rows.data() + at, lg.data(), size_t(fed) * c.n_vocab * sizeof(float));
    return rows;
}

void decode_kv(Model& model, Communicator& comm, const Config& cfg,
               const std::vector<int32_t>& stop_ids, KvCache& cache, MethodResult& r,
               const TokenCallback& on_token) {
    if (comm.rank() != 0) return;
    GenerateOptions gen = generate_options(cfg, stop_ids);
    gen.on_token = on_token;
    decode_answer(model, cache, gen, r);
}

void decode_exact(Model& model, Communicator& comm, const Config& cfg,
                  const std::vector<int32_t>& stop_ids, const Shard& sh, KvCache& cache,
                  MethodResult& r, const TokenCallback& on_token) {
    r.answer = generate_replicated(model, comm, cache, sh.key_begin(), r.first_logits,
                                   r.context_tokens + r.suffix_tokens, cfg, stop_ids, &r.stopped,
                                   on_token, &r.cancelled);
}

}  // namespace infoflow
