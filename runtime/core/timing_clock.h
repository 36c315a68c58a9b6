// The clock the engine's phase and compute-segment timings read: the wall clock (the default), or
// the process's CPU time (user + system). On a machine shared with other work the wall clock
// also counts the time other processes took from this one, and the emulated ranks' critical path
// (comm/thread_comm.h) takes the slowest rank at every collective, so that time inflates balanced
// schedules most; the CPU time of a one-thread run equals its wall time on an idle machine and
// leaves it out. Process-wide; job sweep sets it for its run (sweep.clock, docs/quality.md).
#pragma once

namespace infoflow {

enum class TimingClock { wall, cpu };

void set_timing_clock(TimingClock c);
TimingClock timing_clock();
// Milliseconds on the current clock, from an arbitrary origin.
double timing_now_ms();

// Sets the clock for its lifetime and restores the previous one.
class ScopedTimingClock {
  public:
    explicit ScopedTimingClock(TimingClock c) : prev_(timing_clock()) { set_timing_clock(c); }
    ~ScopedTimingClock() { set_timing_clock(prev_); }
    ScopedTimingClock(const ScopedTimingClock&) = delete;
    ScopedTimingClock& operator=(const ScopedTimingClock&) = delete;

  private:
    TimingClock prev_;
};

}  // namespace infoflow
