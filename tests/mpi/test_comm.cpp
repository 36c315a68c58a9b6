// MpiComm on 1-4 ranks (label mpi; run by CTest under mpiexec -n 2/3/4, and alone as a 1-rank
// singleton): every op against the obvious expected values, the byte accounting of
// comm/communicator.h checked exactly against its formulas per phase, and the start-up config
// check. Deadlock rule (docs/formats.md §11.3): every rank runs every collective of a case whatever the
// outcome of earlier checks; only CHECK is used after communication, never REQUIRE.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi_env.h"
#include "runtime/core/error.h"

using namespace infoflow;

namespace {

std::unique_ptr<Communicator> world() { return make_communicator("mpi"); }

uint8_t pattern(int rank, size_t i) { return static_cast<uint8_t>(rank * 37 + i * 11 + 1); }

// True on every rank iff `ok` held on every rank.
bool all_ranks(Communicator& c, bool ok) {
    int32_t v = ok ? 1 : 0;
    c.all_reduce(&v, 1, DType::i32, ReduceOp::min);
    return v == 1;
}

// The all_reduce formula of communicator.h, restated: B + (P-2)*c_r, 0 for P = 1.
uint64_t all_reduce_bytes(uint64_t n, uint64_t e, int p, int r) {
    if (p == 1) return 0;
    const uint64_t c_r = e * (n / p + (static_cast<uint64_t>(r) < n % p ? 1 : 0));
    return n * e + (p - 2) * c_r;
}

void check_stats(const CommStats& s, uint64_t sent, uint64_t recv, uint64_t calls) {
    CHECK(s.bytes_sent == sent);
    CHECK(s.bytes_recv == recv);
    CHECK(s.calls == calls);
    CHECK(s.wait_ms >= 0.0);
}

}  // namespace

TEST_CASE("mpi: ranks, sizes and node-local ranks", "[mpi]") {
    auto c = world();
    const int p = c->size(), r = c->rank();
    INFO("rank " << r << " of " << p);
    CHECK(std::string(c->kind()) == "mpi");
    CHECK(c->memory_space() == MemorySpace::host);
    CHECK(comm_have_mpi());
    CHECK(p == MpiEnv::world_size());
    CHECK(r == MpiEnv::world_rank());
    std::vector<int32_t> ranks(p, -1);
    const int32_t mine = r;
    c->all_gather(&mine, sizeof mine, ranks.data());
    for (int q = 0; q < p; ++q) CHECK(ranks[q] == q);
    CHECK(c->local_rank() >= 0);
    CHECK(c->local_rank() < c->local_size());
    if (const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) {
        CHECK(c->local_rank() == std::atoi(lr));
    }
    // Every test here runs on one machine.
    CHECK(c->local_size() == p);
    CHECK(c->local_rank() == r);
    // "auto" picks MPI once MPI is initialized.
    auto a = make_communicator("auto");
    CHECK(std::string(a->kind()) == "mpi");
    CHECK(a->size() == p);
}

TEST_CASE("mpi: broadcast from every root", "[mpi]") {
    auto c = world();
    const int p = c->size(), r = c->rank();
    const size_t b = 13;
    PhaseScope phase(*c, "bcast");
    bool ok = true;
    for (int root = 0; root < p; ++root) {
        std::vector<uint8_t> buf(b, 0);
        if (r == root) {
            for (size_t i = 0; i < b; ++i) buf[i] = pattern(root, i);
        }
        c->broadcast(buf.data(), b, root);
        for (size_t i = 0; i < b; ++i) ok = ok && buf[i] == pattern(root, i);
    }
    c->broadcast(nullptr, 0, p - 1);
    CHECK(ok);
    // Root once (B*(P-1) sent), non-root P-1 times (B received each).
    check_stats(c->stats("bcast"), b * (p - 1), b * (p - 1), p + 1);
}

TEST_CASE("mpi: all_reduce of every dtype and op", "[mpi]") {
    auto c = world();
    const int p = c->size(), r = c->rank();
    const size_t n = 7;
    const double tri = p * (p + 1) / 2.0;
    for (DType t : {DType::f32, DType::f64, DType::i32, DType::i64}) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
            INFO("dtype " << dtype_name(t) << " op " << reduce_op_name(op) << " rank " << r
                          << " of " << p);
            // v_r[i] = (r+1)(i+1)·sign_i·scale; i64 values beyond 32 bits.
            const double scale = t == DType::i64 ? static_cast<double>(1ll << 36) : 1.0;
            auto value = [&](int rank, size_t i) {
                return (rank + 1) * (i + 1.0) * (i % 2 ? -1.0 : 1.0) * scale;
            };
            auto expected = [&](size_t i) {
                const double s = (i % 2 ? -1.0 : 1.0) * scale * (i + 1.0);
                if (op == ReduceOp::sum) return s * tri;
                const bool hi = (op == ReduceOp::max) == (s > 0);
                return s * (hi ? p : 1);
            };
            std::vector<char> buf(n * dtype_size(t));
            for (size_t i = 0; i < n; ++i) {
                const double v = value(r, i);
                switch (t) {
                    case DType::f32:
                        reinterpret_cast<float*>(buf.data())[i] = v;
                        break;
                    case DType::f64:
                        reinterpret_cast<double*>(buf.data())[i] = v;
                        break;
                    case DType::i32:
                        reinterpret_cast<int32_t*>(buf.data())[i] = v;
                        break;
                    case DType::i64:
                        reinterpret_cast<int64_t*>(buf.data())[i] = v;
                        break;
                }
            }
            const std::string ph = std::string("ar_") + dtype_name(t) + reduce_op_name(op);
            c->set_phase(ph);
            c->all_reduce(buf.data(), n, t, op);
            c->set_phase("other");
            for (size_t i = 0; i < n; ++i) {
                double got = 0;
                switch (t) {
                    case DType::f32:
                        got = reinterpret_cast<float*>(buf.data())[i];
                        break;
                    case DType::f64:
                        got = reinterpret_cast<double*>(buf.data())[i];
                        break;
                    case DType::i32:
                        got = reinterpret_cast<int32_t*>(buf.data())[i];
                        break;
                    case DType::i64:
                        got = static_cast<double>(reinterpret_cast<int64_t*>(buf.data())[i]);
                        break;
                }
                CHECK(got == expected(i));
            }
            const uint64_t bytes = all_reduce_bytes(n, dtype_size(t), p, r);
            check_stats(c->stats(ph), bytes, bytes, 1);
        }
    }
    // Literal values of the formula: n = 7 f32 (B = 28) on P = 1..4, and n = 8 f32 (B = 32),
    // where P = 2 and 4 divide n and the count is the ring volume 2B(P-1)/P.
    const uint64_t lit7[5][4] = {{0}, {0}, {28, 28}, {40, 36, 36}, {44, 44, 44, 36}};
    if (p <= 4) CHECK(all_reduce_bytes(7, 4, p, r) == lit7[p][r]);
    if (p == 2 || p == 4) CHECK(all_reduce_bytes(8, 4, p, r) == 2 * 32 * (p - 1) / uint64_t(p));
    std::vector<float> f(8, 1.0f);
    c->set_phase("ar_8");
    c->all_reduce(f.data(), f.size(), DType::f32, ReduceOp::sum);
    for (float x : f) CHECK(x == static_cast<float>(p));
    c->all_reduce(nullptr, 0, DType::f64, ReduceOp::max);  // empty: a valid no-op collective
    const uint64_t b8 = all_reduce_bytes(8, 4, p, r);
    check_stats(c->stats("ar_8"), b8, b8, 2);
}

TEST_CASE("mpi: all_gather, also in place", "[mpi]") {
    auto c = world();
    const int p = c->size(), r = c->rank();
    const size_t b = 5;
    std::vector<uint8_t> send(b), recv(b * p, 0);
    for (size_t i = 0; i < b; ++i) send[i] = pattern(r, i);
    c->set_phase("ag");
    c->all_gather(send.data(), b, recv.data());
    std::vector<uint8_t> inplace(b * p, 0);
    std::memcpy(inplace.data() + b * r, send.data(), b);
    c->all_gather(inplace.data() + b * r, b, inplace.data());
    for (int q = 0; q < p; ++q) {
        for (size_t i = 0; i < b; ++i) {
            CHECK(recv[q * b + i] == pattern(q, i));
            CHECK(inplace[q * b + i] == pattern(q, i));
        }
    }
    check_stats(c->stats("ag"), 2 * b * (p - 1), 2 * b * (p - 1), 2);
}

TEST_CASE("mpi: all_gather_v with uneven sizes including zero", "[mpi]") {
    auto c = world();
    const int p = c->size(), r = c->rank();
    auto sz = [](int q) { return static_cast<size_t>((q * 3) % 5); };  // 0, 3, 1, 4
    std::vector<size_t> recv_bytes(p);
    size_t total = 0;
    for (int q = 0; q < p; ++q) total += recv_bytes[q] = sz(q);
    std::vector<uint8_t> send;
    for (size_t i = 0; i < sz(r); ++i) send.push_back(pattern(r, i));
    std::vector<uint8_t> recv(total + 1, 0xee);  // one guard byte
    c->set_phase("agv");
    c->all_gather_v(send.data(), send.size(), recv.data(), recv_bytes);
    size_t off = 0;
    uint64_t others = 0;
    for (int q = 0; q < p; ++q) {
        for (size_t i = 0; i < sz(q); ++i) CHECK(recv[off + i] == pattern(q, i));
        off += sz(q);
        if (q != r) others += sz(q);
    }
    CHECK(recv[total] == 0xee);
    check_stats(c->stats("agv"), sz(r) * (p - 1), others, 1);
}

TEST_CASE("mpi: all_to_all_v with uneven sizes including zeros", "[mpi]") {
    auto c = world();
    const int p = c->size(), r = c->rank();
    // Bytes from rank a to rank b; zero for several pairs (and the diagonal of rank 1).
    auto n = [](int a, int b) { return static_cast<size_t>((a + 2 * b + 1) % 4); };
    auto byte = [](int a, int b, size_t i) { return static_cast<uint8_t>(a * 16 + b * 4 + i + 1); };
    std::vector<size_t> send_bytes(p), recv_bytes(p);
    std::vector<uint8_t> send, recv;
    uint64_t sent = 0, got = 0;
    for (int q = 0; q < p; ++q) {
        send_bytes[q] = n(r, q);
        recv_bytes[q] = n(q, r);
        for (size_t i = 0; i < n(r, q); ++i) send.push_back(byte(r, q, i));
        if (q != r) {
            sent += n(r, q);
            got += n(q, r);
        }
    }
    size_t total = 0;
    for (size_t x : recv_bytes) total += x;
    recv.assign(total, 0);
    c->set_phase("a2a");
    c->all_to_all_v(send.data(), send_bytes, recv.data(), recv_bytes);
    size_t off = 0;
    for (int q = 0; q < p; ++q) {
        for (size_t i = 0; i < n(q, r); ++i) CHECK(recv[off + i] == byte(q, r, i));
        off += n(q, r);
    }
    check_stats(c->stats("a2a"), sent, got, 1);
}

TEST_CASE("mpi: isend/irecv ring exchange with double buffers", "[mpi]") {
    auto c = world();
    const int p = c->size(), r = c->rank();
    const int right = (r + 1) % p, left = (r + p - 1) % p;
    // Block of origin o: 16·(o+1) floats, value o·1000 + i. Each step passes the current block
    // right and receives the next from the left, as ring attention does with K/V blocks.
    auto len = [](int o) { return static_cast<size_t>(16 * (o + 1)); };
    std::vector<float> cur(len(r)), next;
    for (size_t i = 0; i < cur.size(); ++i) cur[i] = r * 1000.0f + i;
    c->set_phase("ring");
    uint64_t sent = 0, recvd = 0;
    bool ok = true;
    std::vector<int> seen;
    for (int step = 0; step < p - 1; ++step) {
        const int origin_cur = (r - step + p) % p, origin_next = (r - step - 1 + p) % p;
        next.assign(len(origin_next), -1.0f);
        Request rr = c->irecv(next.data(), next.size() * sizeof(float), left, step);
        Request sr = c->isend(cur.data(), cur.size() * sizeof(float), right, step);
        sent += cur.size() * sizeof(float);
        recvd += next.size() * sizeof(float);
        while (!rr.test()) {  // "compute" on the current block while the exchange runs
        }
        CHECK(rr.done());
        sr.wait();
        CHECK(sr.done());
        for (size_t i = 0; i < next.size(); ++i) ok = ok && next[i] == origin_next * 1000.0f + i;
        seen.push_back(origin_next);
        (void)origin_cur;
        std::swap(cur, next);
    }
    CHECK(ok);
    CHECK(static_cast<int>(seen.size()) == p - 1);
    check_stats(c->stats("ring"), sent, recvd, 2 * (p - 1));
    // Messages to self are delivered and never counted.
    c->set_phase("self");
    int64_t out = 42 + r, in = 0;
    Request a = c->irecv(&in, sizeof in, r, 7);
    Request b = c->isend(&out, sizeof out, r, 7);
    std::vector<Request> both;
    both.push_back(std::move(a));
    both.push_back(std::move(b));
    wait_all(both);
    CHECK(in == 42 + r);
    check_stats(c->stats("self"), 0, 0, 2);
}

TEST_CASE("mpi: sendrecv ring shift", "[mpi]") {
    auto c = world();
    const int p = c->size(), r = c->rank();
    const int right = (r + 1) % p, left = (r + p - 1) % p;
    std::vector<int64_t> out(3 + r, 100 * r), in(3 + left, -1);
    c->set_phase("shift");
    c->sendrecv(out.data(), out.size() * 8, right, in.data(), in.size() * 8, left, 3);
    for (int64_t v : in) CHECK(v == 100 * left);
    const uint64_t s = p == 1 ? 0 : out.size() * 8, g = p == 1 ? 0 : in.size() * 8;
    check_stats(c->stats("shift"), s, g, 1);
}

TEST_CASE("mpi: per-phase accounting, PhaseScope, totals and reset", "[mpi]") {
    auto c = world();
    const int p = c->size(), r = c->rank();
    CHECK(c->phase() == "other");
    c->barrier();
    {
        PhaseScope s1(*c, "scoring");
        std::vector<double> v(10, 1.0);
        c->all_reduce(v.data(), v.size(), DType::f64, ReduceOp::sum);
        {
            PhaseScope s2(*c, "recompute");
            std::vector<uint8_t> g(4 * p);
            uint32_t x = r;
            c->all_gather(&x, 4, g.data());
            c->all_gather(&x, 4, g.data());
        }
        CHECK(c->phase() == "scoring");
        c->barrier();
    }
    CHECK(c->phase() == "other");
    const std::vector<PhaseStats> st = c->stats();
    const uint64_t ar = all_reduce_bytes(10, 8, p, r);
    REQUIRE(st.size() == 3);  // local data only: no collective follows in this case
    CHECK(st[0].phase == "other");
    CHECK(st[1].phase == "scoring");
    CHECK(st[2].phase == "recompute");
    check_stats(st[0].stats, 0, 0, 1);
    check_stats(st[1].stats, ar, ar, 2);
    check_stats(st[2].stats, 8 * (p - 1), 8 * (p - 1), 2);
    const CommStats t = c->total_stats();
    check_stats(t, ar + 8 * (p - 1), ar + 8 * (p - 1), 5);
    CHECK(t.wait_ms == Approx(st[0].stats.wait_ms + st[1].stats.wait_ms + st[2].stats.wait_ms));
    check_stats(c->stats("never_used"), 0, 0, 0);
    CHECK(c->stats("never_used").wait_ms == 0.0);
    c->reset_stats();
    CHECK(c->stats().empty());
    CHECK_THROWS_AS(c->set_phase(""), Error);
    CHECK_THROWS_AS(c->set_phase("a\nb"), Error);
}

TEST_CASE("mpi: gather_stats collects every rank's phases", "[mpi]") {
    auto c = world();
    const int p = c->size(), r = c->rank();
    const int right = (r + 1) % p, left = (r + p - 1) % p;
    // Rank-dependent traffic: rank q sends 10·(q+1) bytes right.
    {
        PhaseScope s(*c, "ring");
        std::vector<char> out(10 * (r + 1)), in(10 * (left + 1));
        Request rr = c->irecv(in.data(), in.size(), left);
        Request sr = c->isend(out.data(), out.size(), right);
        rr.wait();
        sr.wait();
    }
    if (r == p - 1) {  // a phase only the last rank uses
        PhaseScope s(*c, "last_only");
        c->sendrecv(nullptr, 0, r, nullptr, 0, r);
    }
    const std::vector<PhaseStats> mine = c->stats();
    const std::vector<PhaseStatsAllRanks> all = gather_stats(*c);
    REQUIRE(all.size() == 2);  // every rank gathered the same table
    CHECK(all[0].phase == "ring");
    CHECK(all[1].phase == "last_only");
    for (int q = 0; q < p; ++q) {
        INFO("rank " << q);
        const uint64_t s = p == 1 ? 0 : 10 * (q + 1), g = p == 1 ? 0 : 10 * ((q + p - 1) % p + 1);
        check_stats(all[0].per_rank[q], s, g, 2);
        check_stats(all[1].per_rank[q], 0, 0, q == p - 1 ? 1 : 0);
    }
    CHECK(all[0].per_rank[r].wait_ms == mine[0].stats.wait_ms);
    // The gather's own traffic went to "comm_stats".
    CHECK(c->stats("comm_stats").calls == 2);
    CHECK(c->phase() == "other");
}

TEST_CASE("mpi: check_same_config names the rank that differs, on every rank", "[mpi]") {
    auto c = world();
    const int p = c->size(), r = c->rank();
    CHECK_NOTHROW(check_same_config(*c, "0123456789abcdef"));
    const std::string long_a(100, 'a');
    CHECK_NOTHROW(check_same_config(*c, long_a));

    std::string msg;
    bool threw = false;
    try {
        check_same_config(*c, r == 1 ? "feedfacefeedface" : "0123456789abcdef");
    } catch (const Error& e) {
        threw = true;
        msg = e.what();
    }
    // A difference past the 64-byte slot is still found (long hashes compare by their hash).
    std::string long_b = long_a;
    if (r == 1) long_b.back() = 'b';
    bool threw_long = false;
    try {
        check_same_config(*c, long_b);
    } catch (const Error&) {
        threw_long = true;
    }
    const bool expect = p > 1;
    INFO("rank " << r << " of " << p << ": " << msg);
    CHECK(threw == expect);
    CHECK(threw_long == expect);
    if (expect) {
        CHECK(msg.find("rank 1 differs from rank 0") != std::string::npos);
        CHECK(msg.find("'feedfacefeedface'") != std::string::npos);
        CHECK(msg.find("'0123456789abcdef'") != std::string::npos);
    }
    CHECK(all_ranks(*c, threw == expect));
}

TEST_CASE("mpi: a receive of the wrong size is an error naming both sizes", "[mpi]") {
    auto c = world();
    const int p = c->size(), r = c->rank();
    if (p < 2) return;
    std::string shorter, longer;
    std::vector<char> buf(16, 1);
    if (r == 0) {
        c->isend(buf.data(), 8, 1, 5).wait();
        c->isend(buf.data(), 16, 1, 6).wait();
    } else if (r == 1) {
        try {
            c->irecv(buf.data(), 16, 0, 5).wait();
        } catch (const Error& e) {
            shorter = e.what();
        }
        try {
            c->irecv(buf.data(), 8, 0, 6).wait();
        } catch (const Error& e) {
            longer = e.what();
        }
    }
    c->barrier();
    if (r == 1) {
        INFO(shorter << " | " << longer);
        CHECK(shorter.find("posted 16 bytes but the message has 8") != std::string::npos);
        CHECK(longer.find("irecv from rank 0 (tag 6, 8 bytes) failed") != std::string::npos);
    }
}

TEST_CASE("mpi: bad arguments throw on every rank before any message", "[mpi]") {
    auto c = world();
    const int p = c->size(), r = c->rank();
    char x = 0;
    std::vector<char> big(64 * p);
    CHECK_THROWS_WITH(c->broadcast(&x, 1, p), Catch::Contains("broadcast root rank"));
    CHECK_THROWS_WITH(c->broadcast(&x, 1, -1), Catch::Contains("out of range"));
    CHECK_THROWS_WITH(c->all_gather_v(&x, 1, big.data(), std::vector<size_t>(p + 1, 1)),
                      Catch::Contains("entries for"));
    std::vector<size_t> sizes(p, 1);
    sizes[r] = 2;
    CHECK_THROWS_WITH(c->all_gather_v(&x, 1, big.data(), sizes), Catch::Contains("recv_bytes["));
    std::vector<size_t> zeros(p, 0), diag(p, 0);
    diag[r] = 1;
    CHECK_THROWS_WITH(c->all_to_all_v(big.data(), diag, big.data() + 32, zeros),
                      Catch::Contains("sends itself"));
    int stream_dummy = 0;
    CHECK_THROWS_WITH(c->barrier(&stream_dummy), Catch::Contains("no stream"));
    CHECK_THROWS_WITH(c->isend(&x, 1, p), Catch::Contains("isend destination"));
    CHECK_THROWS_WITH(c->irecv(&x, 1, 0, -1), Catch::Contains("negative tag"));
    CHECK(c->total_stats().calls == 0);
    CHECK(all_ranks(*c, true));
}

TEST_CASE("mpi: Request is a move-only handle", "[mpi]") {
    auto c = world();
    const int r = c->rank();
    Request empty;
    CHECK(empty.done());
    CHECK(empty.test());
    empty.wait();
    int v = r, w = -1;
    Request rr = c->irecv(&w, sizeof w, r, 11);
    Request moved(std::move(rr));
    CHECK(rr.done());  // a moved-from Request is empty
    Request sr = c->isend(&v, sizeof v, r, 11);
    Request assigned;
    assigned = std::move(sr);
    assigned.wait();
    moved.wait();
    CHECK(w == r);
    CHECK(moved.done());
}
