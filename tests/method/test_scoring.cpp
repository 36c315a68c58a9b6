// Scoring (docs/design.md §3.3) against a plain reference that materializes the attention matrix, for
// both aggregates and all four layouts; the positions each layout assigns; selection
// tie-breaking (§3.4); EPIC's set and the reorder rule (§3.7, §4) on hand-built cases.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>

#include "runtime/method/chunk_kv.h"
#include "runtime/method/scoring.h"
#include "runtime/method/selection.h"
#include "tests/method/method_fixture.h"

using namespace infoflow;
using namespace infoflow::test;

namespace {

// Records post-RoPE queries of every layer.
class CaptureTap final : public LayerTap {
  public:
    std::map<int, std::vector<float>> q;
    bool wants(int) const override { return true; }
    void on_attention(int layer, const float* qp, const float*, int n, const int32_t*,
                      const int32_t*, const KvCache&) override {
        q[layer].assign(qp, qp + size_t(n) * size_);
    }
    size_t size_ = 0;
};

std::vector<ChunkKv> make_chunks(Model& m, const PreparedRequest& req) {
    std::vector<ChunkKv> chunks;
    for (int i = 0; i < req.n_chunks(); ++i) {
        chunks.push_back(prefill_chunk(m, req.chunks[i], i == 0 ? -1 : req.sink_id));
    }
    return chunks;
}

// Every K and V byte of slots [0, n) of every layer is the same in both caches.
void check_same_rows(const KvCache& a, const KvCache& b, int n_layer, int n) {
    const size_t bytes = size_t(n) * a.row_bytes();
    std::vector<char> ka(bytes), va(bytes), kb(bytes), vb(bytes);
    for (int l = 0; l < n_layer; ++l) {
        a.read_range_raw(l, 0, n, ka.data(), va.data());
        b.read_range_raw(l, 0, n, kb.data(), vb.data());
        CHECK(ka == kb);
        CHECK(va == vb);
    }
}

}  // namespace

TEST_CASE("layout positions", "[scoring]") {
    // chunk 0: 3 tokens; chunk 1: 4 tokens (local 1..4 after a sink); chunk 2: 2 tokens.
    std::vector<ChunkKv> ch(3);
    ch[0].tokens = {1, 2, 3};
    ch[0].local_pos = {0, 1, 2};
    ch[1].tokens = {4, 5, 6, 7};
    ch[1].local_pos = {1, 2, 3, 4};
    ch[2].tokens = {8, 9};
    ch[2].local_pos = {1, 2};
    const std::vector<int> order{0, 1, 2};
    using V = std::vector<int32_t>;
    auto g = layout_positions(Config::Layout::global, ch, order);
    CHECK(g.key_pos == V{0, 1, 2, 3, 4, 5, 6, 7, 8});
    CHECK(g.row_start == 9);
    auto a = layout_positions(Config::Layout::hl_tp, ch, order);
    CHECK(a.key_pos == V{0, 1, 2, 1, 2, 3, 4, 1, 2});
    CHECK(a.row_start == 9);
    auto b = layout_positions(Config::Layout::hl_hp, ch, order);
    CHECK(b.key_pos == V{0, 1, 2, 1, 2, 3, 4, 1, 2});
    CHECK(b.row_start == 5);  // right after the longest chunk (local end 5)
    auto t = layout_positions(Config::Layout::tl_tp, ch, order);
    CHECK(t.key_pos == V{0, 1, 2, 5, 6, 7, 8, 7, 8});
    CHECK(t.row_start == 9);
    CHECK(global_positions(ch, {0, 2, 1}) == V{0, 1, 2, 3, 4, 5, 6, 7, 8});
}

TEST_CASE("scoring equals a materialized attention reference", "[scoring]") {
    TinyModel tm;
    const ModelConfig& c = tm.w.config;
    const PreparedRequest req = random_request(8, c.n_vocab, 4, {9, 14, 6}, 7);
    const std::vector<ChunkKv> chunks = make_chunks(*tm.m, req);
    const std::vector<int> order{0, 1, 2, 3};
    const std::vector<int32_t> rows(req.suffix.begin() + req.question_begin,
                                    req.suffix.begin() + req.question_end);
    const int T = req.context_tokens();
    const int n = int(rows.size());
    const std::vector<int> layers{1, 3};
    for (auto layout : {Config::Layout::global, Config::Layout::hl_tp, Config::Layout::hl_hp,
                        Config::Layout::tl_tp}) {
        for (bool sum : {false, true}) {
            ScoreOptions opt;
            opt.layout = layout;
            opt.layers = layers;
            opt.aggregate_sum = sum;
            const std::vector<double> got = score_context(*tm.m, chunks, order, rows, opt);

            // Reference: run the rows with a capturing tap, then build P in double precision.
            const LayoutPositions lp = layout_positions(layout, chunks, order);
            KvCache cache = tm.m->make_cache(T + n);
            assemble_cache(*tm.m, chunks, order, lp.key_pos, nullptr, cache);
            std::vector<int32_t> pos(n), slots(n);
            for (int i = 0; i < n; ++i) pos[i] = lp.row_start + i;
            const int first = cache.append(n, pos.data(), nullptr);
            for (int i = 0; i < n; ++i) slots[i] = first + i;
            CaptureTap tap;
            tap.size_ = size_t(c.n_head) * c.head_dim;
            std::vector<float> h(size_t(n) * c.n_embd);
            tm.m->embed(rows.data(), n, h.data());
            std::vector<double> ref(T, 0.0);
            const int row = cache.row();
            const int g = c.n_head / c.n_head_kv;
            const double scale = 1.0 / std::sqrt(double(c.head_dim));
            for (int l = 0; l <= 3; ++l) {
                tm.m->layer_forward(l, h.data(), n, pos.data(), nullptr, slots.data(), cache, &tap);
                if (l != 1 && l != 3) continue;
                std::vector<double> abar(size_t(n) * T, 0.0);
                for (int hh = 0; hh < c.n_head; ++hh) {
                    for (int i = 0; i < n; ++i) {
                        std::vector<double> s(T + n, -INFINITY);
                        double mx = -INFINITY;
                        for (int j = 0; j < T + n; ++j) {
                            if (cache.pos()[j] > pos[i]) continue;
                            const float* kj = cache.k(l) + size_t(j) * row + (hh / g) * c.head_dim;
                            const float* qi =
                                tap.q[l].data() + (size_t(i) * c.n_head + hh) * c.head_dim;
                            double d = 0.0;
                            for (int e = 0; e < c.head_dim; ++e) d += double(qi[e]) * kj[e];
                            s[j] = d * scale;
                            mx = std::max(mx, s[j]);
                        }
                        double z = 0.0;
                        for (int j = 0; j < T + n; ++j)
                            z += s[j] == -INFINITY ? 0.0 : std::exp(s[j] - mx);
                        for (int j = 0; j < T; ++j) {
                            const double p = s[j] == -INFINITY ? 0.0 : std::exp(s[j] - mx) / z;
                            if (sum) {
                                ref[j] += p;
                            } else {
                                abar[size_t(i) * T + j] += p / c.n_head;
                            }
                        }
                    }
                }
                if (!sum) {
                    for (int j = 0; j < T; ++j) {
                        double sq = 0.0;
                        for (int i = 0; i < n; ++i)
                            sq += abar[size_t(i) * T + j] * abar[size_t(i) * T + j];
                        ref[j] += std::sqrt(sq) / double(layers.size());
                    }
                }
            }
            CAPTURE(to_string(layout), sum);
            REQUIRE(got.size() == ref.size());
            double worst = 0.0, top = 0.0;
            for (int j = 0; j < T; ++j) {
                worst = std::max(worst, std::fabs(got[j] - ref[j]));
                top = std::max(top, std::fabs(ref[j]));
            }
            CHECK(worst <= 1e-4 * top);
            CHECK(top > 0.0);
        }
    }
}

TEST_CASE("selection: top-k with ties to the lower position, sorted, chunk 0 excluded",
          "[selection]") {
    const std::vector<double> score{5, 1, 3, 3, 3, 0, 9, 3};
    const std::vector<int32_t> pos{0, 1, 2, 3, 4, 5, 6, 7};
    std::vector<uint8_t> eligible{0, 1, 1, 1, 1, 1, 1, 1};  // slot 0 is chunk 0
    CHECK(select_top_k(score, pos, eligible, 3) == std::vector<int>{2, 3, 6});
    CHECK(select_top_k(score, pos, eligible, 1) == std::vector<int>{6});
    CHECK(select_top_k(score, pos, eligible, 100).size() == 7);
    CHECK(select_top_k(score, pos, eligible, 0).empty());
    // Positions, not slot order, break ties and sort the result.
    const std::vector<int32_t> shuffled{0, 7, 6, 5, 4, 3, 2, 1};
    CHECK(select_top_k(score, shuffled, eligible, 3) == std::vector<int>{7, 6, 4});
    CHECK(recompute_budget(0.15, 1000) == 150);
    CHECK(recompute_budget(1.0, 37) == 37);
    CHECK(recompute_budget(0.0, 37) == 0);
}

TEST_CASE("epic takes the leading tokens of every chunk after chunk 0", "[selection]") {
    // chunks in slot order: ids 0, 1, 2 with sizes 4, 10, 5 starting at 0, 4, 14.
    const std::vector<int> id{0, 1, 2}, begin{0, 4, 14}, size{4, 10, 5};
    CHECK(epic_selection(id, begin, size, false, 0.2, 0) == std::vector<int>{4, 5, 14});
    CHECK(epic_selection(id, begin, size, true, 0.0, 3) == std::vector<int>{4, 5, 6, 14, 15, 16});
    CHECK(epic_selection(id, begin, size, true, 0.0, 7) ==
          std::vector<int>{4, 5, 6, 7, 8, 9, 10, 14, 15, 16, 17, 18});
}

TEST_CASE("reorder sorts chunks by ascending selected fraction, stable, chunk 0 first",
          "[selection]") {
    // chunks 0..3 of sizes 2, 4, 4, 2; selection hits chunk 1 twice, chunk 3 once.
    const std::vector<int> slot_chunk{0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3};
    const std::vector<int> sizes{2, 4, 4, 2};
    CHECK(reorder_by_selection({2, 3, 10}, slot_chunk, sizes) == std::vector<int>{0, 2, 1, 3});
    CHECK(reorder_by_selection({}, slot_chunk, sizes) == std::vector<int>{0, 1, 2, 3});
    CHECK(reorder_by_selection({0, 1, 6}, slot_chunk, sizes) == std::vector<int>{0, 1, 3, 2});
}

TEST_CASE("cacheblend ranks tokens by their layer-1 K/V deviation", "[selection]") {
    // 4 tokens, row 3: token 2 deviates most, then token 0; token 1 not at all.
    const std::vector<float> cached{1, 1, 1, 0, 0, 0, 2, 2, 2, 5, 5, 5};
    const std::vector<float> fresh{1, 2, 1, 0, 0, 0, 2, 5, 0, 5, 5, 5.5f};
    const std::vector<double> d = kv_deviation(fresh.data(), cached.data(), 4, 3);
    CHECK(d == std::vector<double>{1.0, 0.0, 13.0, 0.25});
    const std::vector<int32_t> pos{0, 1, 2, 3};
    CHECK(select_top_k(d, pos, {1, 1, 1, 1}, 2) == std::vector<int>{0, 2});
    CHECK(select_top_k(d, pos, {0, 1, 1, 1}, 2) == std::vector<int>{2, 3});  // chunk 0 excluded
}

TEST_CASE("scoring in the context cache and the releasing assembly change no bit", "[scoring]") {
    // The single-rank pipeline scores the global layout in its context cache (score_assembled)
    // and frees each chunk's K/V as it is assembled; both must equal the separate scoring cache
    // and the keeping assembly exactly, in every KV type.
    for (KvDtype dt : {KvDtype::f32, KvDtype::f16, KvDtype::bf16}) {
        TinyModel tm;
        tm.m->set_kv_dtype(dt);
        const ModelConfig& c = tm.w.config;
        const PreparedRequest req = random_request(11, c.n_vocab, 4, {9, 14, 6}, 5);
        std::vector<ChunkKv> chunks = make_chunks(*tm.m, req);
        const std::vector<int> order{0, 2, 1, 3};  // out of order: positions follow `order`
        const std::vector<int32_t> rows(req.suffix.begin() + req.question_begin,
                                        req.suffix.begin() + req.question_end);
        const int T = req.context_tokens();
        ScoreOptions opt;
        opt.layers = {1, 3};
        const std::vector<double> separate = score_context(*tm.m, chunks, order, rows, opt);

        const std::vector<int32_t> gpos = global_positions(chunks, order);
        KvCache keep = tm.m->make_cache(T + 8);
        assemble_cache(*tm.m, chunks, order, gpos, nullptr, keep);
        KvCache released = tm.m->make_cache(T + 8);
        assemble_cache_releasing(*tm.m, chunks, order, gpos, nullptr, released);
        CAPTURE(kv_dtype_name(dt));
        for (const ChunkKv& ck : chunks) {
            CHECK_FALSE(has_kv(ck));
            CHECK(!ck.tokens.empty());  // tokens and positions stay
        }
        CHECK_THROWS_WITH(assemble_cache(*tm.m, chunks, order, gpos, nullptr, keep),
                          Catch::Contains("were released"));
        REQUIRE(released.size() == T);
        check_same_rows(keep, released, c.n_layer, T);

        const std::vector<double> in_place =
            score_assembled(*tm.m, released, T, int32_t(T), rows, opt);
        CHECK(in_place == separate);  // bit for bit
        CHECK(released.size() == T);  // the scoring rows are dropped again
        CHECK_THROWS_WITH(score_assembled(*tm.m, keep, T - 1, T - 1, rows, opt),
                          Catch::Contains("context slots"));
    }
}

TEST_CASE("prefill_chunk_into writes the rows prefill_chunk and assemble_cache write", "[scoring]") {
    // The sequence-parallel shard prefill puts each own chunk straight into the shard's cache
    // through one reused scratch cache; every row must equal the keeping path's bit for bit, in
    // every KV type, with and without a sink, re-rotated or not.
    for (KvDtype dt : {KvDtype::f32, KvDtype::f16, KvDtype::bf16}) {
        for (bool sink : {true, false}) {
            TinyModel tm;
            tm.m->set_kv_dtype(dt);
            const ModelConfig& c = tm.w.config;
            PreparedRequest req = random_request(23, c.n_vocab, 4, {9, 14, 6}, 5);
            if (!sink) req.sink_id = -1;
            std::vector<ChunkKv> chunks = make_chunks(*tm.m, req);
            const std::vector<int> order{0, 2, 1, 3};  // chunk 2 moves forward: keys re-rotated
            const std::vector<int32_t> gpos = global_positions(chunks, order);
            const int T = req.context_tokens();
            KvCache keep = tm.m->make_cache(T + 4);
            assemble_cache(*tm.m, chunks, order, gpos, nullptr, keep);

            KvCache direct = tm.m->make_cache(T + 4);
            const int c0 = chunks[0].size();
            assemble_cache(*tm.m, chunks, {0},
                           std::vector<int32_t>(gpos.begin(), gpos.begin() + c0), nullptr,
                           direct);
            KvCache scratch = tm.m->make_cache(14 + (sink ? 1 : 0));  // the longest chunk
            for (size_t k = 1; k < order.size(); ++k) {
                const int ci = order[k];
                const int at = direct.size();
                direct.append(chunks[ci].size(), gpos.data() + at, nullptr);
                const ChunkKv shadow = prefill_chunk_into(*tm.m, req.chunks[ci], req.sink_id,
                                                          scratch, direct, at);
                CHECK_FALSE(has_kv(shadow));
                CHECK(shadow.tokens == chunks[ci].tokens);
                CHECK(shadow.local_pos == chunks[ci].local_pos);
            }
            CAPTURE(kv_dtype_name(dt), sink);
            REQUIRE(direct.size() == T);
            CHECK(direct.pos() == keep.pos());
            check_same_rows(keep, direct, c.n_layer, T);
            if (!sink) {  // at its own positions (no rotation): the chunk's K/V as prefilled
                const ChunkKv& ck = chunks[2];
                KvCache lone = tm.m->make_cache(ck.size());
                lone.append(ck.size(), ck.local_pos.data(), nullptr);
                prefill_chunk_into(*tm.m, req.chunks[2], -1, scratch, lone, 0);
                const size_t bytes = ck.size() * keep.row_bytes();
                std::vector<char> k(bytes), v(bytes);
                for (int l = 0; l < c.n_layer; ++l) {
                    lone.read_range_raw(l, 0, ck.size(), k.data(), v.data());
                    CHECK(std::memcmp(k.data(), ck.k[l].data(), bytes) == 0);
                    CHECK(std::memcmp(v.data(), ck.v[l].data(), bytes) == 0);
                }
            }
            KvCache small = tm.m->make_cache(5);
            CHECK_THROWS_WITH(
                prefill_chunk_into(*tm.m, req.chunks[2], req.sink_id, small, direct, 0),
                Catch::Contains("scratch cache of 5 slots"));
            CHECK_THROWS_WITH(
                prefill_chunk_into(*tm.m, req.chunks[2], req.sink_id, scratch, direct, T - 3),
                Catch::Contains("outside the"));
        }
    }
}
