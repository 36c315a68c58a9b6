// SelfComm (one rank, no MPI) and the communicator factory (label cpu; built with or without
// MPI): collectives are copies, every byte count is zero while calls and wait time are counted,
// messages to self match in posting order by tag, and waiting on an unmatched one is an error.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "runtime/core/error.h"

using namespace infoflow;

TEST_CASE("self: identity and collectives as copies", "[comm]") {
    auto c = make_self_communicator();
    CHECK(std::string(c->kind()) == "self");
    CHECK(c->rank() == 0);
    CHECK(c->size() == 1);
    CHECK(c->local_rank() == 0);
    CHECK(c->local_size() == 1);
    CHECK(c->memory_space() == MemorySpace::host);

    c->barrier();
    std::vector<float> v = {1.0f, -2.0f, 3.5f};
    c->all_reduce(v.data(), v.size(), DType::f32, ReduceOp::sum);
    CHECK(v == std::vector<float>{1.0f, -2.0f, 3.5f});
    int64_t big = int64_t(1) << 40;
    c->all_reduce(&big, 1, DType::i64, ReduceOp::max);
    CHECK(big == int64_t(1) << 40);
    c->broadcast(v.data(), v.size() * 4, 0);
    CHECK(v[2] == 3.5f);

    const char send[4] = {'a', 'b', 'c', 'd'};
    char recv[4] = {};
    c->all_gather(send, 4, recv);
    CHECK(std::string(recv, 4) == "abcd");
    char inplace[3] = {'x', 'y', 'z'};
    c->all_gather(inplace, 3, inplace);
    CHECK(std::string(inplace, 3) == "xyz");
    char recv_v[3] = {};
    c->all_gather_v(send, 3, recv_v, {3});
    CHECK(std::string(recv_v, 3) == "abc");
    char recv_a[2] = {};
    c->all_to_all_v(send, {2}, recv_a, {2});
    CHECK(std::string(recv_a, 2) == "ab");
    c->all_to_all_v(nullptr, {0}, nullptr, {0});

    const CommStats t = c->total_stats();
    CHECK(t.bytes_sent == 0);
    CHECK(t.bytes_recv == 0);
    CHECK(t.calls == 9);
    CHECK(t.wait_ms >= 0.0);
    REQUIRE(c->stats().size() == 1);
    CHECK(c->stats()[0].phase == "other");
}

TEST_CASE("self: messages to self match by tag in posting order", "[comm]") {
    auto c = make_self_communicator();
    PhaseScope phase(*c, "p2p");
    int a = 1, b = 2, x = 0, y = 0;
    // Receive first, then send.
    Request r1 = c->irecv(&x, sizeof x, 0, 3);
    CHECK_FALSE(r1.test());
    Request s1 = c->isend(&a, sizeof a, 0, 3);
    CHECK(r1.test());
    s1.wait();
    CHECK(x == 1);
    // Two sends with different tags, received in the other order.
    Request s2 = c->isend(&a, sizeof a, 0, 1);
    Request s3 = c->isend(&b, sizeof b, 0, 2);
    c->irecv(&y, sizeof y, 0, 2).wait();
    CHECK(y == 2);
    c->irecv(&x, sizeof x, 0, 1).wait();
    CHECK(x == 1);
    s2.wait();
    s3.wait();
    // sendrecv to self.
    double out = 2.5, in = 0;
    c->sendrecv(&out, sizeof out, 0, &in, sizeof in, 0, 9);
    CHECK(in == 2.5);
    const CommStats st = c->stats("p2p");
    CHECK(st.bytes_sent == 0);
    CHECK(st.bytes_recv == 0);
    CHECK(st.calls == 7);
}

TEST_CASE("self: an unmatched wait or a size mismatch is an error, not a hang", "[comm]") {
    auto c = make_self_communicator();
    int x = 0;
    Request r = c->irecv(&x, sizeof x, 0, 4);
    CHECK_THROWS_WITH(r.wait(), Catch::Contains("no matching send"));
    CHECK(r.done());
    int64_t v = 7;
    Request pending = c->irecv(&x, sizeof x, 0, 5);
    CHECK_THROWS_WITH(c->isend(&v, sizeof v, 0, 5), Catch::Contains("does not match"));
    CHECK_THROWS_WITH(c->sendrecv(&v, 8, 0, &x, 4, 0, 6), Catch::Contains("does not match"));
    // An abandoned receive no longer matches later sends.
    { Request dropped = c->irecv(&x, sizeof x, 0, 8); }
    Request s = c->isend(&x, sizeof x, 0, 8);
    CHECK_FALSE(s.test());
    CHECK_THROWS_WITH(s.wait(), Catch::Contains("no matching receive"));
    (void)pending;
}

TEST_CASE("self: phases, gather_stats and the config check", "[comm]") {
    auto c = make_self_communicator();
    {
        PhaseScope a(*c, "scoring");
        c->barrier();
        c->barrier();
    }
    CHECK(c->phase() == "other");
    const auto all = gather_stats(*c);
    REQUIRE(all.size() == 1);
    CHECK(all[0].phase == "scoring");
    REQUIRE(all[0].per_rank.size() == 1);
    CHECK(all[0].per_rank[0].calls == 2);
    CHECK(c->stats("comm_stats").calls == 2);
    CHECK_NOTHROW(check_same_config(*c, "0123456789abcdef"));
    CHECK_NOTHROW(check_same_config(*c, std::string(200, 'q')));
    c->reset_stats();
    CHECK(c->stats().empty());
    CHECK_THROWS_WITH(c->broadcast(nullptr, 0, 1), Catch::Contains("out of range"));
    int s = 0;
    CHECK_THROWS_WITH(c->barrier(&s), Catch::Contains("no stream"));
}

TEST_CASE("factory: kinds and errors", "[comm]") {
    CHECK(std::string(make_communicator("self")->kind()) == "self");
    if (!comm_have_nccl()) {  // a build with NCCL: tests/comm_nccl
        CHECK_THROWS_WITH(make_communicator("nccl"), Catch::Contains("not built"));
        CHECK_THROWS_WITH(init_comm(nullptr, nullptr, "nccl"), Catch::Contains("not built"));
    }
    CHECK_THROWS_WITH(make_communicator("gloo"),
                      Catch::Contains("unknown communicator kind 'gloo'"));
    if (!comm_have_mpi()) {
        CHECK_THROWS_WITH(make_communicator("mpi"), Catch::Contains("not built"));
    }
    if (launcher_world_size() == 0) {
        // Not started by mpirun/srun: "auto" is the one-rank communicator and needs no MPI.
        auto env = init_comm(nullptr, nullptr, "auto");
        CHECK(std::string(make_communicator("auto")->kind()) == "self");
    }
    CHECK(dtype_size(DType::f32) == 4);
    CHECK(dtype_size(DType::f64) == 8);
    CHECK(dtype_size(DType::i32) == 4);
    CHECK(dtype_size(DType::i64) == 8);
}
