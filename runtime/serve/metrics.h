// The server's counters, gauges and histograms (GET /metrics, Prometheus text format 0.0.4).
// Thread-safe: HTTP threads count requests by status, the worker counts what a request did.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace infoflow::serve {

// A cumulative histogram with fixed upper bounds (seconds).
class Histogram {
  public:
    explicit Histogram(std::vector<double> bounds);
    void observe(double x);
    // Prometheus lines of `name` (buckets with le, _sum, _count).
    std::string render(const std::string& name) const;
    uint64_t count() const { return count_; }

  private:
    std::vector<double> bounds_;
    std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = +Inf
    double sum_ = 0.0;
    uint64_t count_ = 0;
};

class Metrics {
  public:
    Metrics();
    // One finished HTTP request: its route ("/v1/chat/completions") and status.
    void count_request(const std::string& route, int status);
    // A completion that ran: time from arrival to the first token and to the last, tokens.
    void observe_completion(double ttft_s, double e2e_s, int prompt_tokens, int completion_tokens);
    // A generation ended early: "client_disconnect" | "timeout".
    void count_cancel(const std::string& reason);
    // Context documents found in the store (loaded) and not found (prefilled).
    void count_store(int hits, int misses, int added);
    // Bytes the ranks moved in one request's phase (all ranks summed).
    void count_bytes(const std::string& phase, uint64_t sent, uint64_t received);
    void set_queue(int depth, int capacity);
    void set_ready(bool ready, int ranks);
    // A request's pipeline TTFT (the `answer` job's measure, queue excluded).
    void observe_pipeline_ttft(double s);
    // Batching (docs/serve.md "Batching"): the requests admitted (running: decoding or in their
    // context work) and serve.max_batch; the KV memory they hold and serve.kv_budget_mb.
    void set_running(int running, int max_batch);
    void set_kv(uint64_t in_use_bytes, uint64_t limit_bytes);
    // Rank 0's pool of freed buffers (serve.buffer_pool_mb): held, its limit, reuses so far.
    void set_buffer_pool(uint64_t held_bytes, uint64_t limit_bytes, uint64_t reused);
    // Rank 0's prefix cache (serve.prefix_cache_mb): bytes held, chunk 0s copied, prefilled.
    void set_prefix_cache(uint64_t held_bytes, uint64_t hits, uint64_t misses);
    // One decode step over `rows` requests that took `s` seconds; `in_prefill`: run between two
    // pieces of a request's context work.
    void observe_decode_step(double s, int rows, bool in_prefill);
    // The time between two tokens of one request, as the server produced them.
    void observe_inter_token(double s);
    // The gauges /health repeats: running, waiting, the last step's batch size, KV in use.
    struct Load {
        int running = 0, waiting = 0, batch_size = 0, max_batch = 0;
        uint64_t kv_in_use = 0, kv_limit = 0;
    };
    Load load() const;

    std::string render() const;

  private:
    void render_batching(std::ostream& os) const;  // mu_ held

    mutable std::mutex mu_;
    std::map<std::pair<std::string, int>, uint64_t> requests_;
    std::map<std::string, uint64_t> cancels_;
    std::map<std::string, std::pair<uint64_t, uint64_t>> bytes_;  // phase -> sent, received
    Histogram ttft_, e2e_, pipeline_ttft_, step_, itl_;
    uint64_t steps_ = 0, step_rows_ = 0, prefill_steps_ = 0, batched_steps_ = 0;
    int running_ = 0, max_batch_ = 0, batch_size_ = 0;
    uint64_t kv_in_use_ = 0, kv_limit_ = 0;
    uint64_t pool_held_ = 0, pool_limit_ = 0, pool_reused_ = 0;
    uint64_t prefix_held_ = 0, prefix_hits_ = 0, prefix_misses_ = 0;
    uint64_t prompt_tokens_ = 0, completion_tokens_ = 0;
    uint64_t store_hits_ = 0, store_misses_ = 0, store_added_ = 0;
    int queue_depth_ = 0, queue_capacity_ = 0;
    bool ready_ = false;
    int ranks_ = 0;
};

}  // namespace infoflow::serve
