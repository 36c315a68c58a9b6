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

void header(std::ostringstream& os, const std::string& name, const char* type, const char* help) {
    os << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
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
    : ttft_(latency_bounds()), e2e_(latency_bounds()), pipeline_ttft_(latency_bounds()) {}

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

std::string Metrics::render() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::ostringstream os;
    header(os, "infoflow_up", "gauge", "1 when the model is loaded on every rank and serving");
    os << "infoflow_up " << (ready_ ? 1 : 0) << "\n";
    header(os, "infoflow_ranks", "gauge", "MPI ranks of the server");
    os << "infoflow_ranks " << ranks_ << "\n";
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
    header(os, "infoflow_prompt_tokens_total", "counter", "prompt tokens of finished completions");
    os << "infoflow_prompt_tokens_total " << prompt_tokens_ << "\n";
    header(os, "infoflow_generated_tokens_total", "counter", "tokens generated");
    os << "infoflow_generated_tokens_total " << completion_tokens_ << "\n";
    header(os, "infoflow_cancelled_total", "counter",
           "generations ended early, by reason (client_disconnect, timeout)");
    for (const char* r : {"client_disconnect", "timeout"}) {
        const auto it = cancels_.find(r);
        os << "infoflow_cancelled_total{reason=\"" << r << "\"} "
           << (it == cancels_.end() ? 0 : it->second) << "\n";
    }
    header(os, "infoflow_queue_depth", "gauge", "requests waiting behind the running one");
    os << "infoflow_queue_depth " << queue_depth_ << "\n";
    header(os, "infoflow_queue_capacity", "gauge", "serve.queue_size");
    os << "infoflow_queue_capacity " << queue_capacity_ << "\n";
    header(os, "infoflow_store_hits_total", "counter",
           "context documents loaded from the KV store");
    os << "infoflow_store_hits_total " << store_hits_ << "\n";
    header(os, "infoflow_store_misses_total", "counter",
           "context documents prefilled because the store did not hold them");
    os << "infoflow_store_misses_total " << store_misses_ << "\n";
    header(os, "infoflow_store_added_total", "counter", "documents added to the KV store");
    os << "infoflow_store_added_total " << store_added_ << "\n";
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
