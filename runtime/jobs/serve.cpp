// job = "serve" (docs/serve.md): the OpenAI-compatible server over the sequence-parallel runtime.
//
// Rank 0 runs the HTTP frontend (runtime/serve/http_server.h) on threads of its own; its main
// thread is the worker, the only thread that computes or talks to the other ranks (MPI is
// initialized FUNNELED). The worker takes one task at a time from the bounded FIFO queue and
// tells every rank what to do with one collective "command" (an all-reduce of three int64s:
// command, payload bytes, and a drain flag any rank may raise), followed for a request by the
// broadcast of its config and tokens; then every rank runs the request through the same
// pipeline as job `answer` (answer_request). Ranks > 0 do nothing but wait for the next command.
//
// Idle ranks and the watchdog: while no task comes, the worker sends a heartbeat command every
// serve.heartbeat_s (< parallel.timeout_s), so a waiting rank's collective always completes
// before its deadline; and because an all-reduce needs every rank, a rank that died while idle
// leaves rank 0's heartbeat waiting: /health turns 503 at once, and the watchdog ends the job
// (non-zero, naming the rank) when parallel.timeout_s has passed.
//
// Signals: SIGTERM or SIGINT stops accepting (API requests get 503), finishes the request in
// flight, answers the queued ones 503, tells every rank to stop, and the job exits 0; a second
// signal exits at once (128 + signal). A signal to any rank drains the whole server.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/fs.h"
#include "runtime/core/progress.h"
#include "runtime/formats/chat_template.h"
#include "runtime/jobs/jobs.h"
#include "runtime/jobs/serve_request.h"
#include "runtime/jobs/session.h"
#include "runtime/method/chunk_store.h"
#include "runtime/serve/http_server.h"
#include "runtime/store/kv_store.h"

namespace infoflow {

using nlohmann::json;
using serve::ApiError;
using serve::Clock;

namespace {

// ---- signals --------------------------------------------------------------------------------

std::atomic<int> g_signal{0};  // the first SIGTERM / SIGINT received (0: none)
char g_signal_line[96];

extern "C" void on_serve_signal(int sig) {
    if (g_signal.load() != 0) ::_exit(128 + sig);  // a second signal: stop now
    g_signal.store(sig);
    ssize_t ignored = ::write(STDERR_FILENO, g_signal_line, std::strlen(g_signal_line));
    (void)ignored;
}

void install_drain_handlers(int rank, int size) {
    std::snprintf(g_signal_line, sizeof g_signal_line,
                  "[rank %d/%d] signal received: draining (a second one stops at once)\n", rank,
                  size);
    struct sigaction sa {};
    sa.sa_handler = on_serve_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    std::signal(SIGPIPE, SIG_IGN);  // a client that hangs up is an error code, not a signal
}

// ---- the rank protocol ------------------------------------------------------------------------

enum Command : int64_t { k_heartbeat = 0, k_completion = 1, k_documents = 2, k_shutdown = 3 };

struct CommandWord {
    int64_t command = k_heartbeat;
    int64_t bytes = 0;
    bool drain = false;  // some rank received a signal
};

// Collective: rank 0's command and payload size reach every rank; the drain flag is any rank's.
CommandWord exchange_command(Communicator& comm, int64_t command, int64_t bytes) {
    int64_t w[3] = {comm.rank() == 0 ? command : 0, comm.rank() == 0 ? bytes : 0,
                    g_signal.load() != 0 ? 1 : 0};
    PhaseScope scope(comm, "serve");
    comm.all_reduce(w, 3, DType::i64, ReduceOp::max);
    return {w[0], w[1], w[2] != 0};
}

std::vector<uint8_t> broadcast_payload(Communicator& comm, std::vector<uint8_t> bytes, int64_t n) {
    bytes.resize(size_t(n));
    PhaseScope scope(comm, "serve");
    comm.broadcast(bytes.data(), bytes.size(), 0);
    return bytes;
}

// ---- tasks ----------------------------------------------------------------------------------

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

double ms_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

// Rank 0's view of one generation: each token becomes a stream chunk (text held back while it
// could begin a stop string or ends inside a UTF-8 sequence); a stop string, a client that went
// away or the deadline ends it.
struct Generation {
    CompletionTask& task;
    const Tokenizer& tok;
    serve::TextStreamer streamer;
    std::vector<int32_t> ids;
    bool sent_first = false;
    std::string ended;  // "", "client_disconnect", "timeout"

    Generation(CompletionTask& t, const Tokenizer& tk) : task(t), tok(tk), streamer(t.req.stop) {}

    bool on_token(int32_t id) {
        if (ids.empty()) task.first_token_s = task.seconds_since_arrival();
        if (task.past_deadline()) {
            ended = "timeout";
            return false;
        }
        if (task.cancelled()) {
            ended = "client_disconnect";
            return false;
        }
        ids.push_back(id);
        const std::string delta = streamer.update(tok.decode(ids));
        if (task.req.stream && (!sent_first || !delta.empty())) {
            task.send_chunk(serve::stream_chunk(task.head, delta, !sent_first, ""));
            sent_first = true;
        }
        return !streamer.stop_hit();
    }
};

class Server final : public serve::ServeBackend {
  public:
    Server(const Config& cfg, Communicator& comm)
        : cfg_(cfg), comm_(comm), queue_(cfg.serve.queue_size) {
        std::random_device rd;
        id_salt_ = (uint64_t(rd()) << 32) ^ rd();
        created_ = int64_t(std::time(nullptr));
    }

    // Rank 0, before the model is loaded: the API key and the address rule, then listen.
    void listen() {
        serve::HttpOptions o;
        o.host = cfg_.serve.host;
        o.port = cfg_.serve.port;
        o.api_key = resolve_api_key();
        if (!serve::is_loopback_host(o.host) && o.api_key.empty()) {
            IF_CHECK(cfg_.serve.allow_unauthenticated,
                     "serve.host = '" << o.host
                                      << "' is not a loopback address: set an API key "
                                         "(serve.api_key, or the environment variable named by "
                                         "serve.api_key_env = '"
                                      << cfg_.serve.api_key_env
                                      << "'), or serve.allow_unauthenticated = true to serve "
                                         "it without one");
        }
        o.max_body_bytes = size_t(cfg_.serve.max_body_bytes);
        o.threads = cfg_.serve.http_threads;
        o.limits.max_tokens = cfg_.serve.max_tokens;
        http_ = std::make_unique<serve::HttpFrontend>(o, *this, queue_, metrics_);
        port_ = http_->start();
        metrics_.set_queue(0, queue_.capacity());
        std::printf(
            "serve      : listening on http://%s:%d (rank 0 pid %d; loading the model, "
            "/health is 503 until it is ready)\n",
            o.host.c_str(), port_, int(::getpid()));
        std::fflush(stdout);
    }

    // Every rank, after the model is loaded.
    void set_session(Session& s) {
        s_ = &s;
        if (comm_.rank() != 0) return;
        raw_chat_ = std::make_unique<ChatTemplate>(s.tok(), "raw");
        model_name_ = cfg_.serve.model_name;
        if (model_name_.empty()) {
            model_name_ = s.weights->source;
            const size_t slash = model_name_.find_last_of('/');
            if (slash != std::string::npos) model_name_ = model_name_.substr(slash + 1);
        }
    }

    // Every rank: opening the store once at start-up refuses a missing or foreign store now,
    // not on every request.
    void check_store() {
        if (cfg_.store.path.empty()) return;
        const bool writable = cfg_.store.mode == Config::StoreMode::read_write;
        open_store_for(*s_->model, hex64(s_->tok().fingerprint()), cfg_, writable);
    }

    void set_ready() {
        ready_ = true;
        metrics_.set_ready(true, comm_.size());
        std::printf("serve      : ready: model %s on %d rank%s (queue %d, max_tokens %d)%s\n",
                    model_name_.c_str(), comm_.size(), comm_.size() > 1 ? "s" : "",
                    queue_.capacity(), cfg_.serve.max_tokens,
                    cfg_.store.path.empty() ? "" : (", store " + cfg_.store.path).c_str());
        std::fflush(stdout);
    }

    json worker();    // rank 0
    void follower();  // ranks > 0

    // ---- ServeBackend (HTTP threads) ----
    std::shared_ptr<serve::Task> make_completion(serve::CompletionRequest req) override;
    std::shared_ptr<serve::Task> make_documents(std::vector<std::string> docs) override;
    std::pair<int, json> document_status(const std::string& key) override;
    json models() override;
    std::pair<int, json> health() override;

  private:
    std::string resolve_api_key() const {
        if (!cfg_.serve.api_key.empty()) return cfg_.serve.api_key;
        if (cfg_.serve.api_key_env.empty()) return {};
        const char* v = std::getenv(cfg_.serve.api_key_env.c_str());
        return v ? std::string(v) : std::string();
    }
    void check_ready() const {
        if (!ready_) throw ApiError(503, "the model is still loading", "", "loading");
    }
    std::string next_id(serve::Endpoint e) {
        const uint64_t n = ++request_count_;
        return std::string(e == serve::Endpoint::chat ? "chatcmpl-" : "cmpl-") +
               hex64(id_salt_ ^ (n * 0x9E3779B97F4A7C15ull)) + std::to_string(n);
    }
    void heartbeat();
    void drain();
    void run_task(const std::shared_ptr<serve::Task>& t);
    void run_completion(CompletionTask& t);
    void respond(CompletionTask& t, const MethodResult& r, Generation& g, double queue_ms);
    // Rank 0's side of a command; a drain flag raised by another rank starts the drain here.
    void command(int64_t c, std::vector<uint8_t> payload);
    void run_documents(DocumentsTask& t);
    // Every rank: the work a command carries.
    MethodResult execute_completion(const Config& cfg, const PreparedRequest& req,
                                    const RunHooks& hooks);

    const Config& cfg_;
    Communicator& comm_;
    Session* s_ = nullptr;
    std::unique_ptr<ChatTemplate> raw_chat_;
    std::string model_name_;
    serve::TaskQueue queue_;
    serve::Metrics metrics_;
    std::unique_ptr<serve::HttpFrontend> http_;
    int port_ = 0;
    std::atomic<bool> ready_{false};
    std::atomic<uint64_t> request_count_{0};
    uint64_t id_salt_ = 0;
    int64_t created_ = 0;
    // Heartbeat state for /health: when the one in progress started (0 = none running).
    std::atomic<int64_t> heartbeat_started_ns_{0};
    uint64_t served_ = 0;
};

// ---- HTTP side ------------------------------------------------------------------------------

std::shared_ptr<serve::Task> Server::make_completion(serve::CompletionRequest req) {
    check_ready();
    auto t = std::make_shared<CompletionTask>(serve::endpoint_path(req.endpoint),
                                              cfg_.serve.request_timeout_s);
    t->plan = plan_completion(cfg_, *s_, *raw_chat_, req);
    t->head.endpoint = req.endpoint;
    t->head.id = next_id(req.endpoint);
    t->head.created = int64_t(std::time(nullptr));
    t->head.model = model_name_;
    t->req = std::move(req);
    return t;
}

std::shared_ptr<serve::Task> Server::make_documents(std::vector<std::string> docs) {
    check_ready();
    if (cfg_.store.path.empty()) {
        throw ApiError(400, "this server has no document store (start it with store.path set)", "",
                       "no_store");
    }
    if (cfg_.store.mode != Config::StoreMode::read_write) {
        throw ApiError(403, "the document store is read-only (store.mode = \"read\")", "",
                       "store_read_only", "permission_error");
    }
    auto t = std::make_shared<DocumentsTask>(cfg_.serve.request_timeout_s);
    t->plan = plan_documents(cfg_, *s_, docs);
    return t;
}

std::pair<int, json> Server::document_status(const std::string& key) {
    check_ready();
    if (cfg_.store.path.empty()) {
        throw ApiError(400, "this server has no document store (start it with store.path set)", "",
                       "no_store");
    }
    // A reader of the committed index (HDF5 here is thread-safe; readers never block writers).
    std::unique_ptr<KvStore> store =
        open_store_for(*s_->model, hex64(s_->tok().fingerprint()), cfg_, false);
    if (!store->contains(key)) {
        throw ApiError(404, "document " + key + " is not in the store", "key",
                       "document_not_found");
    }
    return {200, json{{"object", "document"},
                      {"key", key},
                      {"stored", true},
                      {"bytes", store->document_bytes(key)}}};
}

json Server::models() {
    json m = {{"id", model_name_.empty() ? cfg_.serve.model_name : model_name_},
              {"object", "model"},
              {"created", created_},
              {"owned_by", "infoflow_sp"}};
    if (ready_) {
        m["infoflow"] = {
            {"ranks", comm_.size()},
            {"context_window", s_->model->config().n_ctx_train},
            {"methods", serve::served_methods()},
            {"default_method", to_string(cfg_.method.name)},
            {"store", cfg_.store.path.empty() ? json(nullptr) : json(cfg_.store.path)}};
    }
    return {{"object", "list"}, {"data", json::array({m})}};
}

std::pair<int, json> Server::health() {
    if (!ready_) return {503, json{{"status", "loading"}}};
    const int64_t started = heartbeat_started_ns_.load();
    if (started != 0) {
        const double waited = double(Clock::now().time_since_epoch().count() - started) / 1e9;
        // A heartbeat is one small all-reduce: still waiting after a heartbeat period means a
        // rank stopped answering (the watchdog ends the job at parallel.timeout_s).
        if (waited > std::max(1.0, cfg_.serve.heartbeat_s)) {
            char msg[200];
            std::snprintf(msg, sizeof msg,
                          "a rank has not answered the heartbeat for %.1f s (the job ends when "
                          "parallel.timeout_s = %g s has passed)",
                          waited, cfg_.parallel.timeout_s);
            return {503, json{{"status", "error"}, {"message", msg}}};
        }
    }
    return {200, json{{"status", "ok"},
                      {"ranks", comm_.size()},
                      {"queue_depth", queue_.depth()},
                      {"model", model_name_}}};
}

// ---- rank 0's worker ------------------------------------------------------------------------

void Server::command(int64_t c, std::vector<uint8_t> payload) {
    const int64_t n = int64_t(payload.size());
    const CommandWord w = exchange_command(comm_, c, n);
    if (w.drain && g_signal.load() == 0) g_signal.store(SIGTERM);  // another rank was signalled
    if (n > 0) broadcast_payload(comm_, std::move(payload), n);
}

void Server::heartbeat() {
    heartbeat_started_ns_ = Clock::now().time_since_epoch().count();
    command(k_heartbeat, {});
    heartbeat_started_ns_ = 0;
}

json Server::worker() {
    const auto idle = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::duration<double>(comm_.size() > 1 ? cfg_.serve.heartbeat_s : 0.2));
    // Signals arrive on any thread; this one notices them within a poll and turns the HTTP side
    // to draining at once, even while a request is running.
    std::atomic<bool> done{false};
    std::thread watcher([&] {
        while (!done) {
            if (g_signal.load() != 0) {
                http_->set_draining();
                queue_.wake();
                return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    });
    try {
        auto last_heartbeat = Clock::now();
        while (g_signal.load() == 0) {
            std::shared_ptr<serve::Task> t = queue_.pop(idle);
            metrics_.set_queue(queue_.depth(), queue_.capacity());
            if (t) {
                run_task(t);
            }
            // Between tasks too: a long burst of requests must not starve the idle ranks' check.
            if (comm_.size() > 1 && g_signal.load() == 0 &&
                (!t || Clock::now() - last_heartbeat > idle)) {
                heartbeat();
                last_heartbeat = Clock::now();
            }
        }
    } catch (...) {
        done = true;
        watcher.join();
        throw;
    }
    done = true;
    watcher.join();
    drain();
    return json{{"job", "serve"}, {"requests", served_}, {"port", port_}};
}

void Server::drain() {
    http_->set_draining();
    for (const auto& t : queue_.close()) {
        t->fail(ApiError(503, "the server is shutting down", "", "shutting_down"));
    }
    if (comm_.size() > 1) command(k_shutdown, {});
    http_->stop();  // the connections in hand (the last responses) finish first
    std::printf("serve      : stopped after %llu requests\n", (unsigned long long)served_);
    std::fflush(stdout);
}

void Server::run_task(const std::shared_ptr<serve::Task>& t) {
    if (t->cancelled()) return;  // the client went away while it waited
    if (t->past_deadline()) {
        metrics_.count_cancel("timeout");
        t->fail(ApiError(504,
                         "the request waited longer than serve.request_timeout_s = " +
                             json(cfg_.serve.request_timeout_s).dump() + " s in the queue",
                         "", "timeout"));
        return;
    }
    const auto t0 = Clock::now();
    if (t->kind() == serve::Task::Kind::completion) {
        run_completion(static_cast<CompletionTask&>(*t));
    } else {
        run_documents(static_cast<DocumentsTask&>(*t));
    }
    ++served_;
    queue_.record_service_time(std::chrono::duration<double>(Clock::now() - t0).count());
}

MethodResult Server::execute_completion(const Config& cfg, const PreparedRequest& req,
                                        const RunHooks& hooks) {
    return answer_request(cfg, *s_, req, hooks);
}

void Server::run_completion(CompletionTask& t) {
    const double queue_ms = ms_between(t.arrival(), Clock::now());
    if (comm_.size() > 1) command(k_completion, encode_work(t.plan.cfg, t.plan.prepared));
    Generation g(t, s_->tok());
    RunHooks hooks;
    hooks.on_token = [&g](int32_t id) { return g.on_token(id); };
    MethodResult r;
    try {
        r = execute_completion(t.plan.cfg, t.plan.prepared, hooks);
    } catch (const std::exception& e) {
        t.fail(ApiError(500, std::string("the request failed: ") + e.what(), "", "internal_error"));
        // On P ranks the others may be anywhere in the pipeline: end the job (abort_job names
        // the error) rather than leave a rank waiting. One rank has no one to wait for.
        if (comm_.size() > 1) throw;
        std::fprintf(stderr, "[serve] request %s failed: %s\n", t.head.id.c_str(), e.what());
        return;
    }
    if (!g.ended.empty()) {
        metrics_.count_cancel(g.ended);
        if (g.ended == "timeout") {
            t.fail(ApiError(504,
                            "the request took longer than serve.request_timeout_s = " +
                                json(cfg_.serve.request_timeout_s).dump() + " s",
                            "", "timeout"));
        } else {
            t.fail(ApiError(499, "the client closed the connection", "", "client_closed"));
        }
        return;
    }
    const double server_ttft_ms =
        g.ids.empty() ? ms_between(t.arrival(), Clock::now()) : t.first_token_s * 1000.0;
    respond(t, r, g, queue_ms);
    const PlannedRequest& p = t.plan;
    metrics_.observe_completion(server_ttft_ms / 1000.0, t.seconds_since_arrival(),
                                r.context_tokens + r.suffix_tokens, int(g.ids.size()));
    metrics_.observe_pipeline_ttft(r.ttft_ms / 1000.0);
    if (!p.cfg.store.path.empty() && p.cfg.method.name != Config::Method::full) {
        const int K = p.prepared.n_chunks() - 1;
        metrics_.count_store(r.store_chunks, K - r.store_chunks, r.store_added);
    }
    for (const auto& per_rank : r.phases_per_rank) {
        uint64_t sent = 0, recv = 0;
        for (const PhaseTime& ph : per_rank) {
            sent += ph.bytes_sent;
            recv += ph.bytes_recv;
        }
        if (!per_rank.empty()) metrics_.count_bytes(per_rank[0].name, sent, recv);
    }
    std::printf(
        "[serve] %s %s %s: %d context + %d prompt tokens, %zu generated; queue %.0f ms, "
        "ttft %.0f ms (pipeline %.0f ms), total %.0f ms%s\n",
        t.head.id.c_str(), t.route().c_str(), r.method.c_str(), r.context_tokens, r.suffix_tokens,
        g.ids.size(), queue_ms, server_ttft_ms, r.ttft_ms, t.seconds_since_arrival() * 1000.0,
        p.cfg.store.path.empty() ? ""
                                 : (", store " + std::to_string(r.store_chunks) + "/" +
                                    std::to_string(p.prepared.n_chunks() - 1))
                                       .c_str());
    std::fflush(stdout);
}

void Server::respond(CompletionTask& t, const MethodResult& r, Generation& g, double queue_ms) {
    const std::string rest = g.streamer.finish();
    const std::string& text = g.streamer.sent();
    std::string finish = "length";
    if (g.streamer.stop_hit() || r.stopped) finish = "stop";
    serve::Usage usage;
    usage.prompt_tokens = r.context_tokens + r.suffix_tokens;
    usage.completion_tokens = int(g.ids.size());
    const double server_ttft_ms =
        g.ids.empty() ? t.seconds_since_arrival() * 1000.0 : t.first_token_s * 1000.0;
    const json info = infoflow_object(r, *s_, t.plan, queue_ms, server_ttft_ms);
    if (!t.req.stream) {
        t.finish(serve::completion_response(t.head, text, finish, usage, info));
        return;
    }
    json last = json::array();
    last.push_back(serve::stream_chunk(t.head, rest, !g.sent_first, finish, info));
    if (t.req.include_usage) last.push_back(serve::stream_usage_chunk(t.head, usage));
    t.finish(last);
}

void Server::run_documents(DocumentsTask& t) {
    if (comm_.size() > 1) command(k_documents, encode_work(t.plan.cfg, t.plan.prepared));
    StoreBuild built;
    try {
        std::unique_ptr<KvStore> store =
            open_store_for(*s_->model, t.plan.prepared.tokenizer_hash, t.plan.cfg, true);
        built = build_store_chunks(*s_, t.plan.cfg, t.plan.prepared, *store);
    } catch (const std::exception& e) {
        t.fail(ApiError(500, std::string("storing the documents failed: ") + e.what(), "",
                        "internal_error"));
        if (comm_.size() > 1) throw;
        return;
    }
    const PreparedRequest& req = t.plan.prepared;
    const std::string chunking = chunking_label(t.plan.cfg);
    json data = json::array();
    for (int ci = 1; ci < req.n_chunks(); ++ci) {
        json d = {{"object", "document"},
                  {"key", document_key(req.chunks[size_t(ci)], req.sink_id, chunking)},
                  {"tokens", req.chunks[size_t(ci)].size()},
                  {"stored", true},
                  {"added", built.status[size_t(ci)] == 2}};
        if (t.plan.documents_are_chunks) d["index"] = ci - 1;
        data.push_back(d);
    }
    metrics_.count_store(0, 0, int(built.totals[2]));
    t.finish(json{{"object", "list"},
                  {"data", data},
                  {"added", int(built.totals[2])},
                  {"already_present", int(built.totals[3])}});
    std::printf("[serve] /v1/documents: %d chunks, %d added, %d already in the store\n",
                req.n_chunks() - 1, int(built.totals[2]), int(built.totals[3]));
    std::fflush(stdout);
}

// ---- ranks > 0 ------------------------------------------------------------------------------

void Server::follower() {
    for (;;) {
        const CommandWord w = exchange_command(comm_, k_heartbeat, 0);
        if (w.command == k_heartbeat) continue;
        if (w.command == k_shutdown) return;
        Config cfg;
        PreparedRequest req;
        decode_work(broadcast_payload(comm_, {}, w.bytes), &cfg, &req);
        if (w.command == k_completion) {
            execute_completion(cfg, req, {});
        } else {
            std::unique_ptr<KvStore> store =
                open_store_for(*s_->model, req.tokenizer_hash, cfg, true);
            build_store_chunks(*s_, cfg, req, *store);
        }
    }
}

}  // namespace

nlohmann::json run_serve(const Config& cfg, Communicator& comm) {
    install_drain_handlers(comm.rank(), comm.size());
    Server server(cfg, comm);
    if (comm.rank() == 0) server.listen();
    std::unique_ptr<Session> s = open_job_session(cfg, comm);
    server.set_session(*s);
    server.check_store();
    // One request at a time prints one line; the per-phase progress lines of each request
    // would drown them.
    progress::set_enabled(false);
    if (comm.rank() != 0) {
        server.follower();
        return json();
    }
    server.set_ready();
    return server.worker();
}

}  // namespace infoflow
