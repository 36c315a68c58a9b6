// A request on its way through the server: the HTTP thread that holds its connection makes a
// Task and waits on it; the worker (rank 0's main thread, the only one that computes and talks
// to the other ranks) takes it from the bounded FIFO TaskQueue, runs it and sends its events
// back: text deltas while it generates, then one final event (done or error). A client that
// goes away marks the task cancelled, which the worker's token callback reads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/serve/api.h"

namespace infoflow::serve {

using Clock = std::chrono::steady_clock;

class Task {
  public:
    enum class Kind { completion, documents };
    struct Event {
        enum class Type { chunk, done, error };
        Type type = Type::chunk;
        // chunk: one stream chunk; done: the response (streamed: the array of last chunks
        // before "[DONE]"); error: the OpenAI error object.
        nlohmann::json body;
        int status = 200;  // done / error: HTTP status
        int retry_after_s = 0;
    };

    Task(Kind kind, std::string route, double timeout_s);
    virtual ~Task() = default;

    Kind kind() const { return kind_; }
    const std::string& route() const { return route_; }
    Clock::time_point arrival() const { return arrival_; }
    Clock::time_point deadline() const { return deadline_; }
    bool past_deadline() const { return Clock::now() > deadline_; }
    double seconds_since_arrival() const;

    // Worker side. After finish() or fail() nothing more is sent.
    void send_chunk(nlohmann::json chunk);
    void finish(nlohmann::json body, int status = 200);
    void fail(const ApiError& e);
    bool finished() const;

    // HTTP side: the next event, waiting at most `timeout`; nullopt when none came.
    std::optional<Event> next(std::chrono::milliseconds timeout);
    // The client went away (or its deadline passed on the HTTP side): the worker stops it.
    void cancel();
    bool cancelled() const { return cancelled_.load(); }
    // When cancel() was first called (the epoch when it was not).
    Clock::time_point cancelled_at() const {
        return Clock::time_point(Clock::duration(cancelled_at_.load()));
    }

    // Set by the worker when the first token was sent (seconds since arrival); -1 before.
    std::atomic<double> first_token_s{-1.0};
    // Set before the task is queued: the KV memory it needs at its peak on rank 0 (its cache,
    // and during its context work the chunks held besides), for the scheduler's budget.
    uint64_t kv_need = 0;

  private:
    void push(Event e);
    Kind kind_;
    std::string route_;
    Clock::time_point arrival_, deadline_;
    std::atomic<bool> cancelled_{false};
    std::atomic<Clock::rep> cancelled_at_{0};
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Event> events_;
    bool finished_ = false;
};

class TaskQueue {
  public:
    enum class Push { ok, full, closed };
    // `parallel`: requests served at once (serve.max_batch), for Retry-After.
    explicit TaskQueue(int capacity, int parallel = 1) : capacity_(capacity), parallel_(parallel) {}

    // Queues `t` unless `capacity` tasks already wait (full) or the queue was closed.
    Push push(std::shared_ptr<Task> t);
    // The oldest task, waiting at most `timeout`; nullptr on timeout, wake() or when closed
    // and empty.
    std::shared_ptr<Task> pop(std::chrono::milliseconds timeout);
    // The oldest task if `take(task)` says so (then it leaves the queue), waiting at most
    // `timeout` for one to arrive; nullptr otherwise. `take` runs under the queue's lock.
    template <typename Take>
    std::shared_ptr<Task> pop_if(std::chrono::milliseconds timeout, Take&& take) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, timeout, [&] { return !q_.empty() || woken_ || closed_; });
        woken_ = false;
        if (q_.empty() || !take(*q_.front())) return nullptr;
        std::shared_ptr<Task> t = std::move(q_.front());
        q_.pop_front();
        return t;
    }
    // Wakes a waiting pop() (a signal arrived).
    void wake();
    // No more pushes; returns the tasks still waiting (the caller answers them).
    std::vector<std::shared_ptr<Task>> close();

    int depth() const;
    int capacity() const { return capacity_; }
    // Seconds a client should wait before retrying when the queue is full: the mean service
    // time of the last requests times the tasks ahead of it, over the requests served at once;
    // at least 1, at most 60.
    int retry_after_s() const;
    void record_service_time(double s);

  private:
    int capacity_;
    int parallel_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::shared_ptr<Task>> q_;
    bool closed_ = false;
    bool woken_ = false;
    double mean_service_s_ = 1.0;
};

}  // namespace infoflow::serve
