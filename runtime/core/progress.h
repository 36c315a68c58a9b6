// Progress lines for long runs, on standard error of rank 0 only: each phase as it starts and
// when it ends (with tokens/s where the phase's token count is known), and sweeps with
// done/total and an ETA. A process-wide reporter, off until a job turns it on (run_job does on
// rank 0), so library code and tests stay quiet; the phase clocks call it with one line each.
// Not a logger: no levels, no files; results never go through it.
#pragma once

#include <chrono>
#include <string>

namespace infoflow {
namespace progress {

// On for this process (rank 0 of a job); off by default.
void set_enabled(bool on);
bool enabled();

// Per-phase lines; sweeps turn them off and report cases instead.
void set_phase_lines(bool on);

// Token counts of the request now running, for tokens/s: `context` tokens (chunks 0..K),
// `suffix` tokens, `recompute` = selected tokens (0 = unknown). Phases map to them by name:
// prefill = context + suffix; chunk_prefill, shard_prefill, scoring, reorder = context;
// ring_prefill = context + suffix; recompute = recompute; suffix_prefill = suffix.
void set_tokens(int context, int suffix, int recompute);

// "[progress] NAME ..." when a phase starts, "[progress] NAME done: X ms (Y tok/s)" when it
// ends. Clocks that only learn a phase at its end call phase_end alone.
void phase_begin(const std::string& name);
void phase_end(const std::string& name, double ms);

// "[progress] TEXT" (when enabled).
void note(const std::string& text);

// Seconds as "42 s", "3 min 05 s", "1 h 02 min".
std::string format_duration(double seconds);

// A sweep of `total` cases: step() after each finished case; with a non-empty `what` it prints
// "[progress] WHAT done/total, elapsed E, ETA R" (the ETA from the mean time per case so far).
// Sweeps that print their own per-case lines pass "" and put eta() in them.
class Sweep {
  public:
    Sweep(std::string what, int total);
    void step();
    int done() const { return done_; }
    // Time left, e.g. "3 min 05 s"; "0 s" when done.
    std::string eta() const;

  private:
    std::string what_;
    int total_ = 0;
    int done_ = 0;
    std::chrono::steady_clock::time_point t0_;
};

}  // namespace progress
}  // namespace infoflow
