// Prometheus text rendering of the server's metrics (metrics.h).
#include "runtime/serve/metrics.h"

#include <algorithm>
#include <sstream>

namespace infoflow::serve {

namespace {

std::string num(double x) {
    std::ostringstream os;
    os.precision(9);
    os << x;
    return os.str();
}

// Latency buckets in seconds: 10 ms to 2 min.
std::vector<double> latency_bounds() {
    return {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}

// Per-token and per-step buckets in seconds: 1 ms to 10 s.
std::vector<double> step_bounds() {
    return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}

void header(std::ostream& os, const std::string& name, const char* type, const char* help) {
    os << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
}

// A metric of one value: its header and its line.
template <class T>
void scalar(std::ostream& os, const char* name, const char* type, const char* help, T value) {
    header(os, name, type, help);
    os << name << " " << value << "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double x) {
    const size_t b = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), x) - bounds_.begin());
    ++counts_[b];
    sum_ += x;
    ++count_;
}

std::string Histogram::render(const std::string& name) const {
    std::ostringstream os;
    uint64_t acc = 0;
    for (size_t i = 0; i < bounds_.size(); ++i) {
        acc += counts_[i];
        os << name << "_bucket{le=\"" << num(bounds_[i]) << "\"} " << acc << "\n";
    }
    acc += counts_.back();
    os << name << "_bucket{le=\"+Inf\"} " << acc << "\n";
    os << name << "_sum " << num(sum_) << "\n" << name << "_count " << count_ << "\n";
    return os.str();
}

Metrics::Metrics()
    : ttft_(latency_bounds()),
      e2e_(latency_bounds()),
      pipeline_ttft_(latency_bounds()),
      step_(step_bounds()),
      itl_(step_bounds()) {}

void Metrics::count_request(const std::string& route, int status) {
    std::lock_guard<std::mutex> lock(mu_);
    ++requests_[{route, status}];
}

void Metrics::observe_completion(double ttft_s, double e2e_s, int prompt_tokens,
                                 int completion_tokens) {
    std::lock_guard<std::mutex> lock(mu_);
    ttft_.observe(ttft_s);
    e2e_.observe(e2e_s);
    prompt_tokens_ += uint64_t(prompt_tokens);
    completion_tokens_ += uint64_t(completion_tokens);
}

void Metrics::observe_pipeline_ttft(double s) {
    std::lock_guard<std::mutex> lock(mu_);
    pipeline_ttft_.observe(s);
}

void Metrics::count_cancel(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    ++cancels_[reason];
}

void Metrics::count_store(int hits, int misses, int added) {
    std::lock_guard<std::mutex> lock(mu_);
    store_hits_ += uint64_t(hits);
    store_misses_ += uint64_t(misses);
    store_added_ += uint64_t(added);
}

void Metrics::count_bytes(const std::string& phase, uint64_t sent, uint64_t received) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& b = bytes_[phase];
    b.first += sent;
    b.second += received;
}

void Metrics::set_queue(int depth, int capacity) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_depth_ = depth;
    queue_capacity_ = capacity;
}

void Metrics::set_ready(bool ready, int ranks) {
    std::lock_guard<std::mutex> lock(mu_);
    ready_ = ready;
    ranks_ = ranks;
}

void Metrics::set_running(int running, int max_batch) {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = running;
    max_batch_ = max_batch;
}

void Metrics::set_kv(uint64_t in_use_bytes, uint64_t limit_bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    kv_in_use_ = in_use_bytes;
    kv_limit_ = limit_bytes;
}

void Metrics::set_buffer_pool(uint64_t held_bytes, uint64_t limit_bytes, uint64_t reused) {
    std::lock_guard<std::mutex> lock(mu_);
    pool_held_ = held_bytes;
    pool_limit_ = limit_bytes;
    pool_reused_ = reused;
}

void Metrics::set_prefix_cache(uint64_t held_bytes, uint64_t hits, uint64_t misses) {
    std::lock_guard<std::mutex> lock(mu_);
    prefix_held_ = held_bytes;
    prefix_hits_ = hits;
    prefix_misses_ = misses;
}

void Metrics::observe_decode_step(double s, int rows, bool in_prefill) {
    std::lock_guard<std::mutex> lock(mu_);
    step_.observe(s);
    ++steps_;
    step_rows_ += uint64_t(rows);
    batch_size_ = rows;
    if (rows > 1) ++batched_steps_;
    if (in_prefill) ++prefill_steps_;
}

void Metrics::observe_inter_token(double s) {
    std::lock_guard<std::mutex> lock(mu_);
    itl_.observe(s);
}

Metrics::Load Metrics::load() const {
    std::lock_guard<std::mutex> lock(mu_);
    Load l;
    l.running = running_;
    l.waiting = queue_depth_;
    l.batch_size = batch_size_;
    l.max_batch = max_batch_;
    l.kv_in_use = kv_in_use_;
    l.kv_limit = kv_limit_;
    return l;
}

void Metrics::render_batching(std::ostream& os) const {
    scalar(os, "infoflow_requests_running", "gauge",
           "requests admitted: decoding, or in their context work", running_);
    scalar(os, "infoflow_requests_waiting", "gauge", "requests queued, not yet admitted",
           queue_depth_);
    scalar(os, "infoflow_max_batch", "gauge", "serve.max_batch", max_batch_);
    scalar(os, "infoflow_batch_size", "gauge", "requests in the last decode step", batch_size_);
    scalar(os, "infoflow_kv_bytes_in_use", "gauge",
           "KV memory held by the running requests on rank 0 (a prefill at its peak)", kv_in_use_);
    scalar(os, "infoflow_kv_bytes_limit", "gauge", "serve.kv_budget_mb in bytes", kv_limit_);
    scalar(os, "infoflow_buffer_pool_bytes", "gauge",
           "freed buffers rank 0 keeps for the next request (serve.buffer_pool_mb)", pool_held_);
    scalar(os, "infoflow_buffer_pool_bytes_limit", "gauge", "serve.buffer_pool_mb in bytes",
           pool_limit_);
    scalar(os, "infoflow_buffer_pool_reused_total", "counter",
           "allocations served from the pool instead of new memory", pool_reused_);
    scalar(os, "infoflow_prefix_cache_bytes", "gauge",
           "chunk-0 K/V rank 0 keeps across requests (serve.prefix_cache_mb)", prefix_held_);
    scalar(os, "infoflow_prefix_cache_hits_total", "counter",
           "requests whose chunk 0 was copied from the prefix cache", prefix_hits_);
    scalar(os, "infoflow_prefix_cache_misses_total", "counter",
           "requests whose chunk 0 was prefilled", prefix_misses_);
    header(os, "infoflow_decode_step_seconds", "histogram",
           "time of one decode step over every decoding request");
    os << step_.render("infoflow_decode_step_seconds");
    scalar(os, "infoflow_decode_steps_total", "counter", "decode steps", steps_);
    scalar(os, "infoflow_decode_rows_total", "counter",
           "request rows over all decode steps (rows / steps = the mean batch size)", step_rows_);
    scalar(os, "infoflow_decode_steps_batched_total", "counter",
           "decode steps over more than one request", batched_steps_);
    scalar(os, "infoflow_decode_steps_in_prefill_total", "counter",
           "decode steps run between two pieces of a request's context work", prefill_steps_);
    header(os, "infoflow_inter_token_latency_seconds", "histogram",
           "time between two consecutive tokens of a request");
    os << itl_.render("infoflow_inter_token_latency_seconds");
}

std::string Metrics::render() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::ostringstream os;
    scalar(os, "infoflow_up", "gauge", "1 when the model is loaded on every rank and serving",
           (ready_ ? 1 : 0));
    scalar(os, "infoflow_ranks", "gauge", "MPI ranks of the server", ranks_);
    header(os, "infoflow_requests_total", "counter", "HTTP requests by route and status code");
    for (const auto& [k, n] : requests_) {
        os << "infoflow_requests_total{route=\"" << k.first << "\",status=\"" << k.second << "\"} "
           << n << "\n";
    }
    header(os, "infoflow_ttft_seconds", "histogram",
           "arrival of a completion request to its first token (queue included)");
    os << ttft_.render("infoflow_ttft_seconds");
    header(os, "infoflow_pipeline_ttft_seconds", "histogram",
           "a request's time to first token in the pipeline (the answer job's TTFT, no queue)");
    os << pipeline_ttft_.render("infoflow_pipeline_ttft_seconds");
    header(os, "infoflow_request_duration_seconds", "histogram",
           "arrival of a completion request to its last token");
    os << e2e_.render("infoflow_request_duration_seconds");
    scalar(os, "infoflow_prompt_tokens_total", "counter", "prompt tokens of finished completions",
           prompt_tokens_);
    scalar(os, "infoflow_generated_tokens_total", "counter", "tokens generated",
           completion_tokens_);
    header(os, "infoflow_cancelled_total", "counter",
           "generations ended early, by reason (client_disconnect, timeout)");
    for (const char* r : {"client_disconnect", "timeout"}) {
        const auto it = cancels_.find(r);
        os << "infoflow_cancelled_total{reason=\"" << r << "\"} "
           << (it == cancels_.end() ? 0 : it->second) << "\n";
    }
    scalar(os, "infoflow_queue_depth", "gauge", "requests queued, not yet admitted", queue_depth_);
    render_batching(os);
    scalar(os, "infoflow_queue_capacity", "gauge", "serve.queue_size", queue_capacity_);
    scalar(os, "infoflow_store_hits_total", "counter", "context documents loaded from the KV store",
           store_hits_);
    scalar(os, "infoflow_store_misses_total", "counter",
           "context documents prefilled because the store did not hold them", store_misses_);
    scalar(os, "infoflow_store_added_total", "counter", "documents added to the KV store",
           store_added_);
    header(os, "infoflow_bytes_moved_total", "counter",
           "bytes the ranks sent and received, by phase (all ranks summed)");
    for (const auto& [phase, b] : bytes_) {
        os << "infoflow_bytes_moved_total{phase=\"" << phase << "\",direction=\"sent\"} " << b.first
           << "\n";
        os << "infoflow_bytes_moved_total{phase=\"" << phase << "\",direction=\"received\"} "
           << b.second << "\n";
    }
    return os.str();
}

}  // namespace infoflow::serve
