// Emulated ranks equal real ranks (label mpi; run by CTest under mpiexec -n 2 and 3): every MPI
// rank runs the request for real over MpiComm, then alone as P virtual ranks over ThreadComm
// (runtime/parallel/emulate.h), and compares its own real result with its virtual twin's: the
// answer, the selected positions, the first-token logits (bit for bit: same code, same backend,
// same thread count) and the bytes of every phase on every rank. InfoFlow with every exchange,
// CacheBlend with compact-int8, and ring attention (zigzag p2p; on the tiny model also
// contiguous and all-gather), on the tiny random model and on SmolLM2. Collectives first,
// checks after.
#include <catch2/catch.hpp>
#include <filesystem>

#include "comm/communicator.h"
#include "runtime/jobs/session.h"
#include "runtime/parallel/emulate.h"
#include "runtime/parallel/run.h"
#include "tests/method/method_fixture.h"

using namespace infoflow;
using namespace infoflow::test;

namespace {

const std::vector<int32_t> kNoStop;

struct Case {
    std::string name;
    Config cfg;
};

// InfoFlow with every exchange and CacheBlend with compact-int8; ring zigzag, and with `all`
// also contiguous and all-gather.
std::vector<Case> cases(bool all) {
    std::vector<Case> out;
    using E = Config::Exchange;
    for (auto ex : {E::kv, E::exact, E::kv_answer_exact, E::exact_answer_kv, E::gather,
                    E::compact_int8, E::compact_int4, E::compact_int4h}) {
        Config c = method_config(Config::Method::infoflow, 0.3);
        c.parallel.exchange = ex;
        out.push_back({std::string("infoflow/") + to_string(ex), c});
    }
    Config cb = method_config(Config::Method::cacheblend, 0.3);
    cb.parallel.exchange = E::compact_int8;
    out.push_back({"cacheblend/compact-int8", cb});
    for (auto layout : {Config::RingLayout::zigzag, Config::RingLayout::contiguous}) {
        Config c = method_config(Config::Method::ring);
        c.ring.layout = layout;
        out.push_back({std::string("ring/") + to_string(layout), c});
        if (!all) return out;
    }
    Config c = method_config(Config::Method::ring);
    c.ring.exchange = Config::RingExchange::allgather;
    out.push_back({"ring/allgather", c});
    return out;
}

void compare_all(Model& model, Communicator& comm, const PreparedRequest& req, bool all,
                 int max_new_tokens) {
    const int P = comm.size(), rank = comm.rank();
    for (Case k : cases(all)) {
        k.cfg.decode.max_new_tokens = max_new_tokens;
        const MethodResult real = run_request(model, req, k.cfg, comm, kNoStop);
        // The virtual ranks model the real ranks' link, so parallel.balance = "auto" weighs the
        // same costs and picks the same plan on both sides.
        const EmulatedRun emu = run_emulated(model, req, k.cfg, P, comm.link().model, kNoStop);
        CAPTURE(P, rank, k.name);
        REQUIRE(int(emu.per_rank.size()) == P);
        const MethodResult& twin = emu.per_rank[rank];
        CHECK(twin.answer == real.answer);
        CHECK(twin.selected_positions == real.selected_positions);
        CHECK(twin.first_logits == real.first_logits);  // bit for bit
        if (rank == 0) CHECK(!real.first_logits.empty());
        REQUIRE(twin.phases_per_rank.size() == real.phases_per_rank.size());
        for (size_t i = 0; i < real.phases_per_rank.size(); ++i) {
            for (int q = 0; q < P; ++q) {
                const PhaseTime& a = real.phases_per_rank[i][q];
                const PhaseTime& b = twin.phases_per_rank[i][q];
                CAPTURE(a.name, q);
                CHECK(b.name == a.name);
                CHECK(b.bytes_sent == a.bytes_sent);
                CHECK(b.bytes_recv == a.bytes_recv);
            }
        }
        // The modelled critical path is laid out phase by phase and sums to the TTFT.
        double sum = 0.0;
        for (const auto& p : emu.timing.critical_path) sum += p.second;
        CHECK(sum == Approx(emu.timing.ttft_ms));
        CHECK(emu.timing.ttft_ms > 0.0);
    }
}

}  // namespace

TEST_CASE("emulated ranks equal real ranks on the tiny model", "[emulate]") {
    auto comm = make_communicator("mpi");
    TinyModel tm;
    tm.be->set_threads(1);
    const PreparedRequest req =
        random_request(21, tm.w.config.n_vocab, 4, {17, 9, 23, 12, 14, 8}, 9);
    compare_all(*tm.m, *comm, req, true, 4);
}

TEST_CASE("emulated ranks equal real ranks on SmolLM2", "[emulate][model]") {
    auto comm = make_communicator("mpi");
    const std::string path = INFOFLOW_MODEL_PATH;
    REQUIRE(std::filesystem::exists(path));
    Config cfg;
    cfg.model.path = path;
    cfg.model.threads = 1;
    std::unique_ptr<Session> s = open_session(cfg);
    const PreparedRequest req =
        random_request(5, s->model->config().n_vocab, 12, {31, 26, 40, 22}, 13);
    compare_all(*s->model, *comm, req, false, 2);
}
