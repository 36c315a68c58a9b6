// What the parts of job serve share on rank 0 (docs/serve.md): the config, the ranks, the
// session once loaded, the task queue the HTTP threads fill, the scheduler that admits from it,
// the metrics, and the two kinds of task. The HTTP side is serve_http.h, the worker that runs the
// tasks serve_engine.h, the wiring serve.cpp.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/config/config.h"
#include "runtime/jobs/serve_request.h"
#include "runtime/serve/api.h"
#include "runtime/serve/http_server.h"
#include "runtime/serve/metrics.h"
#include "runtime/serve/scheduler.h"
#include "runtime/serve/task.h"

namespace infoflow {

class Communicator;
class ChatTemplate;
struct Session;

struct ServeState {
    ServeState(const Config& c, Communicator& cm)
        : cfg(c),
          comm(cm),
          queue(c.serve.queue_size, c.serve.max_batch),
          sched(c.serve.max_batch, uint64_t(c.serve.kv_budget_mb) << 20, queue, metrics) {}

    const Config& cfg;
    Communicator& comm;
    Session* s = nullptr;  // set once the model is loaded
    serve::TaskQueue queue;
    serve::Metrics metrics;
    serve::Scheduler sched;  // the worker's alone
    std::unique_ptr<serve::HttpFrontend> http;
    std::atomic<bool> ready{false};
    // When the heartbeat in progress started (0 = none running), for /health.
    std::atomic<int64_t> heartbeat_started_ns{0};
    int port = 0;
};

struct CompletionTask : serve::Task {
    CompletionTask(const std::string& route, double timeout_s)
        : Task(Kind::completion, route, timeout_s) {}
    serve::CompletionRequest req;
    PlannedRequest plan;
    serve::ResponseHead head;
};

struct DocumentsTask : serve::Task {
    explicit DocumentsTask(double timeout_s) : Task(Kind::documents, "/v1/documents", timeout_s) {}
    PlannedRequest plan;
};

}  // namespace infoflow
