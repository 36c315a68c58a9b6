#include "runtime/method/placement.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "runtime/core/error.h"

namespace infoflow {

Placement place_chunks(const std::vector<int>& chunk_sizes, int n_ranks) {
    IF_CHECK(n_ranks >= 1, "placement needs at least one rank, got " << n_ranks);
    IF_CHECK(!chunk_sizes.empty(), "placement needs chunk 0");
    const int K = int(chunk_sizes.size()) - 1;  // context chunks 1..K
    const int P = n_ranks;
    std::vector<int64_t> prefix(K + 1, 0);
    for (int i = 0; i < K; ++i) prefix[i + 1] = prefix[i] + chunk_sizes[i + 1];
    auto load = [&](int a, int b) { return prefix[b] - prefix[a]; };

    // best[s][i]: smallest possible max load placing chunks [0, i) (of 1..K) on s shards.
    const int64_t inf = std::numeric_limits<int64_t>::max();
    std::vector<std::vector<int64_t>> best(P + 1, std::vector<int64_t>(K + 1, inf));
    std::vector<std::vector<int>> cut(P + 1, std::vector<int>(K + 1, 0));
    best[0][0] = 0;
    for (int s = 1; s <= P; ++s) {
        for (int i = 0; i <= K; ++i) {
            for (int j = 0; j <= i; ++j) {
                if (best[s - 1][j] == inf) continue;
                const int64_t v = std::max(best[s - 1][j], load(j, i));
                if (v < best[s][i]) {
                    best[s][i] = v;
                    cut[s][i] = j;
                }
            }
        }
    }
    Placement p;
    p.n_ranks = P;
    p.chunk_rank.assign(K + 1, -1);
    p.first_chunk.assign(P, 1);
    p.end_chunk.assign(P, 1);
    p.shard_tokens.assign(P, 0);
    int end = K;
    for (int s = P; s >= 1; --s) {
        const int begin = cut[s][end];
        const int rank = P - s;  // shard s-1 (position order) -> rank P-1-(s-1)
        p.first_chunk[rank] = begin + 1;
        p.end_chunk[rank] = end + 1;
        p.shard_tokens[rank] = int(load(begin, end));
        for (int c = begin; c < end; ++c) p.chunk_rank[c + 1] = rank;
        end = begin;
    }
    return p;
}

std::vector<std::vector<int>> shard_edge_cuts(const std::vector<int>& chunk_sizes, int n_ranks) {
    IF_CHECK(n_ranks >= 1, "placement needs at least one rank, got " << n_ranks);
    IF_CHECK(!chunk_sizes.empty(), "placement needs chunk 0");
    const int K = int(chunk_sizes.size()) - 1;
    std::vector<int64_t> bound(K + 1, 0);  // context offsets of the chunk boundaries
    for (int i = 0; i < K; ++i) bound[i + 1] = bound[i] + chunk_sizes[i + 1];
    const int64_t C = bound[K];
    std::vector<std::vector<int>> cuts(chunk_sizes.size());
    if (C == 0) return cuts;
    const int64_t snap = std::max<int64_t>(1, C / (50 * int64_t(n_ranks)));
    for (int s = 1; s < n_ranks; ++s) {
        const int64_t edge = (int64_t(s) * C + n_ranks / 2) / n_ranks;
        // chunk c (1-based) holds context offsets [bound[c-1], bound[c])
        const int c = int(std::upper_bound(bound.begin(), bound.end(), edge) - bound.begin());
        if (c > K) continue;  // edge == C: the end
        const int64_t lo = bound[c - 1], hi = bound[c];
        if (edge - lo <= snap || hi - edge <= snap) continue;  // at (or next to) a boundary
        std::vector<int>& v = cuts[size_t(c)];
        const int at = int(edge - lo);
        if (v.empty() || v.back() < at) v.push_back(at);
    }
    return cuts;
}

}  // namespace infoflow
