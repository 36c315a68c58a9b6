// Task events and the bounded FIFO queue (task.h).
#include "runtime/serve/task.h"

#include <algorithm>
#include <cmath>

namespace infoflow::serve {

Task::Task(Kind kind, std::string route, double timeout_s)
    : kind_(kind), route_(std::move(route)), arrival_(Clock::now()) {
    deadline_ = arrival_ + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(timeout_s));
}

double Task::seconds_since_arrival() const {
    return std::chrono::duration<double>(Clock::now() - arrival_).count();
}

void Task::cancel() {
    Clock::rep none = 0;
    cancelled_at_.compare_exchange_strong(none, Clock::now().time_since_epoch().count());
    cancelled_ = true;
}

void Task::push(Event e) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (finished_) return;
        if (e.type != Event::Type::chunk) finished_ = true;
        events_.push_back(std::move(e));
    }
    cv_.notify_all();
}

void Task::send_chunk(nlohmann::json chunk) {
    Event e;
    e.type = Event::Type::chunk;
    e.body = std::move(chunk);
    push(std::move(e));
}

void Task::finish(nlohmann::json body, int status) {
    Event e;
    e.type = Event::Type::done;
    e.body = std::move(body);
    e.status = status;
    push(std::move(e));
}

void Task::fail(const ApiError& err) {
    Event e;
    e.type = Event::Type::error;
    e.body = err.to_json();
    e.status = err.status;
    e.retry_after_s = err.retry_after_s;
    push(std::move(e));
}

bool Task::finished() const {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_;
}

std::optional<Task::Event> Task::next(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
    Event e = std::move(events_.front());
    events_.pop_front();
    return e;
}

TaskQueue::Push TaskQueue::push(std::shared_ptr<Task> t) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (closed_) return Push::closed;
        if (int(q_.size()) >= capacity_) return Push::full;
        q_.push_back(std::move(t));
    }
    cv_.notify_all();
    return Push::ok;
}

std::shared_ptr<Task> TaskQueue::pop(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !q_.empty() || woken_ || closed_; });
    woken_ = false;
    if (q_.empty()) return nullptr;
    std::shared_ptr<Task> t = std::move(q_.front());
    q_.pop_front();
    return t;
}

void TaskQueue::wake() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        woken_ = true;
    }
    cv_.notify_all();
}

std::vector<std::shared_ptr<Task>> TaskQueue::close() {
    std::vector<std::shared_ptr<Task>> rest;
    {
        std::lock_guard<std::mutex> lock(mu_);
        closed_ = true;
        rest.assign(q_.begin(), q_.end());
        q_.clear();
    }
    cv_.notify_all();
    return rest;
}

int TaskQueue::depth() const {
    std::lock_guard<std::mutex> lock(mu_);
    return int(q_.size());
}

int TaskQueue::retry_after_s() const {
    std::lock_guard<std::mutex> lock(mu_);
    const double s = mean_service_s_ * double(q_.size() + 1) / double(std::max(1, parallel_));
    return int(std::clamp(std::ceil(s), 1.0, 60.0));
}

void TaskQueue::record_service_time(double s) {
    std::lock_guard<std::mutex> lock(mu_);
    mean_service_s_ = 0.8 * mean_service_s_ + 0.2 * s;
}

}  // namespace infoflow::serve
