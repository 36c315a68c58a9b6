// docs/design.md §6 invariants of the single-rank method (§6.1, §6.2, §6.5), on a tiny random
// model: infoflow at ratio 1 equals full in every layout (with and without reorder), ratio 0 equals
// none, re-positioning by a delta equals rotating at the global position (llama3 scaling too),
// one chunk without a sink equals full, and the recompute mask is exactly key_pos <= query_pos.
#include <catch2/catch.hpp>

#include "runtime/method/chunk_kv.h"
#include "runtime/method/recompute.h"
#include "runtime/method/scoring.h"
#include "tests/cpu_paths/cpu_paths.h"
#include "tests/method/method_fixture.h"

using namespace infoflow;
using namespace infoflow::test;

namespace {
const std::vector<int32_t> kNoStop;
}  // namespace

TEST_CASE("infoflow at ratio 1 equals full, every layout, with and without reorder [6.1]",
          "[method][invariant]") {
    TinyModel tm;
    const PreparedRequest req = random_request(1, tm.w.config.n_vocab, 5, {17, 9, 23, 12}, 8);
    const MethodResult full = run_method(*tm.m, req, method_config(Config::Method::full), kNoStop);
    for (auto layout : {Config::Layout::global, Config::Layout::hl_tp, Config::Layout::hl_hp,
                        Config::Layout::tl_tp}) {
        for (bool reorder : {false, true}) {
            for (auto query : {Config::Query::question, Config::Query::suffix}) {
                Config cfg = method_config(Config::Method::infoflow, 1.0);
                cfg.scoring.layout = layout;
                cfg.method.reorder = reorder;
                cfg.scoring.query = query;
                const MethodResult r = run_method(*tm.m, req, cfg, kNoStop);
                CAPTURE(to_string(layout), reorder, to_string(query));
                CHECK(int(r.selected_positions.size()) == req.context_tokens() - 5);
                CHECK(rel_err(r.first_logits, full.first_logits) <= test::path_tolerance().logits);
                CHECK(r.answer == full.answer);
            }
        }
    }
}

TEST_CASE("cacheblend and epic recomputing everything equal full [6.1]", "[method][invariant]") {
    TinyModel tm;
    const PreparedRequest req = random_request(2, tm.w.config.n_vocab, 4, {11, 19, 7}, 6);
    const MethodResult full = run_method(*tm.m, req, method_config(Config::Method::full), kNoStop);
    for (auto metric : {Config::BlendMetric::v, Config::BlendMetric::k}) {
        Config cfg = method_config(Config::Method::cacheblend, 1.0);
        cfg.cacheblend.metric = metric;
        const MethodResult r = run_method(*tm.m, req, cfg, kNoStop);
        CAPTURE(to_string(metric));
        CHECK(rel_err(r.first_logits, full.first_logits) <= test::path_tolerance().logits);
    }
    Config epic = method_config(Config::Method::epic, 1.0);
    CHECK(rel_err(run_method(*tm.m, req, epic, kNoStop).first_logits, full.first_logits) <=
          test::path_tolerance().logits);
    epic.epic.mode = Config::EpicMode::fixed;
    epic.epic.k = 100;
    CHECK(rel_err(run_method(*tm.m, req, epic, kNoStop).first_logits, full.first_logits) <=
          test::path_tolerance().logits);
}

TEST_CASE("ratio 0 equals none [6.2]", "[method][invariant]") {
    TinyModel tm;
    const PreparedRequest req = random_request(3, tm.w.config.n_vocab, 4, {13, 8, 21}, 7);
    const MethodResult none = run_method(*tm.m, req, method_config(Config::Method::none), kNoStop);
    const MethodResult full = run_method(*tm.m, req, method_config(Config::Method::full), kNoStop);
    // The approximation must actually differ from full here, or this test proves nothing.
    REQUIRE(rel_err(none.first_logits, full.first_logits) > 1e-3);
    for (auto m : {Config::Method::infoflow, Config::Method::cacheblend, Config::Method::epic}) {
        for (bool reorder : {false, true}) {
            Config cfg = method_config(m, 0.0);
            cfg.method.reorder = reorder && m == Config::Method::infoflow;
            const MethodResult r = run_method(*tm.m, req, cfg, kNoStop);
            CAPTURE(to_string(m), reorder);
            CHECK(r.selected_positions.empty());
            CHECK(rel_err(r.first_logits, none.first_logits) <= 1e-6);
            CHECK(r.answer == none.answer);
        }
    }
}

TEST_CASE("one chunk without a sink equals full [6.5]", "[method][invariant]") {
    // The chunk is the whole context (empty chunk 0): prefilled alone at 0.. it is exact.
    TinyModel tm;
    const PreparedRequest solo = random_request(5, tm.w.config.n_vocab, 0, {30}, 6, -1);
    const MethodResult f2 = run_method(*tm.m, solo, method_config(Config::Method::full), kNoStop);
    const MethodResult n2 = run_method(*tm.m, solo, method_config(Config::Method::none), kNoStop);
    CHECK(rel_err(n2.first_logits, f2.first_logits) <= test::path_tolerance().logits);
    CHECK(n2.answer == f2.answer);
    // With a sink the chunk's states differ from the exact ones (the sink shifts them).
    PreparedRequest sunk = solo;
    sunk.sink_id = 1;
    const MethodResult s2 = run_method(*tm.m, sunk, method_config(Config::Method::none), kNoStop);
    CHECK(rel_err(s2.first_logits, f2.first_logits) > 1e-3);
}

TEST_CASE("re-rotation by delta equals rotation at the global position [6.5]",
          "[method][invariant]") {
    for (bool llama3 : {false, true}) {
        TinyModel tm("tiny", 2, llama3);
        const ModelConfig& c = tm.w.config;
        const PreparedRequest req = random_request(6, c.n_vocab, 5, {40, 33}, 4);
        std::vector<ChunkKv> chunks;
        for (int i = 0; i < req.n_chunks(); ++i) {
            chunks.push_back(prefill_chunk(*tm.m, req.chunks[i], i == 0 ? -1 : req.sink_id));
        }
        const std::vector<int> order{0, 2, 1};  // reordered, so deltas are not just offsets
        const std::vector<int32_t> gpos = global_positions(chunks, order);
        const int T = int(gpos.size());
        KvCache cache = tm.m->make_cache(T);
        assemble_cache(*tm.m, chunks, order, gpos, nullptr, cache);
        // Layer-0 K/V depend only on token and position: compute them directly at gpos.
        std::vector<int32_t> toks;
        for (int ci : order) toks.insert(toks.end(), req.chunks[ci].begin(), req.chunks[ci].end());
        const int row = cache.row();
        std::vector<float> h(size_t(T) * c.n_embd), k(size_t(T) * row), v(size_t(T) * row);
        tm.m->embed(toks.data(), T, h.data());
        tm.m->layer_kv(0, h.data(), T, gpos.data(), k.data(), v.data());
        std::vector<float> ck(cache.k(0), cache.k(0) + size_t(T) * row);
        std::vector<float> cv(cache.v(0), cache.v(0) + size_t(T) * row);
        CAPTURE(llama3);
        CHECK(rel_err(ck, k) <= 1e-5);
        CHECK(rel_err(cv, v) <= 1e-6);
        CHECK(cache.pos() == gpos);
    }
}

TEST_CASE("recompute uses the exact mask key_pos <= query_pos", "[method][invariant]") {
    TinyModel tm;
    const ModelConfig& c = tm.w.config;
    const PreparedRequest req = random_request(7, c.n_vocab, 3, {10, 10, 10}, 5);
    const MethodResult full = run_method(*tm.m, req, method_config(Config::Method::full), kNoStop);

    auto run = [&](bool wrong_mask) {
        std::vector<ChunkKv> chunks;
        for (int i = 0; i < req.n_chunks(); ++i) {
            chunks.push_back(prefill_chunk(*tm.m, req.chunks[i], i == 0 ? -1 : req.sink_id));
        }
        std::vector<int> order{0, 1, 2, 3};
        const std::vector<int32_t> gpos = global_positions(chunks, order);
        const int T = int(gpos.size());
        const int Q = int(req.suffix.size());
        KvCache cache = tm.m->make_cache(T + Q);
        assemble_cache(*tm.m, chunks, order, gpos, nullptr, cache);
        // Recompute every token of chunks 1..3; the cache holds every later key meanwhile.
        std::vector<int32_t> slots, toks, pos;
        const std::vector<int32_t> seq = req.context_sequence();
        for (int j = 3; j < T; ++j) {
            slots.push_back(j);
            toks.push_back(seq[j]);
            pos.push_back(gpos[j]);
        }
        if (wrong_mask) {
            // Negative control: every key position 0, so every key is visible to every query
            // (the keys keep their rotations; only the mask changes).
            for (int j = 0; j < T; ++j) cache.set_pos(j, 0);
        }
        recompute_selected(*tm.m, cache, slots, toks, pos, nullptr, 0);
        for (int j = 0; j < T; ++j) cache.set_pos(j, gpos[j]);
        std::vector<int32_t> spos(Q);
        for (int i = 0; i < Q; ++i) spos[i] = T + i;
        return tm.m->forward(cache, req.suffix, spos);
    };
    CHECK(rel_err(run(false), full.first_logits) <= test::path_tolerance().logits);
    CHECK(rel_err(run(true), full.first_logits) > 1e-2);
}
