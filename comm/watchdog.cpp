// Watchdog: the polling loop with a deadline and the message of a deadline that passed (see
// comm/watchdog.h for the scheme).
#include "comm/watchdog.h"

#include <algorithm>
#include <chrono>
#include <sstream>
#include <thread>

#include "runtime/core/error.h"
#include "runtime/core/pieces.h"

namespace infoflow {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string format_seconds(double s) {
    std::ostringstream os;
    os << s;
    return os.str();
}

std::string rank_list(const std::vector<int>& ranks) {
    std::ostringstream os;
    os << (ranks.size() == 1 ? "rank " : "ranks ");
    for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
    return os.str();
}

}  // namespace

Watchdog::Watchdog(int rank, int size, WatchdogTimeouts timeouts)
    : rank_(rank), size_(size), on_expired_([](const std::string& msg) { IF_FAIL(msg); }) {
    set_timeouts(timeouts);
    idle_.phase = "other";
    idle_.op = "computation";
}

void Watchdog::set_timeouts(const WatchdogTimeouts& t) {
    IF_CHECK(t.timeout_s > 0 && t.startup_timeout_s > 0,
             "watchdog timeouts must be > 0 (timeout_s " << t.timeout_s << ", startup_timeout_s "
                                                         << t.startup_timeout_s << ")");
    timeouts_ = t;
}

double Watchdog::current_timeout_s() const {
    return startup_ ? timeouts_.startup_timeout_s : timeouts_.timeout_s;
}

void Watchdog::set_on_expired(std::function<void(const std::string&)> on_expired) {
    on_expired_ = std::move(on_expired);
}

void Watchdog::serve() {
    if (channel_) channel_->serve(idle_);
}

void Watchdog::wait(const std::function<bool()>& done, const std::string& phase,
                    const std::string& op, bool collective) {
    if (collective) ++collectives_;
    WatchdogPosition here{collectives_, phase, op, true};
    idle_ = {collectives_, phase, "computation after " + op, false};
    const double timeout = current_timeout_s();
    const auto t0 = Clock::now();
    // Spin for the first milliseconds (the common case: the peers are there), then yield, then
    // sleep briefly between polls so that a long wait does not take a core from the ranks that
    // share it. MPI progresses non-blocking operations only inside the test, so the sleep is
    // short: 100 us, and 2 ms once the wait has lasted 50 ms (a rank waiting for another's long
    // computation, or an idle server rank between heartbeats: 100 us polls cost ~10 % of a core;
    // the added latency is then at most 4 % of the wait, and less the longer it lasts).
    for (uint64_t polls = 0;; ++polls) {
        if (done()) return;
        piece_wait_point();  // job serve: a decode step may run while this rank waits (pieces.h)
        const double waited = seconds_since(t0);
        if (channel_ && (polls % 64 == 0 || waited > 0.02)) channel_->serve(here);
        if (waited > timeout) {
            std::vector<std::optional<WatchdogPosition>> answers;
            if (channel_) answers = channel_->survey(here, std::min(grace_s_, timeout));
            // A late completion during the survey still fails the job: the deadline is the rule.
            on_expired_(describe(here, timeout, answers));
            IF_FAIL("watchdog expiry handler returned");
        }
        if (waited < 0.002) continue;
        if (waited < 0.02) {
            std::this_thread::yield();
        } else {
            std::this_thread::sleep_for(std::chrono::microseconds(waited < 0.05 ? 100 : 2000));
        }
    }
}

std::string Watchdog::describe(const WatchdogPosition& here, double waited_s,
                               const std::vector<std::optional<WatchdogPosition>>& answers) const {
    const std::string where = here.phase + "/" + here.op;
    const std::string within = " within " + format_seconds(waited_s) + " s";
    std::vector<int> silent, computing, waiting;
    for (int q = 0; q < size_; ++q) {
        if (q == rank_) continue;
        if (q >= static_cast<int>(answers.size()) || !answers[q]) {
            silent.push_back(q);
        } else if (!answers[q]->waiting) {
            computing.push_back(q);
        } else {
            waiting.push_back(q);
        }
    }
    std::ostringstream os;
    if (answers.empty()) {
        os << "a peer did not reach " << where << within << " (no watchdog channel to name it)";
        return os.str();
    }
    if (!silent.empty()) {
        os << rank_list(silent) << " did not reach " << where << within << " ("
           << (silent.size() == 1 ? "it does" : "they do")
           << " not answer the watchdog: stopped, hung or dead)";
    }
    for (int q : computing) {
        if (os.tellp() > 0) os << "; ";
        os << "rank " << q << " did not reach " << where << within << " (it is computing in phase "
           << answers[q]->phase << ", after collective " << answers[q]->collectives << ")";
    }
    if (os.tellp() > 0) return os.str();
    os << where << " (collective " << here.collectives << ") did not complete" << within
       << " although every rank is waiting:";
    for (int q : waiting) {
        os << " rank " << q << " in " << answers[q]->phase << "/" << answers[q]->op
           << " (collective " << answers[q]->collectives << ");";
    }
    os << " a rank may be in a different collective";
    return os.str();
}

}  // namespace infoflow
