// The HTTP side of job `serve` (docs/serve.md) on cpp-httplib: routes, the API key, body limits,
// queueing with 429, waiting on a task and streaming its events as server-sent events, the
// OpenAI error object for every failure, and /health, /metrics, /v1/models. Runs on its own
// threads on rank 0 and never touches the model or the communicator: what needs them goes to
// the ServeBackend (runtime/jobs/serve.cpp) or through the queue to the worker.
#pragma once

#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/serve/api.h"
#include "runtime/serve/metrics.h"
#include "runtime/serve/task.h"

namespace infoflow::serve {

// What the HTTP side asks of the job. Called from HTTP threads (must be thread-safe).
class ServeBackend {
  public:
    virtual ~ServeBackend() = default;
    // Checks a parsed request against the model (window, tokens) and makes its task, not yet
    // queued. Throws ApiError.
    virtual std::shared_ptr<Task> make_completion(CompletionRequest req) = 0;
    virtual std::shared_ptr<Task> make_documents(std::vector<std::string> docs) = 0;
    // GET /v1/documents/{key}: status and body.
    virtual std::pair<int, nlohmann::json> document_status(const std::string& key) = 0;
    virtual nlohmann::json models() = 0;
    // GET /health: 200 when ready; 503 while loading, draining, or when a rank stopped
    // answering.
    virtual std::pair<int, nlohmann::json> health() = 0;
};

struct HttpOptions {
    std::string host = "127.0.0.1";
    int port = 8080;      // 0 = any free port
    std::string api_key;  // "" = no key needed
    size_t max_body_bytes = 8 << 20;
    int threads = 32;
    Limits limits;
};

class HttpFrontend {
  public:
    HttpFrontend(HttpOptions opt, ServeBackend& backend, TaskQueue& queue, Metrics& metrics);
    ~HttpFrontend();
    HttpFrontend(const HttpFrontend&) = delete;
    HttpFrontend& operator=(const HttpFrontend&) = delete;

    // Binds host:port (throws infoflow::Error naming them when it cannot) and serves on a
    // thread of its own. Returns the bound port.
    int start();
    // From now on requests to the API get 503 (the server drains); /health says so.
    void set_draining() { draining_ = true; }
    bool draining() const { return draining_.load(); }
    // Waits (at most 30 s) for the streamed responses in hand to be written, then stops
    // listening and waits for the connections in hand to finish.
    void stop();

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    std::atomic<bool> draining_{false};
};

// True for an address only this machine reaches: 127.0.0.0/8, ::1, "localhost".
bool is_loopback_host(const std::string& host);

}  // namespace infoflow::serve
