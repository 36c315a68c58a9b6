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

const char* balance_mode_name(BalanceMode m) {
    switch (m) {
        case BalanceMode::off: return "off";
        case BalanceMode::on: return "on";
        case BalanceMode::automatic: return "auto";
    }
    return "?";
}

double PlanCost::max_bytes() const {
    double most = 0.0;
    for (size_t r = 0; r < sent.size(); ++r) most = std::max(most, sent[r] + recv[r]);
    return most;
}

double RecomputePlan::max_load() const {
    return load.empty() ? 0.0 : *std::max_element(load.begin(), load.end());
}

double RecomputePlan::mean_load() const {
    return load.empty() ? 0.0
                        : std::accumulate(load.begin(), load.end(), 0.0) / double(load.size());
}

namespace {

// Who runs what, in counts: run[r] tokens run by r, own[r] tokens owned by r, moved[h][o] tokens
// of owner o run by helper h (h != o).
struct Counts {
    std::vector<int> run, own;
    std::vector<std::vector<int>> moved;
    int n_moved = 0;
    explicit Counts(int P) : run(P, 0), own(P, 0), moved(P, std::vector<int>(P, 0)) {}
};

// One collective's bytes into sent/recv, `times` times: an all-gather of blocks, or an
// all-to-all of the matrix S[q][r] (q sends to r).
void add_all_gather(const std::vector<double>& block, double times, PlanCost& c) {
    const int P = int(block.size());
    const double total = std::accumulate(block.begin(), block.end(), 0.0);
    for (int r = 0; r < P; ++r) {
        c.sent[r] += times * block[r] * (P - 1);
        c.recv[r] += times * (total - block[r]);
    }
}

void add_all_to_all(const std::vector<std::vector<size_t>>& s, double times, PlanCost& c) {
    const int P = int(s.size());
    for (int q = 0; q < P; ++q) {
        for (int r = 0; r < P; ++r) {
            if (q == r) continue;
            c.sent[q] += times * double(s[q][r]);
            c.recv[r] += times * double(s[q][r]);
        }
    }
}

// S[h][o] = moved[h][o] * bytes (helper to owner), or its transpose (owner to helper).
std::vector<std::vector<size_t>> moved_matrix(const Counts& k, double bytes, bool to_helper) {
    const int P = int(k.run.size());
    std::vector<std::vector<size_t>> s(P, std::vector<size_t>(P, 0));
    for (int h = 0; h < P; ++h) {
        for (int o = 0; o < P; ++o) {
            const size_t b = size_t(double(k.moved[h][o]) * bytes);
            (to_helper ? s[o][h] : s[h][o]) = b;
        }
    }
    return s;
}

PlanCost cost_of(const Counts& k, const std::vector<double>& load, const BalanceModel& m) {
    const int P = int(k.run.size());
    PlanCost c;
    c.sent.assign(P, 0.0);
    c.recv.assign(P, 0.0);
    if (P == 1) return c;
    std::vector<double> run_blocks(P), own_blocks(P);
    std::vector<size_t> run_b(P), own_b(P);
    for (int r = 0; r < P; ++r) {
        run_blocks[r] = k.run[r] * m.kv_bytes;
        own_blocks[r] = k.own[r] * m.kv_bytes;
        run_b[r] = size_t(run_blocks[r]);
        own_b[r] = size_t(own_blocks[r]);
    }
    const double compute = *std::max_element(load.begin(), load.end()) / (m.gmacs * 1e6);
    double layer = compute + m.link.all_gather_ms(run_b);
    add_all_gather(run_blocks, m.layers, c);
    add_all_gather(own_blocks, m.owner_layers, c);
    c.ms = m.owner_layers * m.link.all_gather_ms(own_b);
    if (k.n_moved > 0) {
        const auto q = moved_matrix(k, m.query_bytes, false);
        const auto st = moved_matrix(k, m.state_bytes, true);
        layer += m.link.all_to_all_ms(q) + m.link.all_to_all_ms(st);
        add_all_to_all(q, m.layers, c);
        add_all_to_all(st, m.layers, c);
        if (m.input_bytes > 0.0) {
            const auto in = moved_matrix(k, m.input_bytes, true);
            c.ms += m.link.all_to_all_ms(in);
            add_all_to_all(in, 1, c);
        }
    }
    c.ms += m.layers * layer;
    return c;
}

Counts counts_of(const std::vector<RecomputeToken>& tokens, const std::vector<int>& runner,
                 int P) {
    Counts k(P);
    for (size_t i = 0; i < tokens.size(); ++i) {
        const int o = tokens[i].owner, h = runner[i];
        k.own[o]++;
        k.run[h]++;
        if (h != o) {
            k.moved[h][o]++;
            k.n_moved++;
        }
    }
    return k;
}

}  // namespace

PlanCost plan_cost(const std::vector<RecomputeToken>& tokens, const std::vector<int>& runner,
                   const std::vector<double>& load, int n_ranks, const BalanceModel& model) {
    return cost_of(counts_of(tokens, runner, n_ranks), load, model);
}

RecomputePlan plan_recompute(const std::vector<RecomputeToken>& tokens, int n_ranks,
                             const RecomputeCost& cost, BalanceMode mode,
                             const BalanceModel& model) {
    IF_CHECK(n_ranks >= 1, "recompute plan needs at least one rank, got " << n_ranks);
    IF_CHECK(model.gmacs > 0.0 && model.link.beta_gbs > 0.0,
             "recompute plan: compute rate and link bandwidth must be positive");
    const int n = int(tokens.size());
    RecomputePlan plan;
    plan.mode = mode;
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
    Counts k = counts_of(tokens, plan.runner, n_ranks);
    plan.owned_cost = cost_of(k, plan.load, model);
    plan.cost = plan.owned_cost;
    if (mode == BalanceMode::off || n_ranks == 1) return plan;
    // Sorted by helper part and taken from the back: the largest first (fewest tokens moved,
    // so fewest bytes), ties the latest position first.
    for (auto& kk : kept) {
        std::stable_sort(kk.begin(), kk.end(),
                         [&](int a, int b) { return helper_part(a) < helper_part(b); });
    }
    // The greedy pass, move by move; `best` is the number of moves of the cheapest prefix.
    std::vector<std::pair<int, int>> moves;  // (token, helper)
    size_t best = 0;
    double best_ms = plan.owned_cost.ms;
    std::vector<double> load = plan.load;
    // Each move lowers the busiest rank and leaves the receiver below that old maximum, so the
    // sorted load vector falls strictly and the loop ends.
    for (;;) {
        const int hi = int(std::max_element(load.begin(), load.end()) - load.begin());
        const int lo = int(std::min_element(load.begin(), load.end()) - load.begin());
        if (hi == lo || kept[hi].empty()) break;
        // The largest movable token that still fits under the old maximum.
        std::vector<int>& kk = kept[hi];
        int pick = -1;
        for (int j = int(kk.size()) - 1; j >= 0; --j) {
            if (load[lo] + helper_part(kk[j]) < load[hi]) {
                pick = j;
                break;
            }
        }
        if (pick < 0) break;
        const int i = kk[pick];
        kk.erase(kk.begin() + pick);
        load[hi] -= helper_part(i);
        load[lo] += helper_part(i);
        k.run[hi]--;
        k.run[lo]++;
        k.moved[lo][hi]++;
        k.n_moved++;
        moves.emplace_back(i, lo);
        const double ms = cost_of(k, load, model).ms;
        if (ms < best_ms) {
            best_ms = ms;
            best = moves.size();
        }
    }
    const size_t take = mode == BalanceMode::on ? moves.size() : best;
    for (size_t j = 0; j < take; ++j) {
        const auto [i, h] = moves[j];
        plan.load[tokens[i].owner] -= helper_part(i);
        plan.load[h] += helper_part(i);
        plan.runner[i] = h;
        plan.moved++;
    }
    plan.cost = plan_cost(tokens, plan.runner, plan.load, n_ranks, model);
    return plan;
}

std::vector<int> deal_recompute(const std::vector<int>& visible_keys, int n_ranks,
                                const RecomputeCost& cost, std::vector<double>* load) {
    const int n = int(visible_keys.size());
    std::vector<double> work(n);
    double total = 0.0;
    for (int i = 0; i < n; ++i) {
        work[i] = cost.linear + cost.per_key * double(visible_keys[i]);
        total += work[i];
    }
    // Token i goes to the rank whose share of the total holds the middle of its work: the ranks
    // rise with i, so each run is contiguous.
    std::vector<int> runner(n, 0);
    std::vector<double> per_rank(size_t(n_ranks), 0.0);
    double before = 0.0;
    for (int i = 0; i < n; ++i) {
        const double mid = before + 0.5 * work[i];
        const int r = total > 0.0 ? int(mid / total * n_ranks) : 0;
        runner[i] = std::clamp(r, 0, n_ranks - 1);
        per_rank[size_t(runner[i])] += work[i];
        before += work[i];
    }
    if (load) *load = per_rank;
    return runner;
}

}  // namespace infoflow
