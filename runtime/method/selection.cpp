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
