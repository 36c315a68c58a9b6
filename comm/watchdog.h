// The watchdog (docs/design.md §11): every blocking wait of a communicator has a deadline, and a rank
// whose peers do not arrive ends the job naming the rank that is missing and the phase. Plain
// C++ (no mpi.h, no nccl.h); the MPI side channel is in comm/mpi_comm.h.
//
// How it works. A communicator never blocks inside the library: it posts the operation
// non-blocking (MPI_I* for MpiComm) and hands a completion test to Watchdog::wait, which polls
// it until it returns true or the deadline passes. While it polls, it answers questions from
// other ranks on a side channel (WatchdogChannel::serve). When the deadline passes, the rank
// asks every other rank "where are you?" (WatchdogChannel::survey) and waits a short grace
// period for the answers. A rank that is itself waiting in any communicator call answers at
// once with its position (collectives entered so far, phase, operation); a rank that is stopped
// (SIGSTOP), wedged in computation or dead does not answer. The message names:
//   - the ranks that did not answer: "rank q did not reach <phase>/<op> within N s";
//   - when every rank answered (all are waiting, e.g. in different collectives): each rank's
//     position, so the mismatch is visible.
// Then the expiry handler ends the job (MpiComm: "[rank r/P] error: ..." and MPI_Abort). No
// heartbeat traffic is sent while things go well: the side channel is used only after a
// deadline passed, so the cost of the watchdog is one non-blocking probe per poll.
//
// Deadlines. `timeout_s` (config parallel.timeout_s) for every wait, a separate
// `startup_timeout_s` (parallel.startup_timeout_s) until end_startup() (communicator set-up, the
// config and model identity checks: a rank that never starts should be reported sooner than a
// rank that is slow in a long phase).
//
// Plugging in a device communicator (NCCL). Its ops are enqueued on a stream and return at
// once; where the host waits for the stream (the communicator's synchronize, or a Request's
// wait), it calls
//     watchdog.wait([&] { check ncclCommGetAsyncError; return cudaStreamQuery(s) == cudaSuccess; },
//                   comm.phase(), "all_gather");
// with an MPI side channel made by make_mpi_watchdog_channel() over its bootstrap MPI
// communicator, and an expiry handler that calls ncclCommAbort before MPI_Abort. Nothing in
// this file depends on MPI or CUDA.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace infoflow {

// Deadlines of a communicator, in seconds (> 0).
struct WatchdogTimeouts {
    double timeout_s = 600.0;          // every wait after start-up (parallel.timeout_s)
    double startup_timeout_s = 300.0;  // waits before end_startup() (parallel.startup_timeout_s)
};

// Where a rank is: what it answers to a survey.
struct WatchdogPosition {
    uint64_t collectives = 0;  // collectives this rank has entered (the current one included)
    std::string phase;         // communication phase (Communicator::phase())
    std::string op;            // "all_gather", "wait irecv from rank 1", ...
    bool waiting = false;      // inside a wait right now (false: between waits)
};

// The side channel of a watchdog. Must not block beyond what each method allows.
class WatchdogChannel {
  public:
    virtual ~WatchdogChannel() = default;
    // Answers every question other ranks have sent so far with `here`; returns at once.
    virtual void serve(const WatchdogPosition& here) = 0;
    // Asks every other rank where it is and collects the answers for at most `grace_s` seconds
    // (serving questions meanwhile). Entry q is empty when rank q did not answer; the entry of
    // this rank is empty too.
    virtual std::vector<std::optional<WatchdogPosition>> survey(const WatchdogPosition& here,
                                                                double grace_s) = 0;
};

class Watchdog {
  public:
    // rank and size of the communicator it guards. Starts in the start-up period.
    Watchdog(int rank, int size, WatchdogTimeouts timeouts = {});

    void set_timeouts(const WatchdogTimeouts& t);  // throws infoflow::Error unless both > 0
    const WatchdogTimeouts& timeouts() const { return timeouts_; }
    // Ends the start-up period: later waits use timeout_s.
    void end_startup() { startup_ = false; }
    bool in_startup() const { return startup_; }
    // The deadline a wait entered now gets.
    double current_timeout_s() const;

    // May stay null (then the message cannot name the missing rank). Not owned.
    void set_channel(WatchdogChannel* channel) { channel_ = channel; }
    // Called with the message when a deadline passes; must not return (it ends the job). The
    // default throws infoflow::Error with the message.
    void set_on_expired(std::function<void(const std::string&)> on_expired);
    // Grace period of the survey after a deadline (default 3 s, at most the timeout).
    void set_grace_s(double s) { grace_s_ = s; }

    // Polls `done` until it returns true. `collective`: this wait is a collective (counted in
    // the position). `phase`/`op` name the wait in messages. Exceptions from `done` propagate.
    void wait(const std::function<bool()>& done, const std::string& phase, const std::string& op,
              bool collective);

    // Answers pending questions without waiting (for long computations that want to be
    // reported as "between waits" rather than silent). Cheap.
    void serve();

    // The message for a deadline that passed, from the survey's answers (exposed for tests).
    std::string describe(const WatchdogPosition& here, double waited_s,
                         const std::vector<std::optional<WatchdogPosition>>& answers) const;

  private:
    int rank_;
    int size_;
    WatchdogTimeouts timeouts_;
    bool startup_ = true;
    double grace_s_ = 3.0;
    uint64_t collectives_ = 0;
    WatchdogChannel* channel_ = nullptr;
    std::function<void(const std::string&)> on_expired_;
    WatchdogPosition idle_;  // what serve() answers between waits
};

}  // namespace infoflow
