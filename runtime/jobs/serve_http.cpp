// The HTTP side of job serve (serve_http.h).
#include "runtime/jobs/serve_http.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>

#include "comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/fs.h"
#include "runtime/jobs/session.h"
#include "runtime/method/chunk_store.h"
#include "runtime/store/kv_store.h"

namespace infoflow {

using nlohmann::json;
using serve::ApiError;
using serve::Clock;

ApiBackend::ApiBackend(ServeState& st) : st_(st) {
    std::random_device rd;
    id_salt_ = (uint64_t(rd()) << 32) ^ rd();
    created_ = int64_t(std::time(nullptr));
}

std::string ApiBackend::resolve_api_key() const {
    const Config::ServeSection& sv = st_.cfg.serve;
    if (!sv.api_key.empty()) return sv.api_key;
    if (sv.api_key_env.empty()) return {};
    const char* v = std::getenv(sv.api_key_env.c_str());
    return v ? std::string(v) : std::string();
}

void ApiBackend::listen() {
    const Config::ServeSection& sv = st_.cfg.serve;
    serve::HttpOptions o;
    o.host = sv.host;
    o.port = sv.port;
    o.api_key = resolve_api_key();
    if (!serve::is_loopback_host(o.host) && o.api_key.empty()) {
        IF_CHECK(sv.allow_unauthenticated,
                 "serve.host = '" << o.host
                                  << "' is not a loopback address: set an API key "
                                     "(serve.api_key, or the environment variable named by "
                                     "serve.api_key_env = '"
                                  << sv.api_key_env
                                  << "'), or serve.allow_unauthenticated = true to serve "
                                     "it without one");
    }
    o.max_body_bytes = size_t(sv.max_body_bytes);
    o.threads = sv.http_threads;
    o.limits.max_tokens = sv.max_tokens;
    st_.http = std::make_unique<serve::HttpFrontend>(o, *this, st_.queue, st_.metrics);
    st_.port = st_.http->start();
    st_.metrics.set_queue(0, st_.queue.capacity());
    std::printf(
        "serve      : listening on http://%s:%d (rank 0 pid %d; loading the model, "
        "/health is 503 until it is ready)\n",
        o.host.c_str(), st_.port, int(::getpid()));
    std::fflush(stdout);
}

void ApiBackend::set_session() {
    raw_chat_ = std::make_unique<ChatTemplate>(st_.s->tok(), "raw");
    model_name_ = st_.cfg.serve.model_name;
    if (model_name_.empty()) {
        model_name_ = st_.s->weights->source;
        const size_t slash = model_name_.find_last_of('/');
        if (slash != std::string::npos) model_name_ = model_name_.substr(slash + 1);
    }
}

void ApiBackend::check_store() {
    const Config& cfg = st_.cfg;
    if (cfg.store.path.empty()) return;
    const bool writable = cfg.store.mode == Config::StoreMode::read_write;
    open_store_for(*st_.s->model, hex64(st_.s->tok().fingerprint()), cfg, writable);
}

void ApiBackend::set_ready() {
    const Config::ServeSection& sv = st_.cfg.serve;
    const int P = st_.comm.size();
    st_.ready = true;
    st_.metrics.set_ready(true, P);
    std::printf(
        "serve      : ready: model %s on %d rank%s (max_batch %d, queue %d, max_tokens %d, KV "
        "budget %d MiB)%s\n",
        model_name_.c_str(), P, P > 1 ? "s" : "", sv.max_batch, st_.queue.capacity(), sv.max_tokens,
        sv.kv_budget_mb,
        st_.cfg.store.path.empty() ? "" : (", store " + st_.cfg.store.path).c_str());
    std::fflush(stdout);
}

void ApiBackend::check_ready() const {
    if (!st_.ready) throw ApiError(503, "the model is still loading", "", "loading");
}

void ApiBackend::check_budget(uint64_t need, const std::string& what) const {
    if (st_.sched.fits_budget(need)) return;
    char msg[400];
    std::snprintf(msg, sizeof msg,
                  "%s needs %.1f MiB of KV memory on rank 0 at its peak, more than this server's "
                  "serve.kv_budget_mb = %d MiB; send fewer or shorter documents or a smaller "
                  "max_tokens",
                  what.c_str(), double(need) / (1 << 20), st_.cfg.serve.kv_budget_mb);
    throw ApiError(400, msg, "", "kv_budget_exceeded");
}

std::string ApiBackend::next_id(serve::Endpoint e) {
    const uint64_t n = ++request_count_;
    return std::string(e == serve::Endpoint::chat ? "chatcmpl-" : "cmpl-") +
           hex64(id_salt_ ^ (n * 0x9E3779B97F4A7C15ull)) + std::to_string(n);
}

std::shared_ptr<serve::Task> ApiBackend::make_completion(serve::CompletionRequest req) {
    check_ready();
    auto t = std::make_shared<CompletionTask>(serve::endpoint_path(req.endpoint),
                                              st_.cfg.serve.request_timeout_s);
    t->plan = plan_completion(st_.cfg, *st_.s, *raw_chat_, req);
    t->kv_need = kv_need_bytes(t->plan, *st_.s->model, st_.comm.size());
    check_budget(t->kv_need, "the request");
    t->head.endpoint = req.endpoint;
    t->head.id = next_id(req.endpoint);
    t->head.created = int64_t(std::time(nullptr));
    t->head.model = model_name_;
    t->req = std::move(req);
    return t;
}

std::shared_ptr<serve::Task> ApiBackend::make_documents(std::vector<std::string> docs) {
    check_ready();
    const Config& cfg = st_.cfg;
    if (cfg.store.path.empty()) {
        throw ApiError(400, "this server has no document store (start it with store.path set)", "",
                       "no_store");
    }
    if (cfg.store.mode != Config::StoreMode::read_write) {
        throw ApiError(403, "the document store is read-only (store.mode = \"read\")", "",
                       "store_read_only", "permission_error");
    }
    auto t = std::make_shared<DocumentsTask>(cfg.serve.request_timeout_s);
    t->plan = plan_documents(cfg, *st_.s, docs);
    t->kv_need = kv_need_bytes(t->plan, *st_.s->model, st_.comm.size(), true);
    check_budget(t->kv_need, "storing these documents");
    return t;
}

std::pair<int, json> ApiBackend::document_status(const std::string& key) {
    check_ready();
    if (st_.cfg.store.path.empty()) {
        throw ApiError(400, "this server has no document store (start it with store.path set)", "",
                       "no_store");
    }
    // A reader of the committed index (HDF5 here is thread-safe; readers never block writers).
    std::unique_ptr<KvStore> store =
        open_store_for(*st_.s->model, hex64(st_.s->tok().fingerprint()), st_.cfg, false);
    if (!store->contains(key)) {
        throw ApiError(404, "document " + key + " is not in the store", "key",
                       "document_not_found");
    }
    return {200, json{{"object", "document"},
                      {"key", key},
                      {"stored", true},
                      {"bytes", store->document_bytes(key)}}};
}

json ApiBackend::models() {
    const Config& cfg = st_.cfg;
    json m = {{"id", model_name_.empty() ? cfg.serve.model_name : model_name_},
              {"object", "model"},
              {"created", created_},
              {"owned_by", "infoflow_sp"}};
    if (st_.ready) {
        m["infoflow"] = {{"ranks", st_.comm.size()},
                         {"context_window", st_.s->model->config().n_ctx_train},
                         {"methods", serve::served_methods()},
                         {"default_method", to_string(cfg.method.name)},
                         {"max_batch", cfg.serve.max_batch},
                         {"store", cfg.store.path.empty() ? json(nullptr) : json(cfg.store.path)}};
    }
    return {{"object", "list"}, {"data", json::array({m})}};
}

std::pair<int, json> ApiBackend::health() {
    if (!st_.ready) return {503, json{{"status", "loading"}}};
    const int64_t started = st_.heartbeat_started_ns.load();
    if (started != 0) {
        const double waited = double(Clock::now().time_since_epoch().count() - started) / 1e9;
        // A heartbeat is one small all-reduce: still waiting after a heartbeat period means a
        // rank stopped answering (the watchdog ends the job at parallel.timeout_s).
        if (waited > std::max(1.0, st_.cfg.serve.heartbeat_s)) {
            char msg[200];
            std::snprintf(msg, sizeof msg,
                          "a rank has not answered the heartbeat for %.1f s (the job ends when "
                          "parallel.timeout_s = %g s has passed)",
                          waited, st_.cfg.parallel.timeout_s);
            return {503, json{{"status", "error"}, {"message", msg}}};
        }
    }
    const serve::Metrics::Load l = st_.metrics.load();
    return {200, json{{"status", "ok"},
                      {"ranks", st_.comm.size()},
                      {"model", model_name_},
                      {"running", l.running},
                      {"waiting", l.waiting},
                      {"queue_depth", l.waiting},
                      {"batch_size", l.batch_size},
                      {"max_batch", l.max_batch},
                      {"kv_bytes_in_use", l.kv_in_use},
                      {"kv_bytes_limit", l.kv_limit}}};
}

}  // namespace infoflow
