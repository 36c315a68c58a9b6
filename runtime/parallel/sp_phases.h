// The phases of the sequence-parallel method (docs/design.md §5.2), one function each, called in
// order by `run_method_sp` (sp_pipeline.cpp), which alone keeps the phase clock and the byte
// accounting. Each phase runs on every rank (SPMD); its messages are its own.
//   1. shard_prefill     (sp_prefill.cpp)   no messages
//   2. score_and_select  (sp_select.cpp)    merged row states, one all-reduce of the scores
//   3. recompute_kv      (sp_recompute.cpp) all-gather of the selected tokens' K/V per layer
//      recompute_exact   (sp_recompute.cpp) pass-Q partial attention per layer
//      gather_context, recompute_whole (sp_gather.cpp) every context row once, then S per layer
//   4. answer_kv / answer_exact (sp_answer.cpp)
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "runtime/method/chunk_kv.h"
#include "runtime/method/chunk_store.h"
#include "runtime/method/pipeline.h"
#include "runtime/method/placement.h"

namespace infoflow {

// Where every context token lives, seen from one rank. Context tokens are numbered by their
// global index g in [0, T) (chunk order = identity); this rank's cache holds chunk 0 at slots
// [0, c0) and its own chunks after it.
struct Shard {
    int rank = 0;
    Placement place;
    std::vector<ChunkKv> chunks;     // every chunk; other ranks' are shadows (no K/V)
    std::vector<int32_t> gpos;       // [T] global positions
    std::vector<int> chunk_of;       // [T] chunk of each global index
    std::vector<int> offsets;        // [K] first global index of each chunk
    std::vector<int> local_order;    // chunk 0, then own chunks
    int own_begin = 0, own_end = 0;  // own global index range
    int c0 = 0;                      // chunk 0 size

    int local_slot(int g) const { return c0 + (g - own_begin); }
    int owner(int g) const { return place.chunk_rank[chunk_of[g]]; }
    int32_t token(const PreparedRequest& req, int g) const {
        return req.chunks[chunk_of[g]][g - offsets[chunk_of[g]]];
    }
    // First local slot of this rank's share of a distributed attention: chunk 0 counts on rank
    // 0 alone.
    int key_begin() const { return rank == 0 ? 0 : c0; }
};

// Phase 1's output: the shard and this rank's cache (chunk 0 + own chunks at global
// positions, room for the selected tokens of other ranks, the suffix and the answer).
struct ShardPrefill {
    Shard shard;
    KvCache cache;
};
// With a store, this rank's chunks that it holds are loaded, not prefilled; `loaded` is called
// between the load and the prefill (prefill_context).
// With `given` (every chunk of the request prefilled once, as prefill_context returns them; job
// sweep) this rank's chunks are copied from it instead.
ShardPrefill shard_prefill(Model& model, const PreparedRequest& req, const Config& cfg, int rank,
                           int n_ranks, ChunkSource* source = nullptr,
                           const std::function<void()>& loaded = {},
                           const std::vector<ChunkKv>* given = nullptr);

// Phase 2's output, identical on every rank except `own_hidden`.
struct SpSelection {
    std::vector<int> selected;  // global indices, sorted by position
    int first_layer = 0;        // cacheblend: 1 (layer 0 exact for every token)
    Buffer own_hidden;          // first_layer > 0: [own tokens, n_embd], the input of layer 1
};
SpSelection score_and_select(Model& model, Communicator& comm, const PreparedRequest& req,
                             const Config& cfg, const Shard& sh, KvCache& cache);

// Phase 3, "kv": every selected token is recomputed by its owner or by the helper rank the
// plan gives it (parallel.balance, recompute_balance.h: the owner then contributes the token's
// attention over its shard, merged by LSE); the new K/V are all-gathered per layer into slots
// appended for them on every other rank. `result` (optional) receives the plan and its model.
void recompute_kv(Model& model, Communicator& comm, const PreparedRequest& req, const Shard& sh,
                  const SpSelection& sel, KvCache& cache, const Config& cfg,
                  MethodResult* result = nullptr);
// Phase 3, "exact": the selected queries attend over every rank's keys (pass-Q).
void recompute_exact(Model& model, Communicator& comm, const PreparedRequest& req, const Shard& sh,
                     const SpSelection& sel, KvCache& cache);
// After "exact" ("exact-answer-kv"): every selected token's recomputed K/V of every layer from
// its owner into slots appended on every other rank, as "kv" leaves them for the answer.
void share_selected_kv(Model& model, Communicator& comm, const Shard& sh, const SpSelection& sel,
                       KvCache& cache);

// The whole-context exchanges ("gather", "compact-*", sp_gather.cpp). At phase 1, with the
// shard's own cache: the cache of the whole context this rank will hold (slot g = context token
// g at its global position, room for the suffix and the answer), its pages touched, chunk 0
// copied in from the shard cache.
KvCache whole_context_cache(Model& model, const PreparedRequest& req, const Config& cfg,
                            const Shard& sh, const KvCache& shard_cache);
// Phase 3, first, once: every other context token's K/V into it — each unselected token from its
// owner, as stored ("gather") or as codes (kv_codec.h), each rank decoding its own rows too, and
// this rank's selected tokens as stored.
void gather_context(Model& model, Communicator& comm, const PreparedRequest& req,
                    const Config& cfg, const Shard& sh, const SpSelection& sel,
                    const KvCache& shard_cache, KvCache& full);
// Then the recompute and the suffix prefill in one pass over it (the same arithmetic as one
// after the other: S never sees the suffix, and at layer l the suffix rows see S's layer-l K/V,
// final by then). S and the suffix rows are dealt out in P contiguous runs of about equal work
// (recompute_balance.h, deal_recompute), rank 0 taking the last, and each rank's new K/V are
// all-gathered per layer; in the layers before sel.first_layer only the suffix rows run, S's
// rows coming from their owners. Returns the last suffix row's hidden state on rank 0
// ([n_embd]; empty elsewhere). `result` (optional) receives each rank's modelled work.
std::vector<float> recompute_whole(Model& model, Communicator& comm, const PreparedRequest& req,
                                   const Shard& sh, const SpSelection& sel, KvCache& full,
                                   MethodResult* result = nullptr);
// The logits of one hidden row ([n_embd] -> [n_vocab]); empty for an empty row.
std::vector<float> logits_of_row(Model& model, const std::vector<float>& hidden);

// Phase 4, the suffix prefill: "kv" on rank 0 alone over its cache; "exact" SPMD with partial
// attention merged across ranks. Both return the first-token logits on rank 0 ([n_vocab]).
std::vector<float> prefill_suffix_kv(Model& model, Communicator& comm, const PreparedRequest& req,
                                     KvCache& cache);
std::vector<float> prefill_suffix_exact(Model& model, Communicator& comm,
                                        const PreparedRequest& req, const Shard& sh,
                                        KvCache& cache);
// Phase 4, the decode from r.first_logits: "kv" on rank 0 alone; "exact" distributed, rank 0
// sampling. Fill r.answer and r.stopped.
// `on_token` (optional): rank 0 sees each token and may end the decode (generate.h).
void decode_kv(Model& model, Communicator& comm, const Config& cfg,
               const std::vector<int32_t>& stop_ids, KvCache& cache, MethodResult& r,
               const TokenCallback& on_token = {});
// Teacher forcing (RunHooks::forced_ref): the rows of logits of `ref` fed after the prompt
// (first_logits, then one row per fed token) on rank 0; "kv" over rank 0's cache alone, "exact"
// with the fed rows' attention merged across ranks (their K/V stored on rank 0 and dropped
// after). Empty on the other ranks.
std::vector<float> forced_rows_kv(Model& model, Communicator& comm, const PreparedRequest& req,
                                  KvCache& cache, const std::vector<float>& first_logits,
                                  const std::vector<int32_t>& ref);
std::vector<float> forced_rows_exact(Model& model, Communicator& comm, const PreparedRequest& req,
                                     const Shard& sh, KvCache& cache,
                                     const std::vector<float>& first_logits,
                                     const std::vector<int32_t>& ref);
void decode_exact(Model& model, Communicator& comm, const Config& cfg,
                  const std::vector<int32_t>& stop_ids, const Shard& sh, KvCache& cache,
                  MethodResult& r, const TokenCallback& on_token = {});

}  // namespace infoflow
