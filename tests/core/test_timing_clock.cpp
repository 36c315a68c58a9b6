// runtime/core/timing_clock.h: the CPU-time clock advances with this process's work and not
// while it sleeps; the wall clock advances either way; the scope restores the previous clock.
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "runtime/core/timing_clock.h"

using namespace infoflow;

namespace {

// About `ms` of busy work on this thread.
double spin(double ms) {
    const auto t0 = std::chrono::steady_clock::now();
    volatile double x = 0.0;
    while (
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() <
        ms) {
        for (int i = 0; i < 1000; ++i) x = x + 1e-9 * i;
    }
    return x;
}

}  // namespace

TEST_CASE("timing clock: cpu time leaves out sleep, the wall clock does not", "[timing_clock]") {
    REQUIRE(timing_clock() == TimingClock::wall);
    {
        const ScopedTimingClock cpu(TimingClock::cpu);
        CHECK(timing_clock() == TimingClock::cpu);
        const double t0 = timing_now_ms();
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        const double slept = timing_now_ms() - t0;
        CAPTURE(slept);
        CHECK(slept < 20.0);  // a sleeping process uses (almost) no CPU
        // Work advances it: spin until it moved 30 ms (at most 20 s of wall time, however busy
        // the machine is).
        const auto w0 = std::chrono::steady_clock::now();
        const double t1 = timing_now_ms();
        while (timing_now_ms() - t1 < 30.0 &&
               std::chrono::steady_clock::now() - w0 < std::chrono::seconds(20)) {
            spin(5.0);
        }
        CHECK(timing_now_ms() - t1 >= 30.0);
    }
    CHECK(timing_clock() == TimingClock::wall);
    const double t0 = timing_now_ms();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(timing_now_ms() - t0 >= 50.0);
}
