// Scoring (docs/design.md §3.3) against a plain reference that materializes the attention matrix,
// for both aggregates and all four layouts; the positions each layout assigns; selection
// tie-breaking (§3.4); EPIC's set and the reorder rule (§3.7, §4) on hand-built cases.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>

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
        for (int variant = 0; variant < 3; ++variant) {
            // norm, sum, and norm with scoring.value_norm (each layer's column x ||v_j||)
            const bool sum = variant == 1, vnorm = variant == 2;
            ScoreOptions opt;
            opt.layout = layout;
            opt.layers = layers;
            opt.aggregate_sum = sum;
            opt.value_norm = vnorm;
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
                // ||v_j|| of this layer, all KV heads (value_norm); 1 otherwise.
                std::vector<double> vn(T, 1.0);
                for (int j = 0; vnorm && j < T; ++j) {
                    double sq = 0.0;
                    for (int e = 0; e < row; ++e) {
                        const double x = cache.v(l)[size_t(j) * row + e];
                        sq += x * x;
                    }
                    vn[j] = std::sqrt(sq);
                }
                std::vector<double> layer_ref(T, 0.0);
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
                                layer_ref[j] += p;
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
                        layer_ref[j] = std::sqrt(sq) / double(layers.size());
                    }
                }
                for (int j = 0; j < T; ++j) ref[j] += layer_ref[j] * vn[j];
            }
            CAPTURE(to_string(layout), sum, vnorm);
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

namespace {

// select_infoflow by its definition, as a greedy loop: scores max-pooled over the span (same
// chunk), quotas filled first with each chunk's best pooled scores, then one slot at a time the
// slot whose pooled score / (1 + decay * (slots already taken from its chunk)) is largest.
std::vector<int> greedy_reference(const std::vector<double>& score, const std::vector<int32_t>& pos,
                                  const std::vector<uint8_t>& el, const std::vector<int>& chunk,
                                  int k, const SelectOptions& o) {
    const int T = int(score.size());
    std::vector<double> s(score);
    for (int j = 0; j < T; ++j) {
        for (int i = 0; i < T; ++i) {
            if (el[j] && el[i] && chunk[i] == chunk[j] && std::abs(i - j) <= o.span) {
                s[j] = std::max(s[j], score[i]);
            }
        }
    }
    auto before = [&](int a, int b) { return s[a] != s[b] ? s[a] > s[b] : pos[a] < pos[b]; };
    std::map<int, int> n_c, taken;
    int N = 0;
    for (int j = 0; j < T; ++j) {
        if (el[j]) ++n_c[chunk[j]], ++N;
    }
    k = std::min(k, N);
    const int F = int(std::floor(o.chunk_floor * k + 1e-9));
    std::vector<uint8_t> in(T, 0);
    std::vector<int> quota;
    for (const auto& [c, n] : n_c) {
        const int q = F > 0 ? std::min(n, std::max(1, int(int64_t(F) * n / N))) : 0;
        std::vector<int> mine;
        for (int j = 0; j < T; ++j) {
            if (el[j] && chunk[j] == c) mine.push_back(j);
        }
        std::sort(mine.begin(), mine.end(), before);
        quota.insert(quota.end(), mine.begin(), mine.begin() + q);
    }
    // the weight a slot would have if taken next from its chunk (its rank among the chunk's)
    auto weight = [&](int j) {
        int rank = 0;
        for (int i = 0; i < T; ++i) rank += el[i] && chunk[i] == chunk[j] && before(i, j);
        return s[j] / (1.0 + o.chunk_decay * rank);
    };
    auto wbefore = [&](int a, int b) {
        const double wa = weight(a), wb = weight(b);
        return wa != wb ? wa > wb : pos[a] < pos[b];
    };
    std::vector<int> out;
    if (int(quota.size()) >= k) {
        std::sort(quota.begin(), quota.end(), wbefore);
        out.assign(quota.begin(), quota.begin() + k);
    } else {
        for (int j : quota) in[j] = 1, ++taken[chunk[j]];
        out = quota;
        while (int(out.size()) < k) {
            int best = -1;
            double bw = 0.0;
            for (int j = 0; j < T; ++j) {
                if (!el[j] || in[j]) continue;
                const double w = s[j] / (1.0 + o.chunk_decay * taken[chunk[j]]);
                if (best < 0 || w > bw || (w == bw && pos[j] < pos[best])) best = j, bw = w;
            }
            in[best] = 1;
            ++taken[chunk[best]];
            out.push_back(best);
        }
    }
    std::sort(out.begin(), out.end(), [&](int a, int b) { return pos[a] < pos[b]; });
    return out;
}

}  // namespace

TEST_CASE("selection variants: hand cases and a greedy reference", "[selection]") {
    // chunk 0 = slot 0; chunk 1 = slots 1..5; chunk 2 = slots 6..9; chunk 3 = slots 10..11.
    const std::vector<int> chunk{0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3};
    const std::vector<double> score{9, 1, 8, 1, 1, 7, 0.5, 0.2, 0.3, 0.1, 0.05, 0.04};
    std::vector<int32_t> pos(12);
    std::iota(pos.begin(), pos.end(), 0);
    std::vector<uint8_t> el(12, 1);
    el[0] = 0;
    SelectOptions o;
    CHECK(select_infoflow(score, pos, el, chunk, 3, o) == select_top_k(score, pos, el, 3));
    o.span = 1;  // the neighbours of the peaks at 2 and 5 come first (ties: lower position)
    CHECK(select_infoflow(score, pos, el, chunk, 3, o) == std::vector<int>{1, 2, 3});
    CHECK(select_infoflow(score, pos, el, chunk, 6, o) == std::vector<int>{1, 2, 3, 4, 5, 6});
    o = SelectOptions();
    o.chunk_floor = 1.0;  // every chunk gets a quota: 4 slots -> chunks 1, 2, 3 at least one
    const std::vector<int> fl = select_infoflow(score, pos, el, chunk, 4, o);
    CHECK(fl == std::vector<int>{2, 5, 6, 10});
    o = SelectOptions();
    o.chunk_decay = 100.0;  // the second slot of chunk 1 counts 7/101 < chunk 2's best 0.5
    CHECK(select_infoflow(score, pos, el, chunk, 2, o) == std::vector<int>{2, 6});

    // Random cases against the greedy reference.
    std::mt19937 rng(5);
    for (int trial = 0; trial < 300; ++trial) {
        const int K = 2 + int(rng() % 5);
        std::vector<int> ch{0, 0};
        for (int c = 1; c < K; ++c) {
            for (int t = 0, n = 1 + int(rng() % 9); t < n; ++t) ch.push_back(c);
        }
        const int T = int(ch.size());
        std::vector<double> sc(T);
        for (double& x : sc) x = double(rng() % 7);  // many ties
        std::vector<int32_t> ps(T);
        std::iota(ps.begin(), ps.end(), 0);
        std::vector<uint8_t> e(T);
        for (int j = 0; j < T; ++j) e[j] = ch[j] != 0;
        SelectOptions opt;
        opt.span = int(rng() % 3);
        opt.chunk_decay = (rng() % 3) * 0.5;
        opt.chunk_floor = (rng() % 5) * 0.25;
        const int k = int(rng() % uint32_t(T + 2));
        CAPTURE(trial, opt.span, opt.chunk_decay, opt.chunk_floor, k);
        CHECK(select_infoflow(sc, ps, e, ch, k, opt) == greedy_reference(sc, ps, e, ch, k, opt));
    }
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

TEST_CASE("prefill_chunk_into writes the rows prefill_chunk and assemble_cache write",
          "[scoring]") {
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
                           std::vector<int32_t>(gpos.begin(), gpos.begin() + c0), nullptr, direct);
            KvCache scratch = tm.m->make_cache(14 + (sink ? 1 : 0));  // the longest chunk
            for (size_t k = 1; k < order.size(); ++k) {
                const int ci = order[k];
                const int at = direct.size();
                direct.append(chunks[ci].size(), gpos.data() + at, nullptr);
                const ChunkKv shadow =
                    prefill_chunk_into(*tm.m, req.chunks[ci], req.sink_id, scratch, direct, at);
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
