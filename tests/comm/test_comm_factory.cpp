// The factory's choice of communicator (comm_choice) for every kind, backend and combination of
// what is built (MPI, NCCL) and running (MPI initialized, launcher size), against the rules of
// make_communicator in comm/communicator.h, restated here case by case.
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>

#include "comm/communicator.h"

using namespace infoflow;

namespace {

CommWorld world(bool have_mpi, bool have_nccl, bool mpi_up, int launcher) {
    CommWorld w;
    w.have_mpi = have_mpi;
    w.have_nccl = have_nccl;
    w.mpi_up = mpi_up;
    w.launcher_size = launcher;
    w.mpi_size = mpi_up ? std::max(1, launcher) : 0;
    return w;
}

}  // namespace

TEST_CASE("comm_choice: self is always SelfComm", "[comm][factory]") {
    for (bool m : {false, true}) {
        for (bool n : {false, true}) {
            for (const char* backend : {"cpu", "cuda"}) {
                CAPTURE(m, n, backend);
                std::string host = "x";
                CHECK(comm_choice("self", backend, world(m, n, m, 4), &host) == "self");
                CHECK(host.empty());
            }
        }
    }
}

TEST_CASE("comm_choice: mpi needs MPI built and initialized", "[comm][factory]") {
    CHECK_THROWS_WITH(comm_choice("mpi", "cpu", world(false, true, false, 0)),
                      Catch::Contains("communicator 'mpi' is not built"));
    CHECK_THROWS_WITH(comm_choice("mpi", "cpu", world(true, false, false, 0)),
                      Catch::Contains("MPI is not initialized"));
    // Explicit mpi stays mpi even for the cuda backend with NCCL built.
    CHECK(comm_choice("mpi", "cuda", world(true, true, true, 2)) == "mpi");
    CHECK(comm_choice("mpi", "cpu", world(true, false, true, 0)) == "mpi");
}

TEST_CASE("comm_choice: nccl over MPI or over one rank", "[comm][factory]") {
    CHECK_THROWS_WITH(comm_choice("nccl", "cuda", world(true, false, true, 2)),
                      Catch::Contains("communicator 'nccl' is not built"));
    std::string host;
    CHECK(comm_choice("nccl", "cuda", world(true, true, true, 2), &host) == "nccl");
    CHECK(host == "mpi");
    // The backend does not matter for an explicit kind.
    CHECK(comm_choice("nccl", "cpu", world(true, true, true, 2), &host) == "nccl");
    CHECK(host == "mpi");
    // Built without MPI (the GPU machine's build): one rank over SelfComm.
    for (int launcher : {0, 1}) {
        CAPTURE(launcher);
        CHECK(comm_choice("nccl", "cuda", world(false, true, false, launcher), &host) == "nccl");
        CHECK(host == "self");
    }
    CHECK_THROWS_WITH(comm_choice("nccl", "cuda", world(false, true, false, 2)),
                      Catch::Contains("launcher with 2 ranks but MPI is not initialized (this "
                                      "binary was built without MPI)"));
    CHECK_THROWS_WITH(comm_choice("nccl", "cuda", world(true, true, false, 3)),
                      Catch::Contains("launcher with 3 ranks but MPI is not initialized (main "
                                      "must hold init_comm())"));
}

TEST_CASE("comm_choice: auto picks nccl for cuda when built, on more than one rank",
          "[comm][factory]") {
    std::string host;
    // cuda backend, NCCL built, several ranks.
    CHECK(comm_choice("auto", "cuda", world(true, true, true, 4), &host) == "nccl");
    CHECK(host == "mpi");
    CHECK(comm_choice("auto", "cuda", world(true, true, true, 2), &host) == "nccl");
    // One rank moves nothing between GPUs: NCCL is not brought up (no library, no bootstrap),
    // whether MPI runs (mpirun -np 1) or not.
    CHECK(comm_choice("auto", "cuda", world(true, true, false, 0), &host) == "self");
    CHECK(host.empty());
    CHECK(comm_choice("auto", "cuda", world(false, true, false, 0), &host) == "self");
    CHECK(comm_choice("auto", "cuda", world(false, true, false, 1), &host) == "self");
    CHECK(comm_choice("auto", "cuda", world(true, true, true, 1), &host) == "mpi");
    CHECK(host.empty());
    // Asked for by name, NCCL still runs on one rank.
    CHECK(comm_choice("nccl", "cuda", world(false, true, false, 0), &host) == "nccl");
    CHECK(host == "self");
    // cuda backend without NCCL: the host communicators.
    CHECK(comm_choice("auto", "cuda", world(true, false, true, 4), &host) == "mpi");
    CHECK(host.empty());
    CHECK(comm_choice("auto", "cuda", world(false, false, false, 0), &host) == "self");
    // cpu backend: never nccl.
    CHECK(comm_choice("auto", "cpu", world(true, true, true, 4), &host) == "mpi");
    CHECK(comm_choice("auto", "cpu", world(true, true, false, 0), &host) == "self");
    CHECK(comm_choice("auto", "cpu", world(false, true, false, 1), &host) == "self");
    CHECK(host.empty());
    // Several ranks announced but no MPI: refused whatever the backend.
    for (const char* backend : {"cpu", "cuda"}) {
        CAPTURE(backend);
        CHECK_THROWS_WITH(comm_choice("auto", backend, world(false, true, false, 2)),
                          Catch::Contains("launcher with 2 ranks"));
        CHECK_THROWS_WITH(comm_choice("auto", backend, world(true, false, false, 2)),
                          Catch::Contains("launcher with 2 ranks"));
    }
}

TEST_CASE("comm_choice: unknown kinds", "[comm][factory]") {
    CHECK_THROWS_WITH(comm_choice("gloo", "cpu", world(true, true, true, 1)),
                      Catch::Contains("unknown communicator kind 'gloo'"));
    CHECK_THROWS_WITH(comm_choice("", "cuda", world(true, true, true, 1)),
                      Catch::Contains("unknown communicator kind ''"));
}
