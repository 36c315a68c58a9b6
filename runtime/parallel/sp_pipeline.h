// The sequence-parallel method on P ranks (docs/design.md §5.1-§5.3): shard prefill with no
// messages, scoring with a globally merged (or local) softmax and one all-reduce of the per-token
// scores, selective recompute with the selected tokens' K/V all-gathered per layer ("kv") or with
// pass-Q partial attention ("exact"), and the answer on rank 0. The phases themselves are in
// sp_phases.h; forward_replicated and generate_replicated, shared with ring attention, live with
// the answer (sp_answer.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "runtime/method/pipeline.h"

namespace infoflow {

// Runs cfg.method (none | infoflow | cacheblend | epic) across the ranks of `comm`. The full
// result (answer, logits) is on rank 0; every rank returns its own phases.
// `hooks`: `on_token` (optional) is called on rank 0 with each answer token; false ends the
// decode on every rank. Job sweep's: `chunks` replaces the shard prefill (each rank copies its
// chunks from them), `forced_ref`/`on_forced` teacher-force a reference before the decode;
// before_decode and after_decode are not called here (no rank's cache is the prompt).
MethodResult run_method_sp(Model& model, const PreparedRequest& req, const Config& cfg,
                           Communicator& comm, const std::vector<int32_t>& stop_ids,
                           const RunHooks& hooks = {});

// Replicated rows (identical on every rank) through layers [0, n_layers): per layer the rows'
// K/V are written to `row_slots` of the local cache when given (one rank stores them, so they
// count once), the rows attend over local slots [key_begin, cache.size()) and the partial
// states are merged across ranks. `on_layer(l, q, lse)` (optional) sees the merged LSE.
void forward_replicated(Model& model, Communicator& comm, KvCache& cache, int key_begin,
                        float* hidden /*[n, n_embd]*/, int n, const int32_t* pos /*[n]*/,
                        const int32_t* row_slots /*[n] or nullptr*/, int n_layers,
                        const std::function<void(int, const float*, const float*)>& on_layer);

// Distributed generation (docs/design.md §5.2 "exact", §5.4): rank 0 samples from `first_logits`
// and broadcasts each token; the decode row attends over every rank's local cache (its K/V stored
// on rank 0), partial states merged. Returns the tokens on every rank. Rank 0 calls `on_token`
// (optional) with each token; when it returns false, the broadcast token carries the end too
// (sent as -2 - token), so every rank stops after it (*cancelled set on every rank).
std::vector<int32_t> generate_replicated(Model& model, Communicator& comm, KvCache& cache,
                                         int key_begin, const std::vector<float>& first_logits,
                                         int32_t next_pos, const Config& cfg,
                                         const std::vector<int32_t>& stop_ids, bool* stopped,
                                         const TokenCallback& on_token = {},
                                         bool* cancelled = nullptr);

// Gathers every rank's phases (same names, same order on all ranks) to rank 0.
void gather_phases(Communicator& comm, MethodResult& r);

}  // namespace infoflow
