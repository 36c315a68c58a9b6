#include "runtime/model/kv_evict.h"

#include <algorithm>
#include <numeric>

#include "runtime/core/error.h"

namespace infoflow {

std::vector<int> heavy_hitters(const std::vector<double>& score, int n, int budget, int recent) {
    IF_CHECK(int(score.size()) >= n,
             "heavy_hitters: " << score.size() << " scores for " << n << " slots");
    std::vector<int> keep;
    if (n <= budget) {
        keep.resize(n);
        std::iota(keep.begin(), keep.end(), 0);
        return keep;
    }
    const int r = std::min(std::max(recent, 0), budget);
    const int older = n - r;  // candidates [0, older)
    std::vector<int> cand(older);
    std::iota(cand.begin(), cand.end(), 0);
    const int hh = budget - r;
    std::partial_sort(cand.begin(), cand.begin() + hh, cand.end(), [&](int a, int b) {
        return score[a] != score[b] ? score[a] > score[b] : a < b;
    });
    keep.assign(cand.begin(), cand.begin() + hh);
    for (int s = older; s < n; ++s) keep.push_back(s);
    std::sort(keep.begin(), keep.end());
    return keep;
}

std::vector<int> sink_and_recent(int n, int budget, int sink) {
    std::vector<int> keep;
    if (n <= budget) {
        keep.resize(n);
        std::iota(keep.begin(), keep.end(), 0);
        return keep;
    }
    const int s = std::min(std::max(sink, 0), budget);
    for (int i = 0; i < s; ++i) keep.push_back(i);
    for (int i = n - (budget - s); i < n; ++i) keep.push_back(i);
    return keep;
}

void compact_layer(Model& model, KvCache& cache, int layer, const std::vector<int>& keep) {
    const int k = int(keep.size());
    if (k == 0) return;
    for (int i = 0; i < k; ++i) {
        IF_CHECK(keep[i] >= i && keep[i] < cache.size() && (i == 0 || keep[i] > keep[i - 1]),
                 "compact_layer: keep list not sorted, unique and inside the cache");
    }
    Backend& be = model.backend();
    const size_t row = size_t(cache.row());
    Buffer kb = be.alloc_floats(size_t(k) * row);
    Buffer vb = be.alloc_floats(size_t(k) * row);
    cache.read_rows(layer, keep.data(), kb.data(), vb.data(), k);
    std::vector<int32_t> delta(k);
    bool moved = false;
    for (int i = 0; i < k; ++i) {
        delta[i] = int32_t(i - keep[i]);  // slot s holds position s
        moved = moved || delta[i] != 0;
    }
    if (!moved) return;
    model.rerotate_keys(kb.data(), k, delta.data());
    cache.write_range(layer, 0, k, kb.data(), vb.data());
}

void finish_compaction(KvCache& cache, int k) {
    IF_CHECK(k >= 0 && k <= cache.size(),
             "finish_compaction: " << k << " outside [0, " << cache.size() << "]");
    cache.truncate(k);
    for (int i = 0; i < k; ++i) cache.set_pos(i, i);
}

}  // namespace infoflow
