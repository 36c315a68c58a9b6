#include "runtime/method/selection.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/core/error.h"

namespace infoflow {

int recompute_budget(double ratio, int T) {
    IF_CHECK(ratio >= 0.0 && ratio <= 1.0, "method.ratio " << ratio << " outside [0, 1]");
    return int(std::floor(ratio * T + 1e-9));
}

std::vector<int> select_top_k(const std::vector<double>& score, const std::vector<int32_t>& pos,
                              const std::vector<uint8_t>& eligible, int k) {
    IF_CHECK(score.size() == pos.size() && pos.size() == eligible.size(),
             "select_top_k: size mismatch");
    std::vector<int> cand;
    for (size_t j = 0; j < score.size(); ++j) {
        if (eligible[j]) cand.push_back(int(j));
    }
    k = std::max(0, std::min(k, int(cand.size())));
    auto better = [&](int a, int b) {
        if (score[a] != score[b]) return score[a] > score[b];
        return pos[a] < pos[b];
    };
    std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), better);
    cand.resize(k);
    std::sort(cand.begin(), cand.end(), [&](int a, int b) { return pos[a] < pos[b]; });
    return cand;
}

std::vector<int> select_infoflow(const std::vector<double>& score, const std::vector<int32_t>& pos,
                                 const std::vector<uint8_t>& eligible,
                                 const std::vector<int>& slot_chunk, int k,
                                 const SelectOptions& opt) {
    if (opt.plain()) return select_top_k(score, pos, eligible, k);
    const int T = int(score.size());
    IF_CHECK(int(pos.size()) == T && int(eligible.size()) == T && int(slot_chunk.size()) == T,
             "select_infoflow: size mismatch");
    IF_CHECK(
        opt.span >= 0 && opt.chunk_decay >= 0.0 && opt.chunk_floor >= 0.0 && opt.chunk_floor <= 1.0,
        "select_infoflow: bad options");
    // (1) max-pooling over the span, within the chunk.
    std::vector<double> s(score);
    if (opt.span > 0) {
        for (int j = 0; j < T; ++j) {
            if (!eligible[j]) continue;
            for (int i = std::max(0, j - opt.span); i <= std::min(T - 1, j + opt.span); ++i) {
                if (eligible[i] && slot_chunk[i] == slot_chunk[j]) s[j] = std::max(s[j], score[i]);
            }
        }
    }
    // (2) rank within each chunk, weight by 1 / (1 + decay * m).
    auto better = [&](const std::vector<double>& v, int a, int b) {
        if (v[a] != v[b]) return v[a] > v[b];
        return pos[a] < pos[b];
    };
    std::vector<std::vector<int>> by_chunk;
    for (int j = 0; j < T; ++j) {
        if (!eligible[j]) continue;
        if (by_chunk.empty() || slot_chunk[by_chunk.back().front()] != slot_chunk[j]) {
            by_chunk.emplace_back();
        }
        by_chunk.back().push_back(j);
    }
    std::vector<double> w(s);
    for (std::vector<int>& c : by_chunk) {
        std::sort(c.begin(), c.end(), [&](int a, int b) { return better(s, a, b); });
        for (size_t m = 0; m < c.size(); ++m)
            w[size_t(c[m])] = s[size_t(c[m])] / (1.0 + opt.chunk_decay * double(m));
    }
    // (3) quotas, then the rest by global rank.
    int N = 0;
    for (const auto& c : by_chunk) N += int(c.size());
    k = std::max(0, std::min(k, N));
    const int F = int(std::floor(opt.chunk_floor * k + 1e-9));
    std::vector<int> quota, rest;
    for (const std::vector<int>& c : by_chunk) {
        const int n_c = int(c.size());
        const int q = F > 0 ? std::min(n_c, std::max(1, int(int64_t(F) * n_c / N))) : 0;
        // c is sorted by s; by w it is the same order (weights decrease along it).
        quota.insert(quota.end(), c.begin(), c.begin() + q);
        rest.insert(rest.end(), c.begin() + q, c.end());
    }
    auto by_w = [&](int a, int b) { return better(w, a, b); };
    std::vector<int> out;
    if (int(quota.size()) >= k) {
        std::partial_sort(quota.begin(), quota.begin() + k, quota.end(), by_w);
        out.assign(quota.begin(), quota.begin() + k);
    } else {
        const int r = k - int(quota.size());
        std::partial_sort(rest.begin(), rest.begin() + r, rest.end(), by_w);
        out = quota;
        out.insert(out.end(), rest.begin(), rest.begin() + r);
    }
    std::sort(out.begin(), out.end(), [&](int a, int b) { return pos[a] < pos[b]; });
    return out;
}

std::vector<int> epic_selection(const std::vector<int>& chunk_id,
                                const std::vector<int>& chunk_begin,
                                const std::vector<int>& chunk_size, bool fixed, double ratio,
                                int k) {
    std::vector<int> s;
    for (size_t c = 0; c < chunk_id.size(); ++c) {
        if (chunk_id[c] == 0) continue;
        const int n =
            fixed ? std::min(k, chunk_size[c]) : int(std::floor(ratio * chunk_size[c] + 1e-9));
        for (int t = 0; t < n; ++t) s.push_back(chunk_begin[c] + t);
    }
    std::sort(s.begin(), s.end());
    return s;
}

std::vector<double> kv_deviation(const float* fresh, const float* cached, int n, int row) {
    std::vector<double> d(n, 0.0);
    for (int j = 0; j < n; ++j) {
        double acc = 0.0;
        for (int e = 0; e < row; ++e) {
            const double x = double(fresh[size_t(j) * row + e]) - cached[size_t(j) * row + e];
            acc += x * x;
        }
        d[j] = acc;
    }
    return d;
}

std::vector<int> reorder_by_selection(const std::vector<int>& selected,
                                      const std::vector<int>& slot_chunk,
                                      const std::vector<int>& chunk_size) {
    const int K = int(chunk_size.size());
    std::vector<int> hits(K, 0);
    for (int j : selected) hits[slot_chunk[j]]++;
    std::vector<int> order(K > 0 ? K - 1 : 0);
    std::iota(order.begin(), order.end(), 1);
    auto frac = [&](int c) { return chunk_size[c] ? double(hits[c]) / chunk_size[c] : 0.0; };
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return frac(a) < frac(b); });
    order.insert(order.begin(), 0);
    return order;
}

}  // namespace infoflow
