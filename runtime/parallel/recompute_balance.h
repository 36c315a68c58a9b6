// Load balancing of the "kv" recompute (docs/design.md §5.2 phase 3): which rank runs each
// selected token's layers. The token's owner (the rank whose shard holds it) is the natural
// place, but the selected set is not spread evenly: the shard next to the question (rank 0)
// usually owns several times more of it than the others, and every rank waits for the busiest
// one at each layer's all-gather.
//
// A token x owned by rank o may instead be run by a helper h. Its visible keys under the "kv"
// mask split into two disjoint sets: o's shard (only o holds those K/V) and chunk 0 plus the
// selected tokens of the other shards (every rank holds those). So per layer h computes x's
// projections and MLP and the partial attention over the second set, o computes the partial
// attention over its shard from x's query, and the two partials are merged by their LSE
// (§5.3). The result is the "kv" semantics unchanged, up to the rounding of the merge.
//
// The plan is a deterministic function of the selection and the placement, computed
// identically on every rank: a greedy pass that moves tokens from the most loaded rank to the
// least loaded while that lowers the maximum, under a cost model of multiply-adds per layer.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/model/model_config.h"

namespace infoflow {

// Multiply-adds per layer: `linear` per token (the Q/K/V and output projections and the MLP),
// `per_key` per visible key (Q·K and P·V over every head).
struct RecomputeCost {
    double linear = 0.0;
    double per_key = 0.0;
};
RecomputeCost recompute_cost(const ModelConfig& c);

// One selected token, as the plan sees it.
struct RecomputeToken {
    int owner = 0;       // rank holding the token's shard
    int shard_keys = 0;  // keys of the owner's shard visible to it (itself included)
    int other_keys = 0;  // visible keys of chunk 0 and of other shards' selected tokens
};

struct RecomputePlan {
    std::vector<int> runner;    // [n] rank that runs each token's layers
    std::vector<double> load;   // [P] modelled work per layer with this plan
    std::vector<double> owned;  // [P] the same with every token run by its owner
    int moved = 0;              // tokens with runner != owner
    double max_load() const;
    double mean_load() const;
};

// balance = false: every token stays with its owner.
RecomputePlan plan_recompute(const std::vector<RecomputeToken>& tokens, int n_ranks,
                             const RecomputeCost& cost, bool balance);

}  // namespace infoflow
