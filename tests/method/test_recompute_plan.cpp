// The "kv" recompute plan (runtime/parallel/recompute_balance.h) against an independent recount:
// every load is recomputed here from the runners the plan chose, the moves conserve the total
// work, a skewed selection ends near its balanced mean, and balance = false moves nothing.
#include <catch2/catch.hpp>
#include <numeric>
#include <random>

#include "runtime/parallel/recompute_balance.h"

using namespace infoflow;

namespace {

// Loads recounted from the runners: the owner pays its shard's keys for every token it owns,
// the runner the projections, MLP and the other keys.
std::vector<double> recount(const std::vector<RecomputeToken>& t, const RecomputePlan& plan, int P,
                            const RecomputeCost& cost) {
    std::vector<double> load(P, 0.0);
    for (size_t i = 0; i < t.size(); ++i) {
        load[t[i].owner] += cost.per_key * t[i].shard_keys;
        load[plan.runner[i]] += cost.linear + cost.per_key * t[i].other_keys;
    }
    return load;
}

// A selection over P equal shards of `shard` tokens each (rank 0 = the last shard), `per_rank[r]`
// tokens picked at random in rank r's shard, with its key counts as the runtime computes them.
std::vector<RecomputeToken> selection(const std::vector<int>& per_rank, int shard, int c0,
                                      uint32_t seed) {
    const int P = int(per_rank.size());
    std::mt19937 rng(seed);
    std::vector<std::pair<int, int>> picked;  // (global index, owner)
    for (int r = 0; r < P; ++r) {
        const int first = (P - 1 - r) * shard;
        std::vector<int> idx(shard);
        std::iota(idx.begin(), idx.end(), first);
        std::shuffle(idx.begin(), idx.end(), rng);
        for (int j = 0; j < per_rank[r]; ++j) picked.push_back({idx[j], r});
    }
    std::sort(picked.begin(), picked.end());
    std::vector<RecomputeToken> t;
    std::vector<int> seen(P, 0);
    for (size_t i = 0; i < picked.size(); ++i) {
        const int g = picked[i].first, o = picked[i].second;
        RecomputeToken x;
        x.owner = o;
        x.shard_keys = g - (P - 1 - o) * shard + 1;
        x.other_keys = c0 + int(i) - seen[o]++;
        t.push_back(x);
    }
    return t;
}

// The widths of SmolLM2-135M, the shape the plan is tuned on.
ModelConfig smollm2_shape() {
    ModelConfig c;
    c.n_embd = 576;
    c.n_head = 9;
    c.n_head_kv = 3;
    c.head_dim = 64;
    c.n_ff = 1536;
    return c;
}

}  // namespace

TEST_CASE("recompute cost counts the layer's multiply-adds", "[cpu][parallel]") {
    const ModelConfig c = smollm2_shape();
    const RecomputeCost cost = recompute_cost(c);
    // q, k, v: 576 x (576 + 2 * 192); o: 576 x 576; gate, up, down: 3 x 576 x 1536.
    CHECK(cost.linear == Approx(576.0 * 960 + 576.0 * 576 + 3.0 * 576 * 1536));
    CHECK(cost.per_key == Approx(2.0 * 576));
}

TEST_CASE("recompute plan: loads match a recount, work is conserved, skew is removed",
          "[cpu][parallel]") {
    const ModelConfig c = smollm2_shape();
    const RecomputeCost cost = recompute_cost(c);
    struct Case {
        std::vector<int> per_rank;
        int shard;
    };
    for (const Case& k : {Case{{900, 325}, 4096}, Case{{600, 150, 80, 40}, 2048},
                          Case{{300, 300}, 4096}, Case{{10, 400, 20}, 1024}}) {
        const int P = int(k.per_rank.size());
        const auto t = selection(k.per_rank, k.shard, 24, 7 + P);
        const RecomputePlan off = plan_recompute(t, P, cost, false);
        const RecomputePlan on = plan_recompute(t, P, cost, true);
        CAPTURE(P, k.per_rank);
        CHECK(off.moved == 0);
        for (size_t i = 0; i < t.size(); ++i) CHECK(off.runner[i] == t[i].owner);
        const auto off_recount = recount(t, off, P, cost);
        const auto on_recount = recount(t, on, P, cost);
        int moved = 0;
        for (int r = 0; r < P; ++r) {
            CHECK(off.load[r] == Approx(off_recount[r]).epsilon(1e-12));
            CHECK(on.load[r] == Approx(on_recount[r]).epsilon(1e-12));
            CHECK(on.owned[r] == Approx(off.load[r]).epsilon(1e-12));
        }
        for (size_t i = 0; i < t.size(); ++i) moved += on.runner[i] != t[i].owner;
        CHECK(on.moved == moved);
        const double total_off = std::accumulate(off.load.begin(), off.load.end(), 0.0);
        const double total_on = std::accumulate(on.load.begin(), on.load.end(), 0.0);
        CHECK(total_on == Approx(total_off).epsilon(1e-12));
        CHECK(on.max_load() <= off.max_load());
        // Within about one token's work of the mean (one token is ~1/1000 of the total here).
        CHECK(on.max_load() <= on.mean_load() * 1.02);
        if (off.max_load() > off.mean_load() * 1.05) CHECK(on.moved > 0);
    }
}

TEST_CASE("recompute plan: one rank, or nothing selected, moves nothing", "[cpu][parallel]") {
    const RecomputeCost cost{100.0, 2.0};
    std::vector<RecomputeToken> t(5);
    for (int i = 0; i < 5; ++i) t[i] = {0, i + 1, 3};
    const RecomputePlan one = plan_recompute(t, 1, cost, true);
    CHECK(one.moved == 0);
    CHECK(one.load[0] == Approx(5 * 100.0 + 2.0 * (15 + 15)));
    const RecomputePlan none = plan_recompute({}, 3, cost, true);
    CHECK(none.moved == 0);
    CHECK(none.max_load() == 0.0);
    t[2].owner = 3;
    CHECK_THROWS_WITH(plan_recompute(t, 2, cost, true), Catch::Contains("owned by rank 3"));
}
