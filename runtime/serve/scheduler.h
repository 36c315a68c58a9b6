// What runs next on rank 0 of job serve (docs/serve.md "Batching"): which waiting request is
// admitted, and what the running ones may hold. Requests wait in the TaskQueue in arrival order;
// the oldest is admitted when fewer than serve.max_batch requests run and its KV memory fits
// serve.kv_budget_mb beside theirs. Nothing overtakes it -- first come, first served, so no
// request starves; a large request waits for memory to free rather than being passed by small
// ones, and one that could never fit was refused before it was queued. A request that left
// (its client went away) or passed its deadline while waiting is handed out at once, taking no
// slot, for the caller to answer.
//
// The worker (rank 0's main thread) then runs the admitted request's context work in pieces
// between decode steps of the running ones (runtime/core/pieces.h) and decodes it with them;
// the scheduler only counts. No model, no communicator; called by the worker alone (the HTTP
// threads read the gauges it publishes to Metrics).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>

#include "runtime/serve/metrics.h"
#include "runtime/serve/task.h"

namespace infoflow::serve {

class Scheduler {
  public:
    Scheduler(int max_batch, uint64_t kv_budget_bytes, TaskQueue& queue, Metrics& metrics);

    // The oldest waiting task if it may start now: it leaves the queue and its Task::kv_need
    // bytes count as in use until resize/release. Waits at most `timeout` for a task to arrive;
    // nullptr when none came, when the oldest must wait for a slot or memory, or after wake().
    std::shared_ptr<Task> admit(std::chrono::milliseconds timeout);
    // A running task now holds `bytes` of KV memory (its prefill ended: its cache alone).
    void resize(const Task& t, uint64_t bytes);
    // A running task ended (answered, failed or cancelled): its slot and memory are free.
    void release(const Task& t);

    int running() const;
    int max_batch() const { return max_batch_; }
    uint64_t kv_in_use() const;
    uint64_t kv_budget() const { return kv_budget_; }
    // Whether a task of `bytes` could ever run (its need within the budget).
    bool fits_budget(uint64_t bytes) const { return bytes <= kv_budget_; }

  private:
    bool may_start(const Task& t) const;
    void publish() const;  // the gauges of /metrics

    int max_batch_;
    uint64_t kv_budget_;
    TaskQueue& queue_;
    Metrics& metrics_;
    std::map<const Task*, uint64_t> running_;  // admitted task -> KV bytes it holds
    uint64_t in_use_ = 0;
};

}  // namespace infoflow::serve
