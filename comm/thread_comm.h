// ThreadComm: P virtual ranks in one process, one thread each, over host memory (the emulated
// timing mode of bench-ttft, docs/design.md §10). Data really moves (memcpy between the threads), the
// byte accounting is the Communicator's own (so it equals MpiComm's exactly), collectives are
// rendezvous points and point-to-point messages match by (source, tag) in posting order as in
// MPI. Reductions run in rank order (rank 0's buffer, then rank 1's, ...), so every rank gets the
// same bits.
//
// Turn-taking. Only one virtual rank computes at a time: a rank holds the turn while it runs its
// own code and gives it up only where it must wait for others (a collective, waiting for a
// message), so the ranks share one device (or the CPU) the way P devices would not, and each
// compute segment is timed alone. A segment is the time between two communicator calls (or phase
// changes) of one rank, measured on the wall clock after `sync` (the backend's synchronize) at
// its end; the segments and the alpha-beta costs of the calls are laid out on a VirtualTimeline
// (comm/comm_model.h), which gives the modelled critical path. A message is copied at posting
// (eager), so a send never waits for its receive; its virtual arrival follows the link model.
//
// Faults. A rank that throws ends the run: every rank waiting in a collective or for a message
// throws "virtual rank r: ... failed", the threads are joined and the failing rank's own error is
// rethrown. Mismatched collectives (different ops, sizes or roots across ranks) and a deadlock
// (every running rank waiting on something no rank can provide) are errors naming every rank.
#pragma once

#include <functional>
#include <memory>

#include "comm/comm_model.h"
#include "comm/communicator.h"

namespace infoflow {

class ThreadWorld {
  public:
    // `sync` is called at the end of every timed segment (may be empty: nothing to wait for).
    ThreadWorld(int n_ranks, const LinkModel& link, std::function<void()> sync = {});
    ~ThreadWorld();
    ThreadWorld(const ThreadWorld&) = delete;
    ThreadWorld& operator=(const ThreadWorld&) = delete;

    int size() const;
    const LinkModel& link() const;

    // Runs body(comm) on n_ranks threads, thread r with the ThreadComm of rank r, taking turns;
    // returns when every thread has ended. The first rank's error to occur is rethrown (after
    // every thread was joined). Once per world.
    void run(const std::function<void(Communicator& comm)>& body);

    // The timeline of the run (valid after run()).
    const VirtualTimeline& timeline() const;

    struct State;

  private:
    std::unique_ptr<State> st_;
};

}  // namespace infoflow
