// Shard placement (runtime/method/placement.h, docs/design.md §5.1): place_chunks against a brute
// force over every contiguous cut, and parallel.placement = "tokens" (shard_edge_cuts,
// place_request): the cut request holds the same tokens in the same order, chunk 0 is never cut,
// and its shards are even to within the snap distance.
#include <algorithm>
#include <catch2/catch.hpp>
#include <functional>
#include <limits>
#include <numeric>
#include <random>

#include "runtime/method/placement.h"
#include "runtime/method/request.h"

using namespace infoflow;

namespace {

// The smallest largest shard over every way to cut chunks 1..K into P contiguous shards.
int64_t brute_best(const std::vector<int>& sizes, int P) {
    const int K = int(sizes.size()) - 1;
    int64_t best = std::numeric_limits<int64_t>::max();
    std::vector<int> cut(P - 1, 0);  // non-decreasing cut points in [0, K]
    std::function<void(int, int)> rec = [&](int s, int from) {
        if (s == P - 1) {
            int64_t worst = 0;
            int a = 0;
            for (int q = 0; q <= P - 1; ++q) {
                const int b = q < P - 1 ? cut[q] : K;
                int64_t load = 0;
                for (int i = a; i < b; ++i) load += sizes[i + 1];
                worst = std::max(worst, load);
                a = b;
            }
            best = std::min(best, worst);
            return;
        }
        for (int c = from; c <= K; ++c) {
            cut[s] = c;
            rec(s + 1, c);
        }
    };
    rec(0, 0);
    return best;
}

PreparedRequest request_of(const std::vector<int>& sizes) {
    PreparedRequest r;
    int32_t id = 0;
    for (int n : sizes) {
        std::vector<int32_t> ch(static_cast<size_t>(n));
        for (auto& t : ch) t = id++;
        r.chunks.push_back(ch);
    }
    r.suffix = {id, id + 1};
    r.question_end = 2;
    return r;
}

Config tokens_config() {
    Config c;
    c.parallel.placement = Config::Placement::tokens;
    return c;
}

}  // namespace

TEST_CASE("place_chunks: the largest shard is the brute-force optimum", "[cpu][placement]") {
    std::mt19937 rng(7);
    for (int trial = 0; trial < 200; ++trial) {
        const int K = 1 + int(rng() % 7);
        const int P = 1 + int(rng() % 4);
        std::vector<int> sizes{5};
        for (int i = 0; i < K; ++i) sizes.push_back(1 + int(rng() % 300));
        const Placement p = place_chunks(sizes, P);
        CAPTURE(trial, K, P);
        const int64_t worst = *std::max_element(p.shard_tokens.begin(), p.shard_tokens.end());
        CHECK(worst == brute_best(sizes, P));
        // every context chunk has one owner, shards contiguous, counted right
        int total = 0;
        for (int q = 0; q < P; ++q) {
            int n = 0;
            for (int c = p.first_chunk[q]; c < p.end_chunk[q]; ++c) {
                CHECK(p.chunk_rank[c] == q);
                n += sizes[c];
            }
            CHECK(n == p.shard_tokens[q]);
            total += n;
        }
        CHECK(total == std::accumulate(sizes.begin() + 1, sizes.end(), 0));
    }
}

TEST_CASE("placement tokens: the cut request keeps its tokens and evens the shards",
          "[cpu][placement]") {
    std::mt19937 rng(11);
    for (int trial = 0; trial < 300; ++trial) {
        const int K = 1 + int(rng() % 6);
        const int P = 2 + int(rng() % 3);
        std::vector<int> sizes{3 + int(rng() % 10)};
        for (int i = 0; i < K; ++i) sizes.push_back(1 + int(rng() % 2000));
        const PreparedRequest req = request_of(sizes);
        const PreparedRequest cut = place_request(req, tokens_config(), P);
        CAPTURE(trial, K, P);
        CHECK(cut.context_sequence() == req.context_sequence());
        CHECK(cut.chunks[0] == req.chunks[0]);
        CHECK(cut.suffix == req.suffix);
        REQUIRE(cut.n_chunks() >= req.n_chunks());
        CHECK(cut.n_chunks() <= req.n_chunks() + P - 1);  // at most one cut per edge
        for (const auto& ch : cut.chunks) CHECK(!ch.empty());
        // every old chunk boundary is still a boundary
        const std::vector<int> ob = req.chunk_offsets(), nb = cut.chunk_offsets();
        for (int o : ob) CHECK(std::find(nb.begin(), nb.end(), o) != nb.end());

        std::vector<int> csizes;
        for (const auto& ch : cut.chunks) csizes.push_back(int(ch.size()));
        const Placement p = place_chunks(csizes, P);
        const int C = req.context_tokens() - int(req.chunks[0].size());
        const int snap = std::max(1, C / (50 * P));
        const int worst = *std::max_element(p.shard_tokens.begin(), p.shard_tokens.end());
        // each edge is at most `snap` from round(s C / P): a shard is at most 2 snap + 1 above C /
        // P
        CHECK(worst <= (C + P - 1) / P + 2 * snap + 1);
        // and never worse than placing the whole chunks
        const Placement whole = place_chunks(sizes, P);
        CHECK(worst <= *std::max_element(whole.shard_tokens.begin(), whole.shard_tokens.end()));
    }
}

TEST_CASE("placement tokens: an edge next to a chunk boundary snaps onto it", "[cpu][placement]") {
    // 2 shards of 1000 + 1010 context tokens: the edge (1005) is 5 from the boundary at 1000,
    // within the snap distance max(1, 2010 / 100) = 20, so nothing is cut.
    CHECK(shard_edge_cuts({4, 1000, 1010}, 2) == std::vector<std::vector<int>>(3));
    // 600 + 1400: the edge (1000) lies 400 into the second chunk, which is cut there.
    CHECK(shard_edge_cuts({4, 600, 1400}, 2) == std::vector<std::vector<int>>{{}, {}, {400}});
    // one chunk of 3000 on 3 ranks: two cuts in it
    CHECK(shard_edge_cuts({4, 3000}, 3) == std::vector<std::vector<int>>{{}, {1000, 2000}});
}

TEST_CASE("placement chunks, or one rank: the request is unchanged", "[cpu][placement]") {
    const PreparedRequest req = request_of({4, 600, 1400});
    Config chunks;
    CHECK(place_request(req, chunks, 2).chunks == req.chunks);
    CHECK(place_request(req, tokens_config(), 1).chunks == req.chunks);
    CHECK(place_request(req, tokens_config(), 2).n_chunks() == 4);
}
