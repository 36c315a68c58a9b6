// Phase timing of a distributed run: wall time per phase and this rank's communication in it
// (bytes sent and received, time waited), taken from the communicator's accounting (§5.5).
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"
#include "runtime/core/progress.h"
#include "runtime/core/timing_clock.h"
#include "runtime/method/pipeline.h"

namespace infoflow {

// Times phases and takes this rank's communication in each from the communicator (§5.5).
class SpClock final {
  public:
    SpClock(Communicator& comm, std::vector<PhaseTime>& out) : comm_(comm), out_(out) {}
    void begin(const std::string& name) {
        name_ = name;
        comm_.set_phase(name);
        start_ = comm_.stats(name);
        t0_ = timing_now_ms();
        progress::phase_begin(name);
    }
    void end() {
        const CommStats s = comm_.stats(name_);
        PhaseTime p;
        p.name = name_;
        p.ms = timing_now_ms() - t0_;
        p.bytes_sent = s.bytes_sent - start_.bytes_sent;
        p.bytes_recv = s.bytes_recv - start_.bytes_recv;
        p.wait_ms = s.wait_ms - start_.wait_ms;
        out_.push_back(p);
        progress::phase_end(name_, p.ms);
        comm_.set_phase("other");
    }

  private:
    Communicator& comm_;
    std::vector<PhaseTime>& out_;
    std::string name_;
    CommStats start_;
    double t0_ = 0.0;  // timing_clock.h
};

}  // namespace infoflow
