// The distributed pipelines on the strict device-like backend (guarded_backend.h) over real MPI
// ranks: sequence-parallel "kv" and "exact" for every method, and the ring in both exchanges.
// The MPI communicator reads host memory only, so every message that leaves backend memory must
// be staged through the host (runtime/parallel/comm_stage.h); a direct host access aborts with
// the faulting address. Results must equal the same run on the plain CPU backend: selected
// positions and answers identical, first-token logits within 1e-5 on rank 0 (1e-3 with a bf16
// cache, see check_same), and the same bytes moved per phase (staging does not change what is
// sent).
#include <catch2/catch.hpp>
#include <memory>
#include <vector>

#include "../../method/method_fixture.h"
#include "../guarded_backend.h"
#include "comm/communicator.h"
#include "runtime/parallel/run.h"

using namespace infoflow;
using namespace infoflow::test;

namespace {

const std::vector<int32_t> kNoStop;

// tol: 1e-5 for f32 caches; a 16-bit cache rounds each K/V element, and a last-bit difference of
// the fp32 projections (the device path computes Q, K and V in separate GEMMs) can round one to
// its neighbouring 16-bit value, so there the logits are held to 1e-3.
void check_same(const Communicator& comm, const MethodResult& dev, const MethodResult& cpu,
                double tol = 1e-5) {
    CHECK(dev.selected_positions == cpu.selected_positions);
    CHECK(dev.answer == cpu.answer);
    if (comm.rank() == 0) {
        REQUIRE(dev.first_logits.size() == cpu.first_logits.size());
        CHECK(rel_err(dev.first_logits, cpu.first_logits) <= tol);
    }
    REQUIRE(dev.phases.size() == cpu.phases.size());
    for (size_t i = 0; i < dev.phases.size(); ++i) {
        CAPTURE(dev.phases[i].name);
        CHECK(dev.phases[i].name == cpu.phases[i].name);
        CHECK(dev.phases[i].bytes_sent == cpu.phases[i].bytes_sent);
        CHECK(dev.phases[i].bytes_recv == cpu.phases[i].bytes_recv);
    }
}

}  // namespace

TEST_CASE("device-like backend over MPI: sequence parallel and ring equal the CPU backend",
          "[devicelike]") {
    install_guard_handler();
    std::unique_ptr<Communicator> comm = make_communicator("mpi");
    TinyModel tm;
    tm.be->set_threads(1);
    GuardedBackend g(1);
    Model dev(g, tm.w);
    // 87 context + 9 suffix tokens: 96, divisible by 2P for P = 1..4.
    const PreparedRequest req =
        random_request(21, tm.w.config.n_vocab, 4, {17, 9, 23, 12, 14, 8}, 9);
    for (Config::Method m : {Config::Method::none, Config::Method::infoflow,
                             Config::Method::cacheblend, Config::Method::epic}) {
        for (auto ex : {Config::Exchange::kv, Config::Exchange::exact}) {
            Config cfg = method_config(m);
            cfg.parallel.exchange = ex;
            CAPTURE(comm->size(), comm->rank(), to_string(m), to_string(ex));
            const MethodResult rd = run_request(dev, req, cfg, *comm, kNoStop);
            const MethodResult rc = run_request(*tm.m, req, cfg, *comm, kNoStop);
            check_same(*comm, rd, rc);
        }
    }
    for (auto ex : {Config::RingExchange::p2p, Config::RingExchange::allgather}) {
        Config cfg = method_config(Config::Method::ring);
        cfg.ring.exchange = ex;
        CAPTURE(comm->size(), comm->rank(), to_string(ex));
        const MethodResult rd = run_request(dev, req, cfg, *comm, kNoStop);
        const MethodResult rc = run_request(*tm.m, req, cfg, *comm, kNoStop);
        check_same(*comm, rd, rc);
    }
    // A bf16 cache: the selected K/V (InfoFlow) and the ring's blocks move as 16-bit rows,
    // staged through the host, the same bytes as on the CPU backend.
    dev.set_kv_dtype(KvDtype::bf16);
    tm.m->set_kv_dtype(KvDtype::bf16);
    for (Config::Method m : {Config::Method::infoflow, Config::Method::ring}) {
        const Config cfg = method_config(m);
        CAPTURE(comm->size(), comm->rank(), "bf16", to_string(m));
        const MethodResult rd = run_request(dev, req, cfg, *comm, kNoStop);
        const MethodResult rc = run_request(*tm.m, req, cfg, *comm, kNoStop);
        check_same(*comm, rd, rc, 1e-3);
    }
    tm.m->set_kv_dtype(KvDtype::f32);
}
