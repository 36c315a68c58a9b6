// The emulated-ranks machinery (label cpu): the alpha-beta costs and the virtual timeline against
// hand-computed cases, and ThreadComm's ops, byte accounting (the formulas of
// comm/communicator.h, as for MpiComm), turn-taking, timing and faults on 1-4 virtual ranks.
// Catch2 assertions are not thread-safe: rank bodies record what they saw, the checks run after
// ThreadWorld::run has joined the threads.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_model.h"
#include "comm/thread_comm.h"
#include "runtime/core/error.h"

using namespace infoflow;

namespace {

uint8_t pattern(int rank, size_t i) { return static_cast<uint8_t>(rank * 37 + i * 11 + 1); }

// The all_reduce formula of communicator.h, restated: B + (P-2)*c_r, 0 for P = 1.
uint64_t all_reduce_bytes(uint64_t n, uint64_t e, int p, int r) {
    if (p == 1) return 0;
    const uint64_t c_r = e * (n / p + (static_cast<uint64_t>(r) < n % p ? 1 : 0));
    return n * e + (p - 2) * c_r;
}

// 10 us and 100 GB/s: one step of 1e6 bytes is 0.01 + 0.01 ms.
LinkModel test_link() {
    LinkModel l;
    l.alpha_us = 10.0;
    l.beta_gbs = 100.0;
    return l;
}

}  // namespace

TEST_CASE("link model: alpha-beta costs of every collective, hand-computed", "[comm_model]") {
    const LinkModel l = test_link();
    CHECK(l.step_ms(0) == Approx(0.01));
    CHECK(l.message_ms(1000000) == Approx(0.02));
    // (P-1) steps of the largest block.
    CHECK(l.all_gather_ms({1000000, 1000000, 1000000}) == Approx(0.04));
    CHECK(l.all_gather_ms({1000000, 0, 2000000}) == Approx(2 * (0.01 + 0.02)));
    CHECK(l.all_gather_ms({5000000}) == 0.0);
    // 3e5 floats over 3 ranks: chunks of 4e5 bytes, 2(P-1) = 4 steps.
    CHECK(l.all_reduce_ms(3, 300000, 4) == Approx(4 * (0.01 + 0.004)));
    // 10 doubles over 3 ranks: the largest chunk is ceil(10/3) = 4 elements = 32 bytes.
    CHECK(l.all_reduce_ms(3, 10, 8) == Approx(4 * (0.01 + 32 / 1e8)));
    CHECK(l.all_reduce_ms(1, 1000, 8) == 0.0);
    CHECK(l.broadcast_ms(4, 1000000) == Approx(3 * 0.01 + 0.01));
    CHECK(l.broadcast_ms(1, 1000000) == 0.0);
    CHECK(l.barrier_ms(1) == 0.0);
    CHECK(l.barrier_ms(2) == Approx(0.01));
    CHECK(l.barrier_ms(3) == Approx(0.02));
    CHECK(l.barrier_ms(4) == Approx(0.02));
    CHECK(l.barrier_ms(5) == Approx(0.03));
    // Round 1: 0->1 1e6, 1->2 0, 2->0 0; round 2: 0->2 2e6, 1->0 3e6, 2->1 4e6.
    CHECK(l.all_to_all_ms({{0, 1000000, 2000000}, {3000000, 0, 0}, {0, 4000000, 0}}) ==
          Approx((0.01 + 0.01) + (0.01 + 0.04)));
    CHECK(l.all_to_all_ms({{7}}) == 0.0);
    const LinkModel d;  // the documented NVLink defaults
    CHECK(d.alpha_us == 10.0);
    CHECK(d.beta_gbs == 370.0);
    CHECK(d.message_ms(370000000) == Approx(1.0 + 0.01));  // 370 MB in 1 ms + alpha
}

TEST_CASE("timeline: 3 ranks, two phases, BSP critical path by hand", "[comm_model]") {
    VirtualTimeline t(3);
    for (int r = 0; r < 3; ++r) t.set_phase(r, "a");
    t.compute(0, 1.0);
    t.compute(1, 3.0);
    t.compute(2, 2.0);
    CHECK(t.collective(0.5) == Approx(3.5));
    for (int r = 0; r < 3; ++r) t.set_phase(r, "b");
    t.compute(0, 4.0);
    t.compute(1, 1.0);
    t.compute(2, 1.0);
    t.compute(2, 0.5);  // two segments on rank 2
    CHECK(t.collective(0.25) == Approx(3.5 + 4.0 + 0.25));
    for (int r = 0; r < 3; ++r) CHECK(t.now(r) == Approx(7.75));

    // max segment + collective, summed over the collectives.
    const auto cp = t.critical_path({"a", "b"});
    REQUIRE(cp.size() == 2);
    CHECK(cp[0].first == "a");
    CHECK(cp[0].second == Approx(3.0 + 0.5));
    CHECK(cp[1].second == Approx(4.0 + 0.25));

    const auto p0 = t.phases(0);
    REQUIRE(p0.size() == 3);  // other, a, b
    CHECK(p0[1].phase == "a");
    CHECK(p0[1].compute_ms == Approx(1.0));
    CHECK(p0[1].comm_ms == Approx(0.5));
    CHECK(p0[1].wait_ms == Approx(2.0));  // waited for rank 1
    CHECK(p0[1].enter_ms == 0.0);
    CHECK(p0[1].exit_ms == Approx(3.5));
    const auto p2 = t.phases(2);
    CHECK(p2[2].compute_ms == Approx(1.5));
    CHECK(p2[2].segments == 2);
    CHECK(p2[2].wait_ms == Approx(2.5));
    CHECK(p2[2].collectives == 1);
    for (int r = 0; r < 3; ++r) {
        for (const PhaseTiming& p : t.phases(r)) {
            CHECK(p.compute_ms + p.comm_ms + p.wait_ms == Approx(p.exit_ms - p.enter_ms));
        }
    }
}

TEST_CASE("timeline: messages overlap compute, one link carries one message at a time",
          "[comm_model]") {
    VirtualTimeline t(2);
    // Both ranks post a message of cost 2 to the other at t = 0, then compute 3 and 1.
    const double a01 = t.post_message(0, 1, 2.0);
    const double a10 = t.post_message(1, 0, 2.0);
    CHECK(a01 == Approx(2.0));
    CHECK(a10 == Approx(2.0));
    t.compute(0, 3.0);
    t.compute(1, 1.0);
    t.complete(0, a10);  // arrived during rank 0's compute: hidden
    t.complete(1, a01);  // rank 1 waits 1 ms
    CHECK(t.now(0) == Approx(3.0));
    CHECK(t.now(1) == Approx(2.0));
    CHECK(t.phases(1)[0].wait_ms == Approx(1.0));
    CHECK(t.phases(0)[0].wait_ms == 0.0);
    // Two more messages 0 -> 1 posted at 3: the second starts when the first has arrived.
    CHECK(t.post_message(0, 1, 1.0) == Approx(4.0));
    CHECK(t.post_message(0, 1, 1.0) == Approx(5.0));
    // The other direction is a separate link (free since 2), starting at rank 1's clock.
    CHECK(t.post_message(1, 0, 1.0) == Approx(3.0));
    // A message to oneself arrives at once.
    CHECK(t.post_message(1, 1, 7.0) == Approx(2.0));
    CHECK(t.phases(0)[0].messages == 3);
}

TEST_CASE("thread comm: every op on 1-4 virtual ranks, byte accounting by the formulas",
          "[thread_comm]") {
    for (int p = 1; p <= 4; ++p) {
        CAPTURE(p);
        struct Seen {
            bool kind = false, bcast = false, reduce = false, gather = false, gather_in = false,
                 gather_v = false, a2a = false, ring = false, shift = false;
            std::vector<PhaseStats> stats;
        };
        std::vector<Seen> seen(p);
        ThreadWorld w(p, LinkModel{});
        w.run([&](Communicator& c) {
            const int r = c.rank();
            Seen& s = seen[r];
            s.kind = std::string(c.kind()) == "thread" && c.size() == p &&
                     c.memory_space() == MemorySpace::host && c.local_rank() == r &&
                     c.local_size() == p;
            {
                PhaseScope ph(c, "bcast");
                s.bcast = true;
                for (int root = 0; root < p; ++root) {
                    std::vector<uint8_t> buf(13);
                    for (size_t i = 0; i < buf.size(); ++i) buf[i] = pattern(r, i);
                    c.broadcast(buf.data(), buf.size(), root);
                    for (size_t i = 0; i < buf.size(); ++i) s.bcast &= buf[i] == pattern(root, i);
                }
            }
            {
                PhaseScope ph(c, "reduce");
                std::vector<double> d(7);
                std::vector<int64_t> mx(5), mn(5);
                std::vector<float> f(9);
                std::vector<int32_t> i32(3);
                for (size_t i = 0; i < d.size(); ++i) d[i] = r + 0.5 * i;
                for (size_t i = 0; i < mx.size(); ++i) mx[i] = mn[i] = r * 10 - int64_t(i);
                for (size_t i = 0; i < f.size(); ++i) f[i] = float(r == 1 ? i : 0);
                for (size_t i = 0; i < i32.size(); ++i) i32[i] = r + 1;
                c.all_reduce(d.data(), d.size(), DType::f64, ReduceOp::sum);
                c.all_reduce(mx.data(), mx.size(), DType::i64, ReduceOp::max);
                c.all_reduce(mn.data(), mn.size(), DType::i64, ReduceOp::min);
                c.all_reduce(f.data(), f.size(), DType::f32, ReduceOp::sum);
                c.all_reduce(i32.data(), i32.size(), DType::i32, ReduceOp::sum);
                s.reduce = true;
                const double rank_sum = p * (p - 1) / 2.0;
                for (size_t i = 0; i < d.size(); ++i) s.reduce &= d[i] == rank_sum + p * 0.5 * i;
                for (size_t i = 0; i < mx.size(); ++i) {
                    s.reduce &= mx[i] == (p - 1) * 10 - int64_t(i);
                    s.reduce &= mn[i] == -int64_t(i);
                }
                for (size_t i = 0; i < f.size(); ++i) s.reduce &= f[i] == (p > 1 ? float(i) : 0);
                for (size_t i = 0; i < i32.size(); ++i) s.reduce &= i32[i] == p * (p + 1) / 2;
            }
            {
                PhaseScope ph(c, "gather");
                const size_t b = 6;
                std::vector<uint8_t> mine(b), all(b * p), inplace(b * p, 0);
                for (size_t i = 0; i < b; ++i) mine[i] = inplace[r * b + i] = pattern(r, i);
                c.all_gather(mine.data(), b, all.data());
                c.all_gather(inplace.data() + r * b, b, inplace.data());
                s.gather = s.gather_in = true;
                for (int q = 0; q < p; ++q) {
                    for (size_t i = 0; i < b; ++i) {
                        s.gather &= all[q * b + i] == pattern(q, i);
                        s.gather_in &= inplace[q * b + i] == pattern(q, i);
                    }
                }
            }
            {
                PhaseScope ph(c, "gather_v");
                std::vector<size_t> sizes(p);
                for (int q = 0; q < p; ++q) sizes[q] = q == 1 ? 0 : 3 + 2 * q;
                std::vector<uint8_t> mine(sizes[r]);
                for (size_t i = 0; i < mine.size(); ++i) mine[i] = pattern(r, i);
                size_t total = 0;
                for (size_t x : sizes) total += x;
                std::vector<uint8_t> all(total);
                c.all_gather_v(mine.data(), mine.size(), all.data(), sizes);
                s.gather_v = true;
                size_t off = 0;
                for (int q = 0; q < p; ++q) {
                    for (size_t i = 0; i < sizes[q]; ++i)
                        s.gather_v &= all[off + i] == pattern(q, i);
                    off += sizes[q];
                }
            }
            {
                PhaseScope ph(c, "a2a");
                // Rank q sends (q + 2*r) % 4 bytes to rank r, with value q*16 + r.
                std::vector<size_t> sb(p), rb(p);
                for (int q = 0; q < p; ++q) {
                    sb[q] = size_t((r + 2 * q) % 4);
                    rb[q] = size_t((q + 2 * r) % 4);
                }
                std::vector<uint8_t> send, recv;
                for (int q = 0; q < p; ++q) {
                    for (size_t i = 0; i < sb[q]; ++i) send.push_back(uint8_t(r * 16 + q));
                }
                size_t total = 0;
                for (size_t x : rb) total += x;
                recv.assign(total, 0xff);
                c.all_to_all_v(send.data(), sb, recv.data(), rb);
                s.a2a = true;
                size_t off = 0;
                for (int q = 0; q < p; ++q) {
                    for (size_t i = 0; i < rb[q]; ++i)
                        s.a2a &= recv[off + i] == uint8_t(q * 16 + r);
                    off += rb[q];
                }
            }
            {
                PhaseScope ph(c, "ring");
                // P steps of a double-buffered ring: each rank ends with every rank's block once.
                std::vector<int32_t> buf[2] = {std::vector<int32_t>(5, r), std::vector<int32_t>(5)};
                int cur = 0;
                s.ring = true;
                for (int step = 0; step < p; ++step) {
                    const int owner = (r - step + p) % p;
                    s.ring &= buf[cur][0] == owner && buf[cur][4] == owner;
                    if (step + 1 == p) break;
                    Request rq = c.irecv(buf[1 - cur].data(), 20, (r - 1 + p) % p, step);
                    Request sq = c.isend(buf[cur].data(), 20, (r + 1) % p, step);
                    sq.wait();
                    rq.wait();
                    cur = 1 - cur;
                }
            }
            {
                PhaseScope ph(c, "shift");
                int64_t out = 100 + r, in = -1;
                c.sendrecv(&out, 8, (r + 1) % p, &in, 8, (r - 1 + p) % p, 9);
                s.shift = in == 100 + (r - 1 + p) % p;
            }
            s.stats = c.stats();
        });
        for (int r = 0; r < p; ++r) {
            CAPTURE(r);
            const Seen& s = seen[r];
            CHECK(s.kind);
            CHECK(s.bcast);
            CHECK(s.reduce);
            CHECK(s.gather);
            CHECK(s.gather_in);
            CHECK(s.gather_v);
            CHECK(s.a2a);
            CHECK(s.ring);
            CHECK(s.shift);
            auto get = [&](const std::string& name) {
                for (const PhaseStats& ps : s.stats) {
                    if (ps.phase == name) return ps.stats;
                }
                return CommStats{};
            };
            const uint64_t P1 = uint64_t(p - 1);
            // broadcast from every root: root once (13*(P-1) sent), P-1 times received.
            CHECK(get("bcast").bytes_sent == 13 * P1);
            CHECK(get("bcast").bytes_recv == 13 * P1);
            CHECK(get("bcast").calls == uint64_t(p));
            const uint64_t red = all_reduce_bytes(7, 8, p, r) + 2 * all_reduce_bytes(5, 8, p, r) +
                                 all_reduce_bytes(9, 4, p, r) + all_reduce_bytes(3, 4, p, r);
            CHECK(get("reduce").bytes_sent == red);
            CHECK(get("reduce").bytes_recv == red);
            CHECK(get("gather").bytes_sent == 2 * 6 * P1);
            CHECK(get("gather").bytes_recv == 2 * 6 * P1);
            uint64_t gv_recv = 0, own = r == 1 ? 0 : 3 + 2 * r;
            for (int q = 0; q < p; ++q) {
                if (q != r) gv_recv += q == 1 ? 0 : 3 + 2 * q;
            }
            CHECK(get("gather_v").bytes_sent == own * P1);
            CHECK(get("gather_v").bytes_recv == gv_recv);
            uint64_t a_sent = 0, a_recv = 0;
            for (int q = 0; q < p; ++q) {
                if (q == r) continue;
                a_sent += (r + 2 * q) % 4;
                a_recv += (q + 2 * r) % 4;
            }
            CHECK(get("a2a").bytes_sent == a_sent);
            CHECK(get("a2a").bytes_recv == a_recv);
            // isend/irecv to a neighbour that is oneself (P = 1) count nothing.
            const uint64_t ring = p > 1 ? 20 * P1 : 0;
            CHECK(get("ring").bytes_sent == ring);
            CHECK(get("ring").bytes_recv == ring);
            CHECK(get("ring").calls == 2 * P1);
            CHECK(get("shift").bytes_sent == (p > 1 ? 8u : 0u));
            CHECK(get("shift").calls == 1);
        }
    }
}

TEST_CASE("thread comm: gather_stats and check_same_config run over virtual ranks",
          "[thread_comm]") {
    const int p = 3;
    std::vector<std::vector<PhaseStatsAllRanks>> all(p);
    std::vector<std::string> config_error(p);
    ThreadWorld w(p, LinkModel{});
    w.run([&](Communicator& c) {
        {
            PhaseScope ph(c, "work");
            std::vector<uint8_t> b(10 * (c.rank() + 1)), r(10 * 6);
            std::vector<size_t> sizes{10, 20, 30};
            c.all_gather_v(b.data(), b.size(), r.data(), sizes);
        }
        all[c.rank()] = gather_stats(c);
        check_same_config(c, "same");
        try {
            check_same_config(c, c.rank() == 2 ? "other" : "same");
        } catch (const Error& e) {
            config_error[c.rank()] = e.what();
        }
    });
    for (int r = 0; r < p; ++r) {
        CAPTURE(r);
        REQUIRE(!all[r].empty());
        CHECK(all[r][0].phase == "work");
        for (int q = 0; q < p; ++q) {
            CHECK(all[r][0].per_rank[q].bytes_sent == uint64_t(10 * (q + 1) * 2));
            CHECK(all[r][0].per_rank[q].bytes_recv == uint64_t(60 - 10 * (q + 1)));
        }
        CHECK(config_error[r].find("rank 2") != std::string::npos);
    }
}

TEST_CASE("thread comm: one rank computes at a time, segments and collectives on the timeline",
          "[thread_comm]") {
    using namespace std::chrono;
    const int p = 3;
    const LinkModel link = test_link();
    std::atomic<int> active{0}, most{0};
    ThreadWorld w(p, link);
    const auto t0 = steady_clock::now();
    w.run([&](Communicator& c) {
        auto busy = [&](int ms) {
            const int now = ++active;
            int m = most.load();
            while (now > m && !most.compare_exchange_weak(m, now)) {
            }
            std::this_thread::sleep_for(milliseconds(ms));
            --active;
        };
        c.set_phase("a");
        busy(10 + 20 * c.rank());  // 10, 30, 50 ms
        std::vector<uint8_t> blk(1000000), all(3000000);
        c.all_gather(blk.data(), blk.size(), all.data());
        c.set_phase("b");
        busy(c.rank() == 0 ? 40 : 5);
        c.barrier();
        c.set_phase("other");
    });
    const double wall = duration<double, std::milli>(steady_clock::now() - t0).count();
    CHECK(most.load() == 1);                   // turn-taking: never two ranks at once
    CHECK(wall >= 10 + 30 + 50 + 40 + 5 + 5);  // the segments ran one after another
    const VirtualTimeline& t = w.timeline();
    const auto cp = t.critical_path({"a", "b"});
    // Phase a ends for every rank at the slowest rank's clock + the all-gather of 1e6-byte
    // blocks (2 steps); phase b at that + the slowest segment of b + the barrier.
    double end_a = 0.0, end_b = 0.0, min_wait = 1e30;
    for (int r = 0; r < p; ++r) {
        const auto ph = t.phases(r);
        REQUIRE(ph.size() == 3);
        CHECK(ph[1].phase == "a");
        CHECK(ph[1].comm_ms == Approx(2 * 0.02));
        CHECK(ph[1].collectives == 1);
        end_a = std::max(end_a, ph[1].enter_ms + ph[1].compute_ms);
        end_b = std::max(end_b, ph[2].enter_ms + ph[2].compute_ms);
        min_wait = std::min(min_wait, ph[1].wait_ms);
        for (int i = 1; i < 3; ++i) {
            CHECK(ph[i].enter_ms + ph[i].compute_ms + ph[i].comm_ms + ph[i].wait_ms ==
                  Approx(ph[i].exit_ms));
        }
    }
    CHECK(min_wait == 0.0);  // the slowest rank waits for nobody
    // (up to the few microseconds between the collective and the next phase change)
    CHECK(cp[0].second == Approx(end_a + 2 * 0.02).margin(1.0));
    CHECK(cp[0].second >= 50 + 2 * 0.02);  // rank 2 slept 50 ms
    CHECK(cp[0].second + cp[1].second == Approx(end_b + link.barrier_ms(3)).margin(1.0));
    CHECK(cp[1].second >= 40 + link.barrier_ms(3));  // rank 0 slept 40 ms
    CHECK(t.phases(0)[1].compute_ms >= 10);
}

TEST_CASE("thread comm: test() on a message in flight leaves the clock, compute overlaps it",
          "[thread_comm]") {
    // 1e6 bytes at 0.01 GB/s: the message takes 100 ms of virtual time. Rank 0 posts it before a
    // barrier; after the barrier both ranks test() (the ring's early start) and rank 1 computes
    // 30 ms before it waits: in virtual time the test finds the message still in flight, moves
    // no clock, and the 30 ms run under the transfer (rank 1 leaves at ~100 ms, not 130).
    using namespace std::chrono;
    LinkModel link;
    link.alpha_us = 1.0;
    link.beta_gbs = 0.01;
    ThreadWorld w(2, link);
    bool tested[2] = {true, true};
    std::vector<uint8_t> msg(1000000, 7), got(msg.size());
    w.run([&](Communicator& c) {
        c.set_phase("p2p");
        Request r;
        if (c.rank() == 0) r = c.isend(msg.data(), msg.size(), 1, 3);
        c.barrier();
        if (c.rank() == 1) r = c.irecv(got.data(), got.size(), 0, 3);
        tested[c.rank()] = r.test();
        if (c.rank() == 1) std::this_thread::sleep_for(milliseconds(30));
        r.wait();
        c.set_phase("other");
    });
    CHECK_FALSE(tested[0]);
    CHECK_FALSE(tested[1]);
    CHECK(got == msg);
    const VirtualTimeline& t = w.timeline();
    for (int r = 0; r < 2; ++r) {
        const auto ph = t.phases(r);
        REQUIRE(ph.size() >= 2);
        CAPTURE(r, ph[1].compute_ms, ph[1].wait_ms);
        CHECK(ph[1].phase == "p2p");
        CHECK(ph[1].exit_ms == Approx(100.0).margin(10.0));
    }
    CHECK(t.phases(1)[1].compute_ms >= 30.0);
    CHECK(t.phases(1)[1].wait_ms < 75.0);  // ~70 ms: the transfer less the compute under it
}

TEST_CASE("thread comm: a failing rank ends the run with its own error, nobody hangs",
          "[thread_comm]") {
    ThreadWorld w(3, LinkModel{});
    try {
        w.run([&](Communicator& c) {
            if (c.rank() == 1) IF_FAIL("boom on rank one");
            std::vector<int32_t> v(4, c.rank());
            c.all_reduce(v.data(), v.size(), DType::i32, ReduceOp::sum);
            c.barrier();
        });
        FAIL("no error");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find("boom on rank one") != std::string::npos);
    }
}

TEST_CASE("thread comm: mismatched collectives are an error naming every rank's call",
          "[thread_comm]") {
    ThreadWorld w(2, LinkModel{});
    try {
        w.run([&](Communicator& c) {
            std::vector<int32_t> v(4 + c.rank(), 1);
            c.all_reduce(v.data(), v.size(), DType::i32, ReduceOp::sum);
        });
        FAIL("no error");
    } catch (const Error& e) {
        const std::string m = e.what();
        CHECK(m.find("collective mismatch") != std::string::npos);
        CHECK(m.find("rank 0 calls all_reduce(4 i32, sum)") != std::string::npos);
        CHECK(m.find("rank 1 calls all_reduce(5 i32, sum)") != std::string::npos);
    }
}

TEST_CASE("thread comm: a wait nobody can satisfy is a deadlock error, not a hang",
          "[thread_comm]") {
    ThreadWorld w(2, LinkModel{});
    try {
        w.run([&](Communicator& c) {
            if (c.rank() == 0) {
                int32_t x = 0;
                Request r = c.irecv(&x, 4, 1, 5);
                r.wait();
            }
        });
        FAIL("no error");
    } catch (const Error& e) {
        const std::string m = e.what();
        CHECK(m.find("deadlock") != std::string::npos);
        CHECK(m.find("rank 0 waits for a message from rank 1 with tag 5") != std::string::npos);
        CHECK(m.find("rank 1 has finished") != std::string::npos);
    }
}

TEST_CASE("thread comm: a receive of the wrong size names both sizes", "[thread_comm]") {
    ThreadWorld w(2, LinkModel{});
    try {
        w.run([&](Communicator& c) {
            int64_t x = 0;
            if (c.rank() == 0) {
                Request s = c.isend(&x, 8, 1, 0);
                s.wait();
            } else {
                Request r = c.irecv(&x, 4, 0, 0);
                r.wait();
            }
        });
        FAIL("no error");
    } catch (const Error& e) {
        const std::string m = e.what();
        CHECK(m.find("8 bytes from rank 0") != std::string::npos);
        CHECK(m.find("posted receive of 4 bytes") != std::string::npos);
    }
}

TEST_CASE("thread comm: bad arguments", "[thread_comm]") {
    CHECK_THROWS_WITH(ThreadWorld(0, LinkModel{}), Catch::Contains("at least 1 virtual rank"));
    LinkModel bad;
    bad.beta_gbs = 0.0;
    CHECK_THROWS_WITH(ThreadWorld(2, bad), Catch::Contains("GB/s > 0"));
    ThreadWorld w(1, LinkModel{});
    w.run([](Communicator&) {});
    CHECK_THROWS_WITH(w.run([](Communicator&) {}), Catch::Contains("runs once"));
}
