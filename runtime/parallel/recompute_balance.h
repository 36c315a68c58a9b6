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
// Moving a token costs bytes: per layer its query goes to the owner and its partial (out, lse)
// comes back, about three times its K/V. On a fast link against slow compute that pays; on a
// slow link against fast compute it does not. The plan weighs both with a cost model: compute
// at a nominal rate (multiply-adds per second per rank) and each collective alpha + bytes / beta
// on the link the ranks use (comm/comm_model.h), in the BSP form the recompute runs in: per
// layer the busiest rank's compute, then the K/V all-gather and, once any token moved, the two
// all-to-alls of queries and partials.
//
// The plan is a deterministic function of the selection, the placement and the model, computed
// identically on every rank: a greedy pass moves tokens from the most loaded rank to the least
// loaded while that lowers the maximum compute; BalanceMode::on takes the whole pass,
// BalanceMode::automatic the prefix of it with the lowest modelled time (none at all when no
// prefix beats every token on its owner).
#pragma once

#include <cstdint>
#include <vector>

#include "comm/comm_model.h"
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

// What the plan's time model needs beyond the multiply-adds.
struct BalanceModel {
    double gmacs = 1.0;         // compute rate of one rank, 1e9 multiply-adds per second
    LinkModel link;             // alpha-beta of the link
    int layers = 1;             // layers recomputed (each: all-gather, and the all-to-alls)
    int owner_layers = 0;       // layers before them whose K/V the owners send (CacheBlend: 1)
    double kv_bytes = 0.0;      // one token's K and V rows of one layer, in the cache's type
    double query_bytes = 0.0;   // one moved token's query (fp32)
    double state_bytes = 0.0;   // one moved token's partial: out and lse (fp32)
    double input_bytes = 0.0;   // one moved token's input row, sent once (CacheBlend), else 0
};

enum class BalanceMode { off, on, automatic };
const char* balance_mode_name(BalanceMode m);

// The modelled cost of one plan: its time and every rank's bytes over the whole recompute
// (sent + received, counted as comm/communicator.h counts them).
struct PlanCost {
    double ms = 0.0;
    std::vector<double> sent, recv;  // [P]
    double max_bytes() const;        // the busiest rank's sent + received
};

struct RecomputePlan {
    std::vector<int> runner;    // [n] rank that runs each token's layers
    std::vector<double> load;   // [P] modelled work per layer with this plan
    std::vector<double> owned;  // [P] the same with every token run by its owner
    int moved = 0;              // tokens with runner != owner
    BalanceMode mode = BalanceMode::off;
    PlanCost cost;        // this plan
    PlanCost owned_cost;  // every token on its owner
    double max_load() const;
    double mean_load() const;
};

RecomputePlan plan_recompute(const std::vector<RecomputeToken>& tokens, int n_ranks,
                             const RecomputeCost& cost, BalanceMode mode,
                             const BalanceModel& model);

// The whole-context exchanges ("gather", "compact-*", docs/design.md §5.2): every rank holds
// every key, so any rank runs any selected token alone and no bytes depend on who runs it.
// Tokens in position order, token i seeing `visible_keys[i]` keys; returns the rank that runs
// each: P contiguous runs of about equal work (cost.linear + cost.per_key * keys each), run p on
// rank p. `load` (optional) receives each rank's work per layer ([P]).
std::vector<int> deal_recompute(const std::vector<int>& visible_keys, int n_ranks,
                                const RecomputeCost& cost, std::vector<double>* load = nullptr);

// The model's figure for a given assignment (runner[i] for each token).
PlanCost plan_cost(const std::vector<RecomputeToken>& tokens, const std::vector<int>& runner,
                   const std::vector<double>& load, int n_ranks, const BalanceModel& model);

}  // namespace infoflow
