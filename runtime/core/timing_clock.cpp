#include "runtime/core/timing_clock.h"

#include <time.h>

#include <atomic>
#include <chrono>

namespace infoflow {
namespace {

std::atomic<int> g_clock{int(TimingClock::wall)};

}  // namespace

void set_timing_clock(TimingClock c) { g_clock.store(int(c)); }

TimingClock timing_clock() { return TimingClock(g_clock.load()); }

double timing_now_ms() {
    if (timing_clock() == TimingClock::cpu) {
        timespec ts{};
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
    }
    const auto t = std::chrono::steady_clock::now().time_since_epoch();
    return std::chrono::duration<double, std::milli>(t).count();
}

}  // namespace infoflow
