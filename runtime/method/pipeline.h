// One request through one method on one rank (docs/design.md §3, §4): `full`, `none`, `infoflow`
// (with optional reorder), `cacheblend`, `epic`. Every distributed mode is defined by, and tested
// against, these single-rank semantics.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/config/config.h"
#include "runtime/method/chunk_kv.h"
#include "runtime/method/prefix_cache.h"
#include "runtime/method/request.h"
#include "runtime/model/generate.h"
#include "runtime/model/model.h"

namespace infoflow {

struct PhaseTime {
    std::string name;
    double ms = 0.0;
    uint64_t bytes_sent = 0;  // this rank's communication in the phase (docs/design.md §5.5)
    uint64_t bytes_recv = 0;
    double wait_ms = 0.0;
};

// The "kv" recompute's plan on P ranks (runtime/parallel/recompute_balance.h): the balance mode,
// the link and compute rate its cost model assumed, and its modelled time and per-rank bytes
// (sent, received over the whole recompute) next to those of every token on its owner.
struct RecomputePlanReport {
    bool planned = false;
    std::string mode, link;
    double alpha_us = 0.0, beta_gbs = 0.0, gmacs = 0.0;
    double model_ms = 0.0, owned_model_ms = 0.0;
    std::vector<double> sent, recv, owned_sent, owned_recv;  // [rank]
};

struct MethodResult {
    std::string method;
    std::vector<float> first_logits;  // [n_vocab] after the last suffix token
    std::vector<int32_t> answer;      // generated ids (stop token excluded)
    bool stopped = false;
    bool cancelled = false;  // the decode ended because RunHooks::on_token returned false
    std::vector<int32_t> selected_positions;  // recomputed tokens, global positions, sorted
    std::vector<int> chunk_order;             // chunk order used (identity unless reordered)
    int context_tokens = 0;
    int suffix_tokens = 0;
    double ttft_ms = 0.0;           // request to first-token logits
    std::vector<PhaseTime> phases;  // this rank's phases
    int ranks = 1;
    // Phase 1 with the KV store (docs/design.md §8), summed over ranks: context chunks and tokens
    // loaded from store.path, document bytes read, chunks added (store.mode = "read-write").
    int store_chunks = 0;
    int store_tokens = 0;
    uint64_t store_bytes = 0;
    int store_added = 0;
    // The context chunks (indices into the request's chunks, >= 1, sorted) loaded from the
    // store, over all ranks.
    std::vector<int> store_loaded_chunks;
    // Peak resident memory of each rank's process up to the answer, MiB ([rank]; -1 where the
    // system does not say; filled by run_request).
    std::vector<double> peak_rss_mib;
    // The "kv" recompute on P ranks (runtime/parallel/recompute_balance.h): the modelled work
    // per layer of each rank ([rank], multiply-adds) as planned and as it would be with every
    // token on its owner, and the tokens run by a helper rank. Empty / 0 elsewhere.
    std::vector<double> recompute_load, recompute_load_owned;
    int recompute_moved = 0;
    RecomputePlanReport recompute_plan;
    // Sequence-parallel runs: each rank's shard in tokens (docs/design.md §5.1; chunk_order
    // counts the chunks after parallel.placement = "tokens" cut them at the shard edges).
    std::vector<int> shard_tokens;
    // Per phase, per rank (filled on rank 0 of a distributed run): [phase][rank].
    std::vector<std::vector<PhaseTime>> phases_per_rank;
};

// Runs `cfg.method` on the request. `stop_ids` end generation.
MethodResult run_method(Model& model, const PreparedRequest& req, const Config& cfg,
                        const std::vector<int32_t>& stop_ids);

// What a quality job (runtime/jobs/sweep.cpp) shares across the runs of one request and what it
// observes of each run.
struct RunHooks {
    // Phase 1 done once for the request (chunk i of `req`, as prefill_context returns them, all
    // chunks held): a recompute method uses these instead of prefilling (and reads no store);
    // its "chunk_prefill" phase then times nothing. Ignored by `full`.
    const std::vector<ChunkKv>* chunks = nullptr;
    // Called after the suffix prefill (r.first_logits set) with the run's cache, whose first
    // context_tokens + suffix_tokens slots are the finished prompt; it may append slots after
    // them if it cuts the cache back to the prompt. Returning false skips the decode (the caller
    // then knows the answer, e.g. from teacher forcing).
    std::function<bool(KvCache& cache, MethodResult& r)> before_decode;
    // Called after decode with the run's cache: the prompt, then the decoded tokens.
    std::function<void(KvCache& cache, MethodResult& r)> after_decode;
    // Sees every answer token as it is sampled; false ends the decode there (generate.h). The
    // one hook the distributed pipelines take too (runtime/parallel/run.h; rank 0 calls it).
    TokenCallback on_token;
    // Job serve's batch (docs/serve.md "Batching"): where the decode runs on one cache (one
    // rank, `full`, and rank 0 of the "kv" exchange), called after the suffix prefill (with
    // r.first_logits set) instead of the decode: it takes the finished prompt -- the cache,
    // moved out, whose first context_tokens + suffix_tokens positions are the prompt -- and
    // decodes it itself, batched with other requests, its rows in visibility group `group`
    // (-1 none; 0 on emulated ranks, as the decode's). The run then ends as after a decode (the
    // store is written); its "decode" phase is empty, for the caller to fill in. Not with
    // "exact" or ring attention, whose decode needs every rank.
    std::function<void(KvCache&& cache, int32_t group, MethodResult& r)> take_cache;
    // Chunk 0 from this cache, kept across requests (job serve; the same bits as its prefill,
    // prefix_cache.h). Every pipeline that prefills chunks takes it; nullptr: prefilled.
    PrefixKvCache* prefix_cache = nullptr;
    // Teacher forcing inside a sequence-parallel run (run_method_sp; job sweep on virtual
    // ranks), where no one rank's cache is the prompt: the tokens of `forced_ref` are fed after
    // the prompt (over rank 0's cache in "kv", across the ranks in "exact") and their rows of
    // logits ([max(1, n), n_vocab], row 0 = first_logits) go to `on_forced` on rank 0, which
    // returns whether to decode (as before_decode does).
    const std::vector<int32_t>* forced_ref = nullptr;
    std::function<bool(const std::vector<float>& rows, MethodResult& r)> on_forced;
    // Whether any of job sweep's hooks (all but on_token) is set.
    bool sweep_hooks() const {
        return chunks || before_decode || after_decode || forced_ref || on_forced;
    }
};
MethodResult run_method(Model& model, const PreparedRequest& req, const Config& cfg,
                        const std::vector<int32_t>& stop_ids, const RunHooks& hooks);

// The scoring rows of a request: question tokens or the whole suffix (scoring.query).
std::vector<int32_t> scoring_rows(const PreparedRequest& req, Config::Query query);

}  // namespace infoflow
