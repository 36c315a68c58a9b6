// REFORM on P ranks (runtime/parallel/sp_reform.h) against its single-rank oracles, under
// mpiexec with 1-4 ranks on a tiny random model: with position- and context-free heads (layer-0
// V) P ranks gather exactly what one rank gathers (scores combined globally, the max-pool
// window crossing shard edges); with any heads P ranks equal the single-rank run with
// parallel.emulate_ranks = P (the shards' recurrent state restarts at each shard edge, the
// documented approximation); bytes of the gather phase match the formula. Collectives first,
// checks after.
#include <catch2/catch.hpp>

#include "comm/communicator.h"
#include "runtime/parallel/run.h"
#include "tests/method/method_fixture.h"
#include "tests/cpu_paths/cpu_paths.h"

using namespace infoflow;
using namespace infoflow::test;

namespace {
const std::vector<int32_t> kNoStop;

Config reform_sp_config() {
    Config c = method_config(Config::Method::reform);
    c.reform.chunk_size = 8;
    c.reform.budget = 24;
    c.reform.recent = 4;
    c.reform.pool = 5;
    c.reform.gather = 20;
    c.reform.keep_ends = 4;
    return c;
}
}  // namespace

TEST_CASE("sp: reform on P ranks gathers what one rank gathers", "[sp][reform]") {
    std::unique_ptr<Communicator> comm = make_communicator("mpi");
    TinyModel tm;
    tm.be->set_threads(1);
    const PreparedRequest req =
        random_request(21, tm.w.config.n_vocab, 4, {17, 9, 23, 12, 14, 8}, 9);
    const int P = comm->size(), rank = comm->rank();

    Config free_heads = reform_sp_config();
    free_heads.reform.heads = {{0, 0, 'v'}, {0, 1, 'v'}};
    const MethodResult one = run_method(*tm.m, req, free_heads, kNoStop);
    const MethodResult r = run_request(*tm.m, req, free_heads, *comm, kNoStop);

    Config any_heads = reform_sp_config();
    any_heads.reform.heads = {{1, 0, 'k'}, {2, 3, 'q'}, {1, 1, 'v'}};
    Config emul = any_heads;
    emul.parallel.emulate_ranks = P;
    const MethodResult oracle = run_method(*tm.m, req, emul, kNoStop);
    const MethodResult r2 = run_request(*tm.m, req, any_heads, *comm, kNoStop);

    CAPTURE(P, rank);
    REQUIRE(one.selected_positions.size() == 28);
    CHECK(r.selected_positions == one.selected_positions);
    CHECK(r.answer == one.answer);
    CHECK(r2.selected_positions == oracle.selected_positions);
    CHECK(r2.answer == oracle.answer);
    if (rank == 0) {
        CHECK(rel_err(r.first_logits, one.first_logits) <= test::path_tolerance().logits);
        CHECK(rel_err(r2.first_logits, oracle.first_logits) <= test::path_tolerance().logits);
    }
    // The gather phase: the question embeddings broadcast and the score slices all-gathered.
    if (P > 1) {
        const PhaseTime* g = nullptr;
        for (const auto& p : r.phases) {
            if (p.name == "gather") g = &p;
        }
        REQUIRE(g != nullptr);
        CHECK(g->bytes_recv > 0);
        const uint64_t T = uint64_t(req.context_tokens());
        // At least every other rank's scores arrived (4 bytes per token).
        CHECK(g->bytes_recv >= 4 * (T - T / uint64_t(P) - 1));
    }
}
