// One request through one method on one rank (docs/design.md §3, §4): `full`, `none`, `infoflow` (with
// optional reorder), `cacheblend`, `epic`. Every distributed mode is defined by, and tested
// against, these single-rank semantics.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/config/config.h"
#include "runtime/method/request.h"
#include "runtime/model/model.h"

namespace infoflow {

struct PhaseTime {
    std::string name;
    double ms = 0.0;
    uint64_t bytes_sent = 0;  // this rank's communication in the phase (docs/design.md §5.5)
    uint64_t bytes_recv = 0;
    double wait_ms = 0.0;
};

struct MethodResult {
    std::string method;
    std::vector<float> first_logits;  // [n_vocab] after the last suffix token
    std::vector<int32_t> answer;      // generated ids (stop token excluded)
    bool stopped = false;
    std::vector<int32_t> selected_positions;  // recomputed tokens, global positions, sorted
    std::vector<int> chunk_order;             // chunk order used (identity unless reordered)
    int context_tokens = 0;
    int suffix_tokens = 0;
    double ttft_ms = 0.0;           // request to first-token logits
    std::vector<PhaseTime> phases;  // this rank's phases
    int ranks = 1;
    // Phase 1 with the KV store (docs/design.md §8), summed over ranks: context chunks and tokens loaded
    // from store.path, document bytes read, chunks added (store.mode = "read-write").
    int store_chunks = 0;
    int store_tokens = 0;
    uint64_t store_bytes = 0;
    int store_added = 0;
    // Per phase, per rank (filled on rank 0 of a distributed run): [phase][rank].
    std::vector<std::vector<PhaseTime>> phases_per_rank;
};

// Runs `cfg.method` on the request. `stop_ids` end generation.
MethodResult run_method(Model& model, const PreparedRequest& req, const Config& cfg,
                        const std::vector<int32_t>& stop_ids);

// The scoring rows of a request: question tokens or the whole suffix (scoring.query).
std::vector<int32_t> scoring_rows(const PreparedRequest& req, Config::Query query);

}  // namespace infoflow
