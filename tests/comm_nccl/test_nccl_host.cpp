// Host-side logic of the NCCL communicator that runs without a GPU (label cpu; built when NCCL
// is): the host/device pointer classification (on a machine without a driver every pointer is
// host memory), the mixed-buffer rule, the watchdog's decision and its wait loop under a fake
// clock (an operation that never completes times out exactly at the deadline; nothing is
// aborted), the timeout message, and the factory's behaviour where no device exists.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/nccl_comm.h"

using namespace infoflow;

TEST_CASE("nccl: host pointers classify as host, nullptr as none", "[nccl]") {
    int on_stack = 0;
    std::vector<double> on_heap(1000);
    static char in_data[16];
    CHECK(classify_pointer(nullptr) == PointerSpace::none);
    CHECK(classify_pointer(&on_stack) == PointerSpace::host);
    CHECK(classify_pointer(on_heap.data()) == PointerSpace::host);
    CHECK(classify_pointer(in_data) == PointerSpace::host);
    // Repeated calls: a cleared error does not leak into the next classification.
    CHECK(classify_pointer(&on_stack, "again") == PointerSpace::host);
    CHECK(std::string(pointer_space_name(PointerSpace::device)) == "device");
}

TEST_CASE("nccl: call_space combines buffers and rejects a mix", "[nccl]") {
    using S = PointerSpace;
    CHECK(call_space("all_gather", {S::host, S::host}) == S::host);
    CHECK(call_space("all_gather", {S::none, S::host}) == S::host);
    CHECK(call_space("all_gather", {S::device, S::none}) == S::device);
    CHECK(call_space("barrier", {}) == S::none);
    CHECK(call_space("broadcast", {S::none}) == S::none);
    CHECK_THROWS_WITH(call_space("all_to_all_v", {S::device, S::host}),
                      Catch::Contains("all_to_all_v was given host and device buffers"));
    CHECK_THROWS_WITH(call_space("sendrecv", {S::host, S::none, S::device}),
                      Catch::Contains("sendrecv"));
}

TEST_CASE("nccl: watchdog verdict", "[nccl][watchdog]") {
    WatchdogPoll running, done, bad;
    done.complete = true;
    bad.failed = true;
    bad.error = "x";
    CHECK(watchdog_verdict(running, 0.0, 10.0) == WatchdogVerdict::poll_again);
    CHECK(watchdog_verdict(running, 9.999, 10.0) == WatchdogVerdict::poll_again);
    CHECK(watchdog_verdict(running, 10.0, 10.0) == WatchdogVerdict::timed_out);
    CHECK(watchdog_verdict(running, 11.0, 10.0) == WatchdogVerdict::timed_out);
    // Completed operations are never aborted, even past the deadline.
    CHECK(watchdog_verdict(done, 0.0, 10.0) == WatchdogVerdict::complete);
    CHECK(watchdog_verdict(done, 50.0, 10.0) == WatchdogVerdict::complete);
    // A failure wins over completion and the deadline.
    CHECK(watchdog_verdict(bad, 0.0, 10.0) == WatchdogVerdict::failed);
    WatchdogPoll both = bad;
    both.complete = true;
    CHECK(watchdog_verdict(both, 50.0, 10.0) == WatchdogVerdict::failed);
}

namespace {

// A clock that moves only when the waiter sleeps, plus a poll counter.
struct FakeTime {
    double t = 1000.0;
    double slept = 0.0;
    int sleeps = 0;
    int polls = 0;
    std::function<double()> now() {
        return [this] { return t; };
    }
    std::function<void(double)> sleep() {
        return [this](double s) {
            CHECK(s > 0.0);
            CHECK(s <= 1e-4);  // the wait never sleeps longer than 100 µs at a time
            t += s;
            slept += s;
            ++sleeps;
        };
    }
};

}  // namespace

TEST_CASE("nccl: watchdog wait times out an operation that never completes", "[nccl][watchdog]") {
    for (double timeout : {0.01, 0.5, 3.0}) {
        CAPTURE(timeout);
        FakeTime ft;
        WatchdogPoll last;
        last.complete = true;  // overwritten by the final poll
        const WatchdogVerdict v = watchdog_wait(
            [&] {
                ++ft.polls;
                return WatchdogPoll{};
            },
            timeout, ft.now(), ft.sleep(), &last);
        CHECK(v == WatchdogVerdict::timed_out);
        CHECK_FALSE(last.complete);
        // It gave up at the first poll at or past the deadline: the time waited is the timeout
        // plus less than one sleep.
        CHECK(ft.slept >= timeout);
        CHECK(ft.slept < timeout + 1e-4 + 1e-12);
        CHECK(ft.polls >= ft.sleeps + 1);  // every sleep is followed by a poll
        CHECK(ft.sleeps > 0);
    }
}

TEST_CASE("nccl: watchdog wait returns on completion or failure", "[nccl][watchdog]") {
    SECTION("completes at the 200th poll") {
        FakeTime ft;
        const WatchdogVerdict v = watchdog_wait(
            [&] {
                WatchdogPoll p;
                p.complete = ++ft.polls == 200;
                return p;
            },
            10.0, ft.now(), ft.sleep(), nullptr);
        CHECK(v == WatchdogVerdict::complete);
        CHECK(ft.polls == 200);
        CHECK(ft.slept < 10.0);
    }
    SECTION("completes at once: no sleep") {
        FakeTime ft;
        const WatchdogVerdict v = watchdog_wait(
            [&] {
                ++ft.polls;
                WatchdogPoll p;
                p.complete = true;
                return p;
            },
            10.0, ft.now(), ft.sleep(), nullptr);
        CHECK(v == WatchdogVerdict::complete);
        CHECK(ft.polls == 1);
        CHECK(ft.sleeps == 0);
    }
    SECTION("an asynchronous error is reported with its text") {
        FakeTime ft;
        WatchdogPoll last;
        const WatchdogVerdict v = watchdog_wait(
            [&] {
                WatchdogPoll p;
                if (++ft.polls == 100) {
                    p.failed = true;
                    p.error = "NCCL asynchronous error: remote process exited";
                }
                return p;
            },
            10.0, ft.now(), ft.sleep(), &last);
        CHECK(v == WatchdogVerdict::failed);
        CHECK(last.error == "NCCL asynchronous error: remote process exited");
    }
    SECTION("a deadline already spent times out at the first incomplete poll") {
        FakeTime ft;
        const WatchdogVerdict v = watchdog_wait(
            [&] {
                ++ft.polls;
                return WatchdogPoll{};
            },
            -1.0, ft.now(), ft.sleep(), nullptr);
        CHECK(v == WatchdogVerdict::timed_out);
        CHECK(ft.polls == 1);
    }
}

TEST_CASE("nccl: watchdog message names the operation, the phase and the deadline",
          "[nccl][watchdog]") {
    CHECK(watchdog_timeout_message("all_gather", "recompute", 600.0) ==
          "NCCL all_gather in phase recompute did not complete within 600 s");
    CHECK(watchdog_timeout_message("isend to rank 1, irecv from rank 3", "ring", 2.5) ==
          "NCCL isend to rank 1, irecv from rank 3 in phase ring did not complete within 2.5 s");
}

TEST_CASE("nccl: the start-up deadline's message names the key and what went wrong", "[nccl]") {
    CHECK(nccl_init_timeout_message(1.0, 1.04) ==
          "communicator 'nccl': NCCL initialization (ncclCommInitRankConfig) did not complete "
          "within parallel.startup_timeout_s = 1 s (waited 1.0 s): a rank did not arrive or "
          "NCCL's bootstrap could not connect");
}

TEST_CASE("nccl: constructor argument checks", "[nccl]") {
    CHECK_THROWS_WITH(make_nccl_communicator(nullptr, 10.0),
                      Catch::Contains("no host communicator"));
    for (double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(),
                       std::numeric_limits<double>::infinity()}) {
        CAPTURE(bad);
        CHECK_THROWS_WITH(make_nccl_communicator(make_self_communicator(), bad),
                          Catch::Contains("must be > 0"));
        CHECK_THROWS_WITH(make_nccl_communicator(make_self_communicator(), 10.0, bad),
                          Catch::Contains("start-up timeout"));
    }
}

TEST_CASE("nccl: the factory without a device fails with a clear message", "[nccl]") {
    CHECK(comm_have_nccl());
    std::string why;
    const int n = nccl_visible_devices(&why);
    if (n > 0) {
        // A GPU machine: the communicator starts (1 rank over SelfComm).
        CommOptions opts;
        opts.backend = "cuda";
        auto c = make_communicator("nccl", opts);
        CHECK(std::string(c->kind()) == "nccl");
        CHECK(c->memory_space() == MemorySpace::device);
        // One rank with the cuda backend: "auto" leaves NCCL alone.
        CHECK(std::string(make_communicator("auto", opts)->kind()) == "self");
        return;
    }
    CHECK_FALSE(why.empty());
    CHECK_THROWS_WITH(make_communicator("nccl"), Catch::Contains("communicator 'nccl': rank 0") &&
                                                     Catch::Contains("no CUDA device visible"));
    CommOptions opts;
    opts.backend = "cuda";
    CHECK_THROWS_WITH(make_communicator("nccl", opts), Catch::Contains("no CUDA device visible"));
    // One rank with the cuda backend: "auto" does not bring NCCL up (nothing moves between GPUs),
    // so a missing device or libnccl cannot stop it here.
    CHECK(std::string(make_communicator("auto", opts)->kind()) == "self");
    // After the failures the process is still usable: host pointers still classify.
    int x = 0;
    CHECK(classify_pointer(&x) == PointerSpace::host);
}
