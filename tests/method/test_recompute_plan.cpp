// The "kv" recompute plan (runtime/parallel/recompute_balance.h) against an independent recount:
// every load is recomputed here from the runners the plan chose, the moves conserve the total
// work, a skewed selection ends near its balanced mean, and balance = false moves nothing; the
// modelled bytes against a recount by the communicator's counting rules; "auto" against the
// link: everything moved on a free link, nothing on a slow one, never slower than either end.
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

// The model of the SmolLM2 shape: f32 K/V rows (2 x 192 floats), 9 heads of 64.
BalanceModel smollm2_model(double gmacs, double alpha_us, double beta_gbs) {
    BalanceModel m;
    m.gmacs = gmacs;
    m.link.alpha_us = alpha_us;
    m.link.beta_gbs = beta_gbs;
    m.layers = 30;
    m.kv_bytes = 2.0 * 192 * 4;
    m.query_bytes = 9.0 * 64 * 4;
    m.state_bytes = 9.0 * 65 * 4;
    return m;
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
        const BalanceModel bm = smollm2_model(60.0, 1.0, 8.0);
        const RecomputePlan off = plan_recompute(t, P, cost, BalanceMode::off, bm);
        const RecomputePlan on = plan_recompute(t, P, cost, BalanceMode::on, bm);
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
    const BalanceModel bm = smollm2_model(60.0, 1.0, 8.0);
    const RecomputePlan one = plan_recompute(t, 1, cost, BalanceMode::on, bm);
    CHECK(one.moved == 0);
    CHECK(one.load[0] == Approx(5 * 100.0 + 2.0 * (15 + 15)));
    CHECK(one.cost.ms == 0.0);
    const RecomputePlan none = plan_recompute({}, 3, cost, BalanceMode::on, bm);
    CHECK(none.moved == 0);
    CHECK(none.max_load() == 0.0);
    t[2].owner = 3;
    CHECK_THROWS_WITH(plan_recompute(t, 2, cost, BalanceMode::on, bm),
                      Catch::Contains("owned by rank 3"));
}

TEST_CASE("recompute plan: modelled bytes equal a recount by the communicator's rules",
          "[cpu][parallel]") {
    // Per layer each runner all-gathers its tokens' K/V (sent: its block to P-1 ranks; received:
    // every other block); with moved tokens each helper sends their queries to the owners and
    // receives their partials back; CacheBlend's owner layers and moved inputs on top.
    const RecomputeCost cost = recompute_cost(smollm2_shape());
    for (const int P : {2, 3, 4}) {
        std::vector<int> per_rank(P, 40);
        per_rank[0] = 400;
        const auto t = selection(per_rank, 2048, 24, 11 + P);
        BalanceModel bm = smollm2_model(60.0, 1.0, 8.0);
        bm.owner_layers = 1;
        bm.layers = 29;
        bm.input_bytes = 576.0 * 4;
        const RecomputePlan on = plan_recompute(t, P, cost, BalanceMode::on, bm);
        REQUIRE(on.moved > 0);
        std::vector<double> sent(P, 0.0), recv(P, 0.0);
        std::vector<double> run(P, 0.0), own(P, 0.0);
        for (size_t i = 0; i < t.size(); ++i) {
            run[on.runner[i]] += 1;
            own[t[i].owner] += 1;
            const int h = on.runner[i], o = t[i].owner;
            if (h == o) continue;
            const double per_layer_q = bm.query_bytes, per_layer_s = bm.state_bytes;
            sent[h] += bm.layers * per_layer_q;
            recv[o] += bm.layers * per_layer_q;
            sent[o] += bm.layers * per_layer_s + bm.input_bytes;
            recv[h] += bm.layers * per_layer_s + bm.input_bytes;
        }
        const double n = double(t.size());
        for (int r = 0; r < P; ++r) {
            sent[r] += bm.kv_bytes * (bm.layers * run[r] + bm.owner_layers * own[r]) * (P - 1);
            recv[r] += bm.kv_bytes * (bm.layers * (n - run[r]) + bm.owner_layers * (n - own[r]));
        }
        CAPTURE(P, on.moved);
        for (int r = 0; r < P; ++r) {
            CHECK(on.cost.sent[r] == Approx(sent[r]).epsilon(1e-9));
            CHECK(on.cost.recv[r] == Approx(recv[r]).epsilon(1e-9));
        }
        // Every token on its owner: K/V alone, the owned plan's figures.
        for (int r = 0; r < P; ++r) {
            CHECK(on.owned_cost.sent[r] ==
                  Approx(bm.kv_bytes * (bm.layers + bm.owner_layers) * own[r] * (P - 1)));
        }
    }
}

TEST_CASE("recompute plan: auto moves what pays on the link, never slower than on or off",
          "[cpu][parallel]") {
    const RecomputeCost cost = recompute_cost(smollm2_shape());
    const auto t = selection({900, 325}, 4096, 24, 9);
    // A free link: every move lowers the modelled time, so auto takes the whole greedy pass.
    const BalanceModel free_link = smollm2_model(60.0, 0.0, 1e12);
    const RecomputePlan on = plan_recompute(t, 2, cost, BalanceMode::on, free_link);
    const RecomputePlan a = plan_recompute(t, 2, cost, BalanceMode::automatic, free_link);
    CHECK(on.moved > 0);
    CHECK(a.moved == on.moved);
    CHECK(a.runner == on.runner);
    // Fast compute on a slow link (an 8B-class GPU over TCP): a moved token's bytes cost more
    // than its compute, so auto keeps every token on its owner.
    const BalanceModel slow = smollm2_model(150000.0, 30.0, 1.2);
    const RecomputePlan a2 = plan_recompute(t, 2, cost, BalanceMode::automatic, slow);
    const RecomputePlan on2 = plan_recompute(t, 2, cost, BalanceMode::on, slow);
    CHECK(a2.moved == 0);
    CHECK(on2.cost.ms > on2.owned_cost.ms);
    CHECK(a2.cost.max_bytes() == Approx(a2.owned_cost.max_bytes()));
    // In between: whatever auto picks is no slower than either end.
    for (const double gbs : {0.05, 0.5, 5.0, 50.0}) {
        const BalanceModel m = smollm2_model(60.0, 2.0, gbs);
        const RecomputePlan x = plan_recompute(t, 2, cost, BalanceMode::automatic, m);
        const RecomputePlan y = plan_recompute(t, 2, cost, BalanceMode::on, m);
        CAPTURE(gbs, x.moved, y.moved);
        CHECK(x.cost.ms <= y.cost.ms + 1e-9);
        CHECK(x.cost.ms <= x.owned_cost.ms + 1e-9);
        CHECK(x.cost.ms == Approx(plan_cost(t, x.runner, x.load, 2, m).ms));
    }
}
