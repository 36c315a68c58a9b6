// The watchdog's polling loop and messages (comm/watchdog.h) without MPI: a fake side channel
// stands for the other ranks. The MPI side is tested end to end by tests/mpi/run_watchdog_test.sh
// (a rank stopped with SIGSTOP) and tests/mpi/test_comm.cpp.
#include <catch2/catch.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "comm/watchdog.h"
#include "runtime/core/error.h"

using namespace infoflow;
using Catch::Contains;

namespace {

// Answers surveys with fixed positions (empty: that rank is silent); counts serve() calls.
struct FakeChannel : WatchdogChannel {
    std::vector<std::optional<WatchdogPosition>> answers;
    int served = 0;
    int surveys = 0;
    void serve(const WatchdogPosition&) override { ++served; }
    std::vector<std::optional<WatchdogPosition>> survey(const WatchdogPosition&, double) override {
        ++surveys;
        return answers;
    }
};

}  // namespace

TEST_CASE("watchdog: a wait that completes returns, serving the channel", "[comm][watchdog]") {
    // Deadlines far beyond the wait: 5000 polls take microseconds when the thread runs, but on a
    // loaded machine the wait passes 50 ms and sleeps 100 us per poll (it failed at 0.5 s).
    Watchdog wd(0, 3, {30.0, 30.0});
    FakeChannel ch;
    wd.set_channel(&ch);
    int polls = 0;
    wd.wait([&] { return ++polls == 5000; }, "scoring", "all_gather", true);
    CHECK(polls == 5000);
    CHECK(ch.served > 0);
    CHECK(ch.surveys == 0);
}

TEST_CASE("watchdog: an expired wait names the silent rank, the phase and the deadline",
          "[comm][watchdog]") {
    Watchdog wd(0, 3, {60.0, 0.2});
    FakeChannel ch;
    ch.answers.resize(3);
    ch.answers[1] = WatchdogPosition{4, "scoring", "all_gather", true};  // rank 1 waits with us
    wd.set_channel(&ch);                                                 // rank 2 is silent
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(wd.wait([] { return false; }, "scoring", "all_gather", true),
                      Contains("rank 2 did not reach scoring/all_gather within 0.2 s") &&
                          !Contains("rank 1 did not"));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(s >= 0.2);
    CHECK(s < 5.0);
    CHECK(ch.surveys == 1);
}

TEST_CASE("watchdog: start-up deadline until end_startup, then timeout_s", "[comm][watchdog]") {
    Watchdog wd(1, 2, {0.3, 0.1});
    CHECK(wd.in_startup());
    CHECK(wd.current_timeout_s() == 0.1);
    wd.end_startup();
    CHECK(wd.current_timeout_s() == 0.3);
    // No channel: the message cannot name the rank, but it still ends the wait.
    CHECK_THROWS_WITH(wd.wait([] { return false; }, "recompute", "wait irecv from rank 0", false),
                      Contains("did not reach recompute/wait irecv from rank 0 within 0.3 s"));
    CHECK_THROWS_WITH(wd.set_timeouts({0.0, 1.0}), Contains("must be > 0"));
}

TEST_CASE("watchdog: messages for computing ranks and for a collective mismatch",
          "[comm][watchdog]") {
    Watchdog wd(0, 3, {10.0, 10.0});
    const WatchdogPosition here{7, "recompute", "all_gather_v", true};
    std::vector<std::optional<WatchdogPosition>> a(3);
    a[1] = WatchdogPosition{6, "scoring", "computation after all_reduce", false};
    a[2] = WatchdogPosition{7, "recompute", "all_gather_v", true};
    CHECK_THAT(wd.describe(here, 10.0, a),
               Contains("rank 1 did not reach recompute/all_gather_v within 10 s") &&
                   Contains("computing in phase scoring"));
    a[1] = WatchdogPosition{7, "recompute", "all_to_all_v", true};
    CHECK_THAT(wd.describe(here, 10.0, a),
               Contains("although every rank is waiting") &&
                   Contains("rank 1 in recompute/all_to_all_v (collective 7)"));
    a[1].reset();
    a[2].reset();
    CHECK_THAT(wd.describe(here, 10.0, a), Contains("ranks 1, 2 did not reach"));
}
