// Admission and KV accounting of the running requests (scheduler.h).
#include "runtime/serve/scheduler.h"

#include "runtime/core/error.h"

namespace infoflow::serve {

Scheduler::Scheduler(int max_batch, uint64_t kv_budget_bytes, TaskQueue& queue, Metrics& metrics)
    : max_batch_(max_batch), kv_budget_(kv_budget_bytes), queue_(queue), metrics_(metrics) {
    IF_CHECK(max_batch >= 1, "serve.max_batch = " << max_batch << ": must be >= 1");
    publish();
}

bool Scheduler::may_start(const Task& t) const {
    // A task that will not run takes no slot; the caller answers it at once.
    if (t.cancelled() || t.past_deadline()) return true;
    if (int(running_.size()) >= max_batch_) return false;
    return in_use_ + t.kv_need <= kv_budget_;
}

std::shared_ptr<Task> Scheduler::admit(std::chrono::milliseconds timeout) {
    std::shared_ptr<Task> t =
        queue_.pop_if(timeout, [this](const Task& head) { return may_start(head); });
    if (t) {
        running_[t.get()] = t->kv_need;
        in_use_ += t->kv_need;
        publish();
    }
    metrics_.set_queue(queue_.depth(), queue_.capacity());
    return t;
}

void Scheduler::resize(const Task& t, uint64_t bytes) {
    const auto it = running_.find(&t);
    IF_CHECK(it != running_.end(), "scheduler: resize of a task that is not running");
    in_use_ = in_use_ - it->second + bytes;
    it->second = bytes;
    publish();
}

void Scheduler::release(const Task& t) {
    const auto it = running_.find(&t);
    if (it == running_.end()) return;
    in_use_ -= it->second;
    running_.erase(it);
    publish();
}

int Scheduler::running() const { return int(running_.size()); }

uint64_t Scheduler::kv_in_use() const { return in_use_; }

void Scheduler::publish() const {
    metrics_.set_running(int(running_.size()), max_batch_);
    metrics_.set_kv(in_use_, kv_budget_);
}

}  // namespace infoflow::serve
