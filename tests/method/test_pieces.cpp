// A request's context work in pieces (runtime/core/pieces.h, job serve's interleaving) against
// the same request in one go: on the real SmolLM2 file (stored weights, whose products are
// row-independent), `full`, `infoflow` and `cacheblend` with forwards cut into pieces of 100, 32
// and 64 rows (the recompute's layers cut into pieces of rows too) and, between the pieces, decode
// steps of two other requests on the same Model (what job serve's rank 0 does) give bit-identical
// first-token logits, the same selection and the same answer. With fp32 weights (not held to row
// independence) the scope leaves forwards whole and the bits hold too. Also the cut itself:
// piece_ranges never leaves a piece under kMinPieceRows.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <thread>
#include <tuple>

#include "runtime/core/fs.h"
#include "runtime/core/pieces.h"
#include "runtime/jobs/serve_request.h"
#include "runtime/method/chunk_kv.h"
#include "runtime/method/phases.h"
#include "runtime/model/batch_decode.h"
#include "tests/method/method_fixture.h"

using namespace infoflow;
using namespace infoflow::test;

namespace {

// Two other requests decoding between the pieces, as job serve's batch does.
struct Bystanders {
    explicit Bystanders(Model& m) : model(m) {
        for (int i = 0; i < 2; ++i) {
            caches.push_back(std::make_unique<KvCache>(m.make_cache(2000)));
            std::vector<int32_t> toks(size_t(20 + 7 * i)), pos(toks.size());
            for (size_t t = 0; t < toks.size(); ++t) toks[t] = int32_t(100 + 13 * t + i);
            std::iota(pos.begin(), pos.end(), 0);
            m.forward(*caches.back(), toks, pos);
        }
    }
    void step() {
        std::vector<DecodeRow> rows;
        for (auto& c : caches) rows.push_back({c.get(), 42, int32_t(c->size()), -1});
        decode_batch(model, rows);
        ++steps;
    }
    Model& model;
    std::vector<std::unique_ptr<KvCache>> caches;
    int steps = 0;
};

void check_same(const MethodResult& a, const MethodResult& b) {
    REQUIRE(a.first_logits.size() == b.first_logits.size());
    CHECK(std::memcmp(a.first_logits.data(), b.first_logits.data(),
                      a.first_logits.size() * sizeof(float)) == 0);
    CHECK(a.selected_positions == b.selected_positions);
    CHECK(a.answer == b.answer);
}

}  // namespace

TEST_CASE("pieces: cut rows never leave a piece under kMinPieceRows", "[pieces]") {
    CHECK(piece_ranges(1000).size() == 1);  // no scope: one piece
    const PieceScope scope(100, true, [] {});
    const auto r = piece_ranges(230);
    REQUIRE(r.size() == 2);  // 100 + 130: a 30-row tail joins the piece before it
    CHECK(r[0] == std::make_pair(0, 100));
    CHECK(r[1] == std::make_pair(100, 230));
    CHECK(piece_ranges(20).size() == 1);
    CHECK(piece_ranges(300).size() == 3);
    const PieceScope whole(64, false, [] {});  // rows not split: one piece
    CHECK(piece_ranges(1000).size() == 1);
    CHECK_THROWS_WITH(PieceScope(8, true, [] {}), Catch::Contains("at least 32"));
}

TEST_CASE("pieces: a time slice runs the callback before the tokens are done", "[pieces]") {
    int calls = 0;
    {
        const PieceScope tokens_only(1000, true, [&] { ++calls; });
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        piece_done(1.0);
        CHECK(calls == 0);  // 1 token of 1000, no time bound
    }
    {
        const PieceScope sliced(
            1000, true, [&] { ++calls; }, std::chrono::milliseconds(2));
        piece_done(1.0);
        CHECK(calls == 0);  // neither bound reached yet (the slice starts with the scope)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        piece_done(1.0);
        CHECK(calls == 1);  // the slice passed
        piece_done(1.0);
        CHECK(calls == 1);  // it starts over after the callback
        piece_done(1000.0);
        CHECK(calls == 2);  // the tokens still bound it
    }
    CHECK_THROWS_WITH(PieceScope(
                          64, true, [] {}, std::chrono::milliseconds(-1)),
                      Catch::Contains("negative"));
}

TEST_CASE("pieces: a paused scope cuts nothing and calls nothing", "[pieces]") {
    int calls = 0;
    PieceScope scope(
        64, true, [&] { ++calls; }, std::chrono::nanoseconds(1));
    CHECK(piece_rows() == 64);
    scope.pause(true);
    CHECK(piece_rows() > 1000000);  // forwards whole
    CHECK(piece_ranges(300).size() == 1);
    piece_done(1000.0);
    CHECK(calls == 0);
    scope.pause(false);
    CHECK(piece_rows() == 64);
    piece_done(1.0);
    CHECK(calls == 1);  // the slice (1 ns) passed
}

TEST_CASE("pieces: a request in pieces with decode steps between them gives the same bits",
          "[pieces][real]") {
    REQUIRE(file_exists(INFOFLOW_MODEL_PATH));
    LoadOptions o;
    o.native_weights = true;
    const ModelWeights w = load_model_weights(INFOFLOW_MODEL_PATH, o);
    auto be = make_cpu_backend(2);
    Model m(*be, w);
    m.set_kv_dtype(KvDtype::f16);
    REQUIRE(products_row_independent(m));
    const PreparedRequest req = random_request(3, m.config().n_vocab, 20, {120, 60, 200}, 24);
    for (const auto& [method, piece] :
         {std::pair{Config::Method::full, 100}, std::pair{Config::Method::infoflow, 32},
          std::pair{Config::Method::cacheblend, 64}}) {
        Config cfg;
        cfg.method.name = method;
        cfg.method.ratio = 0.2;
        cfg.decode.max_new_tokens = 6;
        const MethodResult whole = run_method(m, req, cfg, {});
        int token_steps = 0;
        {
            INFO(to_string(method) << ", pieces of " << piece << " rows");
            Bystanders others(m);
            MethodResult cut;
            {
                const PieceScope scope(piece, true, [&] { others.step(); });
                cut = run_method(m, req, cfg, {});
            }
            check_same(whole, cut);
            CHECK(others.steps >= 380 / piece);  // the work was interleaved
            token_steps = others.steps;
        }
        {
            // A time slice of 1 ns: a decode step at every point the work reports, the context
            // assembly's between chunks included.
            INFO(to_string(method) << ", pieces of " << piece << " rows, a step at every point");
            Bystanders others(m);
            MethodResult cut;
            {
                const PieceScope scope(
                    piece, true, [&] { others.step(); }, std::chrono::nanoseconds(1));
                cut = run_method(m, req, cfg, {});
            }
            check_same(whole, cut);
            // `full` reports a piece of rows through every layer; the others each layer too.
            if (method == Config::Method::full) {
                CHECK(others.steps >= token_steps);
            } else {
                CHECK(others.steps >= token_steps + m.config().n_layer);
            }
        }
    }
}

TEST_CASE("pieces: the context assembly is a point between chunks for the time slice",
          "[pieces]") {
    TinyModel tm;
    const PreparedRequest req = random_request(9, tm.w.config.n_vocab, 6, {40, 30, 50}, 8);
    const std::vector<ChunkKv> chunks = prefill_chunks(*tm.m, req.chunks, req.sink_id);
    std::vector<int32_t> gpos;
    for (const ChunkKv& c : chunks) {
        for (int t = 0; t < c.size(); ++t) gpos.push_back(int32_t(gpos.size()));
    }
    const std::vector<int> order = {0, 1, 2, 3};
    KvCache whole = tm.m->make_cache(int(gpos.size()));
    assemble_cache(*tm.m, chunks, order, gpos, nullptr, whole);
    int calls = 0;
    KvCache cut = tm.m->make_cache(int(gpos.size()));
    {
        // No tokens of work reported: only the time slice (1 ns: every point) runs the callback.
        const PieceScope scope(
            1000000, true, [&] { ++calls; }, std::chrono::nanoseconds(1));
        assemble_cache(*tm.m, chunks, order, gpos, nullptr, cut);
    }
    CHECK(calls == 4);  // after each chunk
    std::vector<float> a(size_t(gpos.size()) * whole.row()), b(a.size());
    for (int l = 0; l < tm.w.config.n_layer; ++l) {
        whole.read_range(l, 0, int(gpos.size()), a.data(), nullptr);
        cut.read_range(l, 0, int(gpos.size()), b.data(), nullptr);
        CHECK(a == b);
    }
    int none = 0;
    {
        const PieceScope tokens_only(1000000, true, [&] { ++none; });
        KvCache again = tm.m->make_cache(int(gpos.size()));
        assemble_cache(*tm.m, chunks, order, gpos, nullptr, again);
    }
    CHECK(none == 0);  // without a time slice the copy reports no work
}

TEST_CASE("pieces: fp32 weights keep forwards whole, the bits hold", "[pieces]") {
    TinyModel tm;
    REQUIRE_FALSE(products_row_independent(*tm.m));
    const PreparedRequest req = random_request(5, tm.w.config.n_vocab, 6, {70, 90}, 8);
    Config cfg;
    cfg.method.name = Config::Method::infoflow;
    cfg.method.ratio = 0.3;
    cfg.decode.max_new_tokens = 4;
    const MethodResult whole = run_method(*tm.m, req, cfg, {});
    int steps = 0;
    MethodResult cut;
    {
        const PieceScope scope(32, products_row_independent(*tm.m), [&] { ++steps; });
        CHECK(piece_rows() > 1000000);
        cut = run_method(*tm.m, req, cfg, {});
    }
    check_same(whole, cut);
    CHECK(steps >= 2);
}

TEST_CASE("take_cache: the prompt decoded by the caller gives run_method's answer", "[pieces]") {
    TinyModel tm;
    const PreparedRequest req = random_request(8, tm.w.config.n_vocab, 6, {40, 30, 50}, 8);
    using X = Config::Exchange;
    for (const auto& [method, emulate, exchange] :
         {std::tuple{Config::Method::full, 1, X::kv},
          std::tuple{Config::Method::infoflow, 1, X::kv},
          std::tuple{Config::Method::infoflow, 2, X::kv},
          std::tuple{Config::Method::infoflow, 2, X::compact_int4},
          std::tuple{Config::Method::epic, 1, X::kv}}) {
        INFO(to_string(method) << " on " << emulate << " emulated rank(s), exchange "
                               << to_string(exchange));
        Config cfg;
        cfg.method.name = method;
        cfg.method.ratio = 0.3;
        cfg.parallel.emulate_ranks = emulate;
        cfg.parallel.exchange = exchange;
        cfg.decode.max_new_tokens = 7;
        const MethodResult whole = run_method(*tm.m, req, cfg, {});
        RunHooks hooks;
        std::unique_ptr<KvCache> taken;
        int32_t group = -5;
        hooks.take_cache = [&](KvCache&& c, int32_t g, MethodResult&) {
            taken = std::make_unique<KvCache>(std::move(c));
            group = g;
        };
        const MethodResult r = run_method(*tm.m, req, cfg, {}, hooks);
        REQUIRE(taken);
        CHECK(r.answer.empty());  // the caller decodes
        CHECK(group == (emulate > 1 && exchange == X::kv ? 0 : -1));  // kv: rank 0's keys
        CHECK(taken->size() == r.context_tokens + r.suffix_tokens);
        // Job serve's KV budget counts at least what the cache holds.
        PlannedRequest plan;
        plan.cfg = cfg;
        plan.prepared = req;
        CHECK(kv_cache_bytes(*taken) <= kv_need_bytes(plan, *tm.m, 1));
        GenerateOptions gen = generate_options(cfg, {});
        gen.group = group;
        Generator g(*tm.m, r.first_logits, r.context_tokens + r.suffix_tokens, gen);
        while (g.sample()) {
            g.set_logits(decode_batch(*tm.m, {{taken.get(), g.token(), g.pos(), group}}).data());
        }
        CHECK(g.result().tokens == whole.answer);
        CHECK(r.selected_positions == whole.selected_positions);
    }
}
