// REFORM and its baselines (runtime/method/reform.h, runtime/model/kv_evict.h) on a tiny random
// model and on hand-built vectors: with a budget and a gather set covering the input, reform,
// h2o and streamingllm equal `full` (the chunked forward is exact without eviction); the H2O
// statistics equal an independent host computation of layer 0's attention and the eviction
// keeps exactly the heavy hitters computed from it (checked through the re-positioned layer-0
// keys); early exit leaves the embeddings unchanged; max-pool, kept ends and the scores on
// hand-built vectors; the emulated shards of a P-rank run.
#include <catch2/catch.hpp>
#include <cmath>

#include "runtime/method/reform.h"
#include "runtime/model/kv_evict.h"
#include "tests/cpu_paths/cpu_paths.h"
#include "tests/method/method_fixture.h"

using namespace infoflow;
using namespace infoflow::test;

namespace {
constexpr double kTol = 1e-4;
const std::vector<int32_t> kNoStop;

Config reform_config(Config::Method m) {
    Config c = method_config(m);
    c.reform.chunk_size = 16;
    c.reform.budget = 48;
    c.reform.recent = 8;
    c.reform.sink = 4;
    c.reform.heads = {{1, 0, 'k'}, {0, 1, 'q'}, {2, 1, 'v'}};
    c.reform.pool = 5;
    c.reform.gather = 20;
    c.reform.keep_ends = 4;
    return c;
}
}  // namespace

TEST_CASE("reform, h2o and streamingllm with budget and gather covering the input equal full",
          "[method][reform]") {
    TinyModel tm;
    const PreparedRequest req = random_request(3, tm.w.config.n_vocab, 5, {40, 33, 27}, 9);
    const MethodResult full = run_method(*tm.m, req, method_config(Config::Method::full), kNoStop);
    for (auto m : {Config::Method::reform, Config::Method::h2o, Config::Method::streamingllm}) {
        Config cfg = reform_config(m);
        cfg.reform.budget = 512;  // never compressed
        cfg.reform.gather = 1000;
        const MethodResult r = run_method(*tm.m, req, cfg, kNoStop);
        CAPTURE(to_string(m));
        CHECK(rel_err(r.first_logits, full.first_logits) <= kTol);
        CHECK(r.answer == full.answer);
        if (m == Config::Method::reform) {
            CHECK(int(r.selected_positions.size()) == req.context_tokens());
        }
    }
    // With compression the baselines differ from full but stay deterministic.
    Config small = reform_config(Config::Method::h2o);
    const MethodResult a = run_method(*tm.m, req, small, kNoStop);
    const MethodResult b = run_method(*tm.m, req, small, kNoStop);
    CHECK(a.first_logits == b.first_logits);
    CHECK(rel_err(a.first_logits, full.first_logits) > kTol);
}

TEST_CASE("heavy hitters and sink + recent on hand-built scores", "[method][reform]") {
    const std::vector<double> s = {5, 1, 9, 3, 9, 2, 7, 0};
    // recent {6, 7}; of 0..5 the top 3: 2 (9), 4 (9, tie to the lower slot after 2), 0 (5).
    CHECK(heavy_hitters(s, 8, 5, 2) == std::vector<int>{0, 2, 4, 6, 7});
    CHECK(heavy_hitters(s, 8, 3, 0) == std::vector<int>{2, 4, 6});
    CHECK(heavy_hitters(s, 8, 3, 5) == std::vector<int>{5, 6, 7});  // recent capped at budget
    CHECK(heavy_hitters(s, 8, 8, 2) == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
    CHECK(sink_and_recent(8, 5, 2) == std::vector<int>{0, 1, 5, 6, 7});
    CHECK(sink_and_recent(8, 3, 4) == std::vector<int>{0, 1, 2});
}

TEST_CASE("H2O statistics equal layer 0's attention, eviction keeps those heavy hitters",
          "[method][reform]") {
    TinyModel tm;
    const ModelConfig& c = tm.w.config;
    const int n = 12;
    std::vector<int32_t> toks;
    for (int i = 0; i < n; ++i) toks.push_back(int32_t(5 + 37 * i % 400));
    // Independent oracle: layer 0's q and k from the embeddings, softmax on the host in double.
    std::vector<int32_t> pos(n);
    for (int i = 0; i < n; ++i) pos[i] = i;
    std::vector<float> h(size_t(n) * c.n_embd), q(size_t(n) * c.n_head * c.head_dim),
        k(size_t(n) * c.n_head_kv * c.head_dim), v(k.size());
    tm.m->embed(toks.data(), n, h.data());
    tm.m->layer_qkv(0, h.data(), n, pos.data(), q.data(), k.data(), v.data());
    std::vector<double> ref(n, 0.0);
    const int D = c.head_dim, G = c.n_head / c.n_head_kv;
    for (int hd = 0; hd < c.n_head; ++hd) {
        for (int i = 0; i < n; ++i) {
            std::vector<double> logit(i + 1);
            double mx = -1e300;
            for (int j = 0; j <= i; ++j) {
                double d = 0.0;
                for (int x = 0; x < D; ++x) {
                    d += double(q[(size_t(i) * c.n_head + hd) * D + x]) *
                         k[(size_t(j) * c.n_head_kv + hd / G) * D + x];
                }
                logit[j] = d / std::sqrt(double(D));
                mx = std::max(mx, logit[j]);
            }
            double z = 0.0;
            for (double& l : logit) z += (l = std::exp(l - mx));
            for (int j = 0; j <= i; ++j) ref[j] += logit[j] / z;
        }
    }
    RecurrentSpec spec;
    spec.chunk = n;
    spec.budget = 64;
    spec.n_layers = 2;
    {
        RecurrentForward rf(*tm.m, spec);
        rf.feed_context(toks, nullptr);
        CHECK(rf.compressions() == 0);
        for (int j = 0; j < n; ++j) {
            CAPTURE(j);
            CHECK(std::fabs(rf.accumulated(0)[j] - ref[j]) <=
                  test::logits_bar(1e-4) * std::max(1.0, ref[j]));
        }
    }
    // budget 6, recent 2: layer 0 keeps heavy_hitters(ref); slot i then holds token keep[i]'s
    // layer-0 key at position i, which depends on the token and position alone.
    spec.budget = 6;
    spec.recent = 2;
    RecurrentForward rf(*tm.m, spec);
    rf.feed_context(toks, nullptr);
    CHECK(rf.compressions() == 1);
    REQUIRE(rf.cache().size() == 6);
    const std::vector<int> keep = heavy_hitters(ref, n, 6, 2);
    REQUIRE(keep.size() == 6);
    std::vector<int32_t> kept_tok, new_pos;
    for (int i = 0; i < 6; ++i) {
        kept_tok.push_back(toks[size_t(keep[i])]);
        new_pos.push_back(i);
        CHECK(rf.cache().pos()[size_t(i)] == i);
    }
    std::vector<float> h6(size_t(6) * c.n_embd), k6(size_t(6) * c.n_head_kv * D), v6(k6.size());
    tm.m->embed(kept_tok.data(), 6, h6.data());
    tm.m->layer_kv(0, h6.data(), 6, new_pos.data(), k6.data(), v6.data());
    std::vector<float> ck(k6.size()), cv(k6.size());
    rf.cache().read_range(0, 0, 6, ck.data(), cv.data());
    CHECK(rel_err(ck, k6) <= 1e-5);
    CHECK(rel_err(cv, v6) <= 1e-6);
    // The statistics moved with their slots.
    for (int i = 0; i < 6; ++i)
        CHECK(rf.accumulated(0)[i] == Approx(ref[keep[i]]).epsilon(test::logits_bar(1e-4)));
}

TEST_CASE("early exit leaves the saved embeddings unchanged", "[method][reform]") {
    TinyModel tm;
    const PreparedRequest req = random_request(5, tm.w.config.n_vocab, 5, {40, 33, 27}, 9);
    RecurrentSpec spec;
    spec.chunk = 16;
    spec.budget = 24;
    spec.recent = 4;
    spec.heads = {{1, 0, 'k'}, {0, 3, 'q'}, {1, 1, 'v'}};
    spec.n_layers = 2;  // the deepest chosen layer is 1
    Embeddings q_early, q_all;
    int peak_early = 0;
    const Embeddings early =
        reform_compress(*tm.m, req, spec, 0, req.context_tokens(), &q_early, &peak_early);
    spec.n_layers = tm.w.config.n_layer;
    const Embeddings all = reform_compress(*tm.m, req, spec, 0, req.context_tokens(), &q_all);
    REQUIRE(early.size() == req.context_tokens());
    CHECK(early.data == all.data);
    CHECK(q_early.data == q_all.data);
    CHECK(q_early.size() == req.question_end - req.question_begin);
    CHECK(peak_early <= 24 + 16);
    // Each head block is a unit vector.
    for (int i = 0; i < early.size(); ++i) {
        for (int hb = 0; hb < early.heads; ++hb) {
            double ss = 0.0;
            for (int x = 0; x < early.head_dim; ++x) {
                const double e = early.row(i)[hb * early.head_dim + x];
                ss += e * e;
            }
            CHECK(ss == Approx(1.0).epsilon(1e-5));
        }
    }
}

TEST_CASE("max-pool, kept ends and retrieval scores on hand-built vectors", "[method][reform]") {
    const std::vector<float> s = {0, 5, 1, 0, 0, 0, 7, 0, 0, 2};
    CHECK(max_pool(s, 1) == s);
    CHECK(max_pool(s, 3) == std::vector<float>{5, 5, 5, 1, 0, 7, 7, 7, 2, 2});
    CHECK(max_pool(s, 5) == std::vector<float>{5, 5, 5, 5, 7, 7, 7, 7, 7, 2});
    CHECK(max_pool(s, 129) == std::vector<float>(10, 7.0f));
    const std::vector<float> pooled = max_pool(s, 3);
    // Ends {0, 9}; of 1..8 the top 2: 5 and 6 (7, ties to the lower index).
    CHECK(gather_indices(pooled, 2, 1) == std::vector<int>{0, 5, 6, 9});
    CHECK(gather_indices(pooled, 3, 0) == std::vector<int>{5, 6, 7});
    CHECK(gather_indices(pooled, 0, 3) == std::vector<int>{0, 1, 2, 7, 8, 9});
    CHECK(gather_indices(pooled, 100, 2).size() == 10);
    // The top tokens are ranked over the whole context: those inside the kept ends count, and
    // no lower-scoring token is taken in their place.
    const std::vector<float> at_end = {9, 9, 0, 1, 2, 3, 0, 0, 0, 0};
    CHECK(gather_indices(at_end, 2, 1) == std::vector<int>{0, 1, 9});
    CHECK(gather_indices(at_end, 3, 1) == std::vector<int>{0, 1, 5, 9});
    CHECK(gather_indices(at_end, 3, 2) == std::vector<int>{0, 1, 5, 8, 9});
    // Two heads of dimension 2: the score is the best mean cosine over the question rows.
    Embeddings ctx{2, 2, {1, 0, 0, 1, /**/ 0, 1, 0, 1, /**/ 0, 1, 1, 0}};
    Embeddings qe{2, 2, {1, 0, 1, 0, /**/ 0, 1, 0, 1}};
    const std::vector<float> sc = retrieval_scores(ctx, qe);
    CHECK(sc == std::vector<float>{0.5f, 1.0f, 0.5f});
}

TEST_CASE("shard bounds and emulated shards", "[method][reform]") {
    CHECK(shard_bounds(10, 3) == std::vector<int>{0, 3, 6, 10});
    CHECK(shard_bounds(7, 1) == std::vector<int>{0, 7});
    TinyModel tm;
    const PreparedRequest req = random_request(7, tm.w.config.n_vocab, 5, {40, 33, 27}, 9);
    // Layer-0 V depends on the token alone: every shard split embeds the same, so emulated
    // ranks gather what one rank gathers.
    Config cfg = reform_config(Config::Method::reform);
    cfg.reform.heads = {{0, 0, 'v'}, {0, 1, 'v'}};
    const MethodResult one = run_method(*tm.m, req, cfg, kNoStop);
    // The top 20 united with 2 x 4 ends: between 20 and 28 tokens.
    REQUIRE(int(one.selected_positions.size()) >= 20);
    REQUIRE(int(one.selected_positions.size()) <= 20 + 2 * 4);
    for (int P : {2, 3}) {
        cfg.parallel.emulate_ranks = P;
        const MethodResult r = run_method(*tm.m, req, cfg, kNoStop);
        CAPTURE(P);
        CHECK(r.selected_positions == one.selected_positions);
        CHECK(r.answer == one.answer);
    }
}
