#include "runtime/parallel/recompute_balance.h"

#include <algorithm>
#include <numeric>

#include "runtime/core/error.h"

namespace infoflow {

RecomputeCost recompute_cost(const ModelConfig& c) {
    const double d = c.n_embd, qd = double(c.n_head) * c.head_dim;
    const double kvd = double(c.n_head_kv) * c.head_dim;
    RecomputeCost cost;
    cost.linear = d * (qd + 2 * kvd) + qd * d + 3.0 * d * c.n_ff;
    cost.per_key = 2.0 * qd;
    return cost;
}

double RecomputePlan::max_load() const {
    return load.empty() ? 0.0 : *std::max_element(load.begin(), load.end());
}

double RecomputePlan::mean_load() const {
    return load.empty() ? 0.0
                        : std::accumulate(load.begin(), load.end(), 0.0) / double(load.size());
}

RecomputePlan plan_recompute(const std::vector<RecomputeToken>& tokens, int n_ranks,
                             const RecomputeCost& cost, bool balance) {
    IF_CHECK(n_ranks >= 1, "recompute plan needs at least one rank, got " << n_ranks);
    const int n = int(tokens.size());
    RecomputePlan plan;
    plan.runner.resize(n);
    plan.load.assign(n_ranks, 0.0);
    // On its owner a token costs its projections, MLP and attention over every visible key;
    // moved, the owner keeps the attention over its shard and the helper takes the rest.
    auto helper_part = [&](int i) {
        return cost.linear + cost.per_key * double(tokens[i].other_keys);
    };
    std::vector<std::vector<int>> kept(n_ranks);  // movable tokens of each rank
    for (int i = 0; i < n; ++i) {
        const RecomputeToken& t = tokens[i];
        IF_CHECK(t.owner >= 0 && t.owner < n_ranks, "recompute plan: token "
                                                        << i << " owned by rank " << t.owner
                                                        << " of " << n_ranks);
        plan.runner[i] = t.owner;
        plan.load[t.owner] += helper_part(i) + cost.per_key * double(t.shard_keys);
        kept[t.owner].push_back(i);
    }
    plan.owned = plan.load;
    if (!balance || n_ranks == 1) return plan;
    // Sorted by helper part and taken from the back: the largest first (fewest tokens moved,
    // so fewest bytes), ties the latest position first.
    for (auto& k : kept) {
        std::stable_sort(k.begin(), k.end(),
                         [&](int a, int b) { return helper_part(a) < helper_part(b); });
    }
    // Each move lowers the busiest rank and leaves the receiver below that old maximum, so the
    // sorted load vector falls strictly and the loop ends.
    for (;;) {
        const int hi =
            int(std::max_element(plan.load.begin(), plan.load.end()) - plan.load.begin());
        const int lo =
            int(std::min_element(plan.load.begin(), plan.load.end()) - plan.load.begin());
        if (hi == lo || kept[hi].empty()) break;
        // The largest movable token that still fits under the old maximum.
        std::vector<int>& k = kept[hi];
        int pick = -1;
        for (int j = int(k.size()) - 1; j >= 0; --j) {
            if (plan.load[lo] + helper_part(k[j]) < plan.load[hi]) {
                pick = j;
                break;
            }
        }
        if (pick < 0) break;
        const int i = k[pick];
        k.erase(k.begin() + pick);
        plan.runner[i] = lo;
        plan.load[hi] -= helper_part(i);
        plan.load[lo] += helper_part(i);
        plan.moved++;
    }
    return plan;
}

}  // namespace infoflow
