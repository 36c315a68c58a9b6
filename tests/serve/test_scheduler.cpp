// The scheduler of job serve without a model (runtime/serve/scheduler.h): first come, first
// served admission under serve.max_batch and the KV budget (nothing overtakes a waiting request,
// so none starves), tasks that left or expired handed out at once without a slot, the memory
// counted as resize/release say, and the batching gauges of /metrics. A random workload checks
// the budget and the batch limit are never exceeded and every task is admitted in arrival order.
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/serve/metrics.h"
#include "runtime/serve/scheduler.h"
#include "runtime/serve/task.h"

using namespace infoflow::serve;
using std::chrono::milliseconds;

namespace {

std::shared_ptr<Task> task(uint64_t kv, double timeout_s = 60) {
    auto t = std::make_shared<Task>(Task::Kind::completion, "/v1/chat/completions", timeout_s);
    t->kv_need = kv;
    return t;
}

}  // namespace

TEST_CASE("scheduler: first come, first served under max_batch and the KV budget", "[cpu][serve]") {
    TaskQueue q(8, 2);
    Metrics m;
    Scheduler s(2, 100, q, m);
    auto a = task(60), b = task(30), c = task(50), d = task(10);
    for (auto& t : {a, b, c, d}) REQUIRE(q.push(t) == TaskQueue::Push::ok);
    CHECK(s.admit(milliseconds(1)) == a);
    CHECK(s.admit(milliseconds(1)) == b);        // 90 of 100 in use, 2 running
    CHECK(s.admit(milliseconds(1)) == nullptr);  // max_batch
    CHECK(s.running() == 2);
    CHECK(s.kv_in_use() == 90);
    s.release(*b);
    // c needs 50: 60 + 50 > 100, so c waits -- and d (10, which would fit) waits behind it.
    CHECK(s.admit(milliseconds(1)) == nullptr);
    CHECK(q.depth() == 2);
    s.resize(*a, 40);  // a's prefill ended: its cache alone
    CHECK(s.kv_in_use() == 40);
    CHECK(s.admit(milliseconds(1)) == c);
    CHECK(s.admit(milliseconds(1)) == nullptr);  // max_batch again
    s.release(*a);
    CHECK(s.admit(milliseconds(1)) == d);
    CHECK(s.kv_in_use() == 60);
    const std::string t = m.render();
    CHECK(t.find("infoflow_requests_running 2\n") != std::string::npos);
    CHECK(t.find("infoflow_kv_bytes_in_use 60\n") != std::string::npos);
    CHECK(t.find("infoflow_kv_bytes_limit 100\n") != std::string::npos);
    CHECK(t.find("infoflow_max_batch 2\n") != std::string::npos);
    CHECK(s.fits_budget(100));
    CHECK_FALSE(s.fits_budget(101));
}

TEST_CASE("scheduler: a task that left or expired is handed out without a slot", "[cpu][serve]") {
    TaskQueue q(8);
    Metrics m;
    Scheduler s(1, 100, q, m);
    auto a = task(100), gone = task(100), late = task(100, 0.001), b = task(100);
    for (auto& t : {a, gone, late, b}) REQUIRE(q.push(t) == TaskQueue::Push::ok);
    CHECK(s.admit(milliseconds(1)) == a);
    gone->cancel();
    std::this_thread::sleep_for(milliseconds(5));  // past late's deadline
    CHECK(s.admit(milliseconds(1)) == gone);       // the batch is full, but gone takes no work
    s.release(*gone);
    CHECK(s.admit(milliseconds(1)) == late);
    s.release(*late);
    CHECK(s.admit(milliseconds(1)) == nullptr);  // b waits for a
    CHECK(s.running() == 1);
    s.release(*a);
    CHECK(s.admit(milliseconds(1)) == b);
}

TEST_CASE("scheduler: a random workload never exceeds the limits and keeps arrival order",
          "[cpu][serve]") {
    std::mt19937 rng(7);
    for (int round = 0; round < 20; ++round) {
        const int max_batch = 1 + int(rng() % 4);
        const uint64_t budget = 100;
        TaskQueue q(1000, max_batch);
        Metrics m;
        Scheduler s(max_batch, budget, q, m);
        std::vector<std::shared_ptr<Task>> all, running;
        for (int i = 0; i < 60; ++i) {
            all.push_back(task(1 + rng() % budget));
            REQUIRE(q.push(all.back()) == TaskQueue::Push::ok);
        }
        size_t next = 0;
        while (next < all.size() || !running.empty()) {
            while (auto t = s.admit(milliseconds(0))) {
                REQUIRE(t == all[next]);  // arrival order
                ++next;
                running.push_back(t);
                CHECK(s.running() <= max_batch);
                CHECK(s.kv_in_use() <= budget);
            }
            REQUIRE(!running.empty());  // the head always fits an empty server
            const size_t k = rng() % running.size();
            if (rng() % 3 == 0) s.resize(*running[k], running[k]->kv_need / 2);
            s.release(*running[k]);
            running.erase(running.begin() + long(k));
        }
        CHECK(s.kv_in_use() == 0);
    }
}

TEST_CASE("Retry-After accounts for the requests served at once", "[cpu][serve]") {
    TaskQueue one(100, 1), eight(100, 8);
    for (int i = 0; i < 20; ++i) {
        one.record_service_time(4.0);
        eight.record_service_time(4.0);
        REQUIRE(one.push(task(1)) == TaskQueue::Push::ok);
        REQUIRE(eight.push(task(1)) == TaskQueue::Push::ok);
    }
    CHECK(one.retry_after_s() == 60);  // capped
    CHECK(eight.retry_after_s() >= 9);
    CHECK(eight.retry_after_s() <= 11);  // ~4 s x 21 / 8
}

TEST_CASE("metrics: decode steps, inter-token latency and the load /health repeats",
          "[cpu][serve]") {
    Metrics m;
    m.observe_decode_step(0.02, 3, false);
    m.observe_decode_step(0.04, 5, true);
    m.observe_inter_token(0.003);
    m.set_running(6, 16);
    m.set_queue(2, 16);
    m.set_kv(1000, 5000);
    const std::string t = m.render();
    CHECK(t.find("infoflow_decode_steps_total 2\n") != std::string::npos);
    CHECK(t.find("infoflow_decode_rows_total 8\n") != std::string::npos);
    CHECK(t.find("infoflow_decode_steps_in_prefill_total 1\n") != std::string::npos);
    CHECK(t.find("infoflow_batch_size 5\n") != std::string::npos);
    CHECK(t.find("infoflow_decode_step_seconds_bucket{le=\"0.025\"} 1\n") != std::string::npos);
    CHECK(t.find("infoflow_inter_token_latency_seconds_bucket{le=\"0.0025\"} 0\n") !=
          std::string::npos);
    CHECK(t.find("infoflow_inter_token_latency_seconds_bucket{le=\"0.005\"} 1\n") !=
          std::string::npos);
    CHECK(t.find("infoflow_requests_waiting 2\n") != std::string::npos);
    const Metrics::Load l = m.load();
    CHECK(l.running == 6);
    CHECK(l.waiting == 2);
    CHECK(l.batch_size == 5);
    CHECK(l.max_batch == 16);
    CHECK(l.kv_in_use == 1000);
    CHECK(l.kv_limit == 5000);
}
