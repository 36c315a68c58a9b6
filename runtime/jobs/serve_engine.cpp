// Rank 0's worker of job serve (serve_engine.h).
#include "runtime/jobs/serve_engine.h"

#include <atomic>
#include <cstdio>
#include <thread>

#include "comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/memory.h"
#include "runtime/core/pieces.h"
#include "runtime/jobs/jobs.h"
#include "runtime/jobs/serve_ranks.h"
#include "runtime/jobs/session.h"
#include "runtime/method/chunk_store.h"
#include "runtime/method/phases.h"
#include "runtime/model/batch_decode.h"
#include "runtime/store/kv_store.h"

namespace infoflow {

using nlohmann::json;
using serve::ApiError;
using serve::Clock;

namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

ApiError timeout_error(const Config& cfg, const char* what) {
    return ApiError(504,
                    std::string("the request ") + what + " serve.request_timeout_s = " +
                        json(cfg.serve.request_timeout_s).dump() + " s",
                    "", "timeout");
}

// Signals arrive on any thread; this one notices them within a poll and turns the HTTP side to
// draining at once (new requests get 503), even while the worker is inside a request.
class SignalWatcher {
  public:
    explicit SignalWatcher(ServeState& st)
        : thread_([this, &st] {
              while (!done_) {
                  if (drain_requested()) {
                      st.http->set_draining();
                      st.queue.wake();
                      return;
                  }
                  std::this_thread::sleep_for(std::chrono::milliseconds(20));
              }
          }) {}
    ~SignalWatcher() {
        done_ = true;
        thread_.join();
    }

  private:
    std::atomic<bool> done_{false};
    std::thread thread_;
};

}  // namespace

// One admitted completion, from its context work to its last token. Each token becomes a stream
// chunk (text held back while it could begin a stop string or ends inside a UTF-8 sequence); a
// stop string, a client that went away or the deadline ends the generation.
struct ServeEngine::Running {
    Running(std::shared_ptr<serve::Task> t, const Tokenizer& tk, serve::Metrics& m)
        : hold(std::move(t)),
          task(static_cast<CompletionTask&>(*hold)),
          tok(tk),
          metrics(m),
          streamer(task.req.stop) {}

    bool on_token(int32_t id) {
        const auto now = Clock::now();
        if (ids.empty()) {
            task.first_token_s = task.seconds_since_arrival();
            decode_start = now;
        } else {
            metrics.observe_inter_token(seconds(now - last_token));
        }
        last_token = now;
        if (leaving()) return false;
        ids.push_back(id);
        const std::string delta = streamer.update(tok.decode(ids));
        if (task.req.stream && (!sent_first || !delta.empty())) {
            task.send_chunk(serve::stream_chunk(task.head, delta, !sent_first, ""));
            sent_first = true;
        }
        return !streamer.stop_hit();
    }
    // Whether the request must stop now (its deadline passed, or its client went away).
    bool leaving() {
        if (ended.empty() && task.past_deadline()) ended = "timeout";
        if (ended.empty() && task.cancelled()) ended = "client_disconnect";
        return !ended.empty();
    }

    std::shared_ptr<serve::Task> hold;
    CompletionTask& task;
    const Tokenizer& tok;
    serve::Metrics& metrics;
    serve::TextStreamer streamer;
    MethodResult r;
    std::unique_ptr<KvCache> cache;  // batched decode: the prompt, then the answer so far
    int32_t group = -1;              // visibility group of the decode rows
    std::unique_ptr<Generator> gen;  // batched decode: the generation, a step at a time
    std::vector<int32_t> ids;
    bool sent_first = false;
    std::string ended;  // "", "client_disconnect", "timeout"
    double queue_ms = 0.0;
    Clock::time_point admitted, decode_start, last_token;
};

ServeEngine::ServeEngine(ServeState& st) : st_(st) {}
ServeEngine::~ServeEngine() = default;

json ServeEngine::run() {
    const int P = st_.comm.size();
    const auto idle = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::duration<double>(P > 1 ? st_.cfg.serve.heartbeat_s : 0.2));
    {
        const SignalWatcher watcher(st_);
        // Every request's context work on this thread counts towards the next decode step,
        // across requests too: at most serve.prefill_chunk tokens or serve.prefill_slice_ms of
        // it between two steps.
        const auto slice = std::chrono::duration_cast<std::chrono::nanoseconds>(
            std::chrono::duration<double, std::milli>(st_.cfg.serve.prefill_slice_ms));
        pieces_ = std::make_unique<PieceScope>(
            st_.cfg.serve.prefill_chunk, products_row_independent(*st_.s->model),
            [this] { decode_step(); }, slice);
        last_heartbeat_ = Clock::now();
        for (;;) {
            if (drain_requested() && !draining_) begin_drain();
            if (draining_ && batch_.empty()) break;
            std::shared_ptr<serve::Task> t;
            if (!draining_)
                t = st_.sched.admit(batch_.empty() ? idle : std::chrono::milliseconds(0));
            if (t) {
                handle(t);
            } else {
                decode_step();
            }
            heartbeat_if_due();
        }
        pieces_.reset();
    }
    if (P > 1) command(k_shutdown, {});
    st_.http->stop();  // the connections in hand (the last responses) finish first
    std::printf("serve      : stopped after %llu requests\n", (unsigned long long)served_);
    std::fflush(stdout);
    return json{{"job", "serve"}, {"requests", served_}, {"port", st_.port}};
}

void ServeEngine::begin_drain() {
    draining_ = true;
    st_.http->set_draining();
    for (const auto& t : st_.queue.close()) {
        t->fail(ApiError(503, "the server is shutting down", "", "shutting_down"));
    }
}

void ServeEngine::command(int64_t c, std::vector<uint8_t> payload) {
    const int64_t n = int64_t(payload.size());
    exchange_command(st_.comm, c, n);
    if (n > 0) broadcast_payload(st_.comm, std::move(payload), n);
}

void ServeEngine::heartbeat_if_due() {
    const auto period = std::chrono::duration<double>(st_.cfg.serve.heartbeat_s);
    if (st_.comm.size() == 1 || Clock::now() - last_heartbeat_ < period) return;
    st_.heartbeat_started_ns = Clock::now().time_since_epoch().count();
    command(k_heartbeat, {});
    st_.heartbeat_started_ns = 0;
    last_heartbeat_ = Clock::now();
}

void ServeEngine::handle(const std::shared_ptr<serve::Task>& t) {
    if (t->cancelled()) {  // the client went away while it waited (its HTTP thread waits on)
        st_.metrics.count_cancel("client_disconnect");
        t->fail(ApiError(499, "the client closed the connection", "", "client_closed"));
        st_.sched.release(*t);
        return;
    }
    if (t->past_deadline()) {
        st_.metrics.count_cancel("timeout");
        t->fail(timeout_error(st_.cfg, "waited in the queue longer than"));
        st_.sched.release(*t);
        return;
    }
    if (t->kind() == serve::Task::Kind::completion) {
        run_completion(t);
        return;
    }
    const auto t0 = Clock::now();
    run_documents(static_cast<DocumentsTask&>(*t));
    st_.sched.release(*t);
    ++served_;
    st_.queue.record_service_time(seconds(Clock::now() - t0));
}

void ServeEngine::run_completion(const std::shared_ptr<serve::Task>& t) {
    auto run = std::make_unique<Running>(t, st_.s->tok(), st_.metrics);
    CompletionTask& ct = run->task;
    run->admitted = Clock::now();
    run->queue_ms = seconds(run->admitted - ct.arrival()) * 1000.0;
    if (st_.comm.size() > 1) command(k_completion, encode_work(ct.plan.cfg, ct.plan.prepared));
    try {
        run->r = run_pipeline(*run);
    } catch (const std::exception& e) {
        in_context_work_ = false;
        ct.fail(
            ApiError(500, std::string("the request failed: ") + e.what(), "", "internal_error"));
        st_.sched.release(ct);
        // On P ranks the others may be anywhere in the pipeline: end the job (abort_job names
        // the error) rather than leave a rank waiting. One rank has no one to wait for.
        if (st_.comm.size() > 1) throw;
        std::fprintf(stderr, "[serve] request %s failed: %s\n", ct.head.id.c_str(), e.what());
        return;
    }
    if (run->cache) {
        start_decode(std::move(run));
    } else {
        finish(*run);  // decoded inside its pipeline (ring attention, "exact")
    }
}

MethodResult ServeEngine::run_pipeline(Running& run) {
    Session& s = *st_.s;
    const PlannedRequest& plan = run.task.plan;
    RunHooks hooks;
    if (decodes_on_rank0(plan.cfg, st_.comm.size())) {
        hooks.take_cache = [&run](KvCache&& c, int32_t group, MethodResult&) {
            run.cache = std::make_unique<KvCache>(std::move(c));
            run.group = group;
        };
    } else {
        hooks.on_token = [this, &run](int32_t id) {
            in_context_work_ = false;
            const bool go = run.on_token(id);
            decode_step();  // the batch advances between this request's tokens
            return go;
        };
    }
    in_context_work_ = true;
    pause_pieces_if_idle();
    MethodResult r = answer_request(plan.cfg, s, plan.prepared, hooks);
    in_context_work_ = false;
    return r;
}

void ServeEngine::start_decode(std::unique_ptr<Running> run) {
    st_.sched.resize(run->task, kv_cache_bytes(*run->cache));
    GenerateOptions gen = generate_options(run->task.plan.cfg, st_.s->tok().stop_ids());
    gen.group = run->group;
    Running* p = run.get();
    gen.on_token = [p](int32_t id) { return p->on_token(id); };
    const MethodResult& r = run->r;
    run->gen = std::make_unique<Generator>(*st_.s->model, r.first_logits,
                                           r.context_tokens + r.suffix_tokens, gen);
    // The first token comes from the prefill's logits: sampled now, not after the next step.
    if (!run->gen->sample()) {
        finish(*run);
        return;
    }
    batch_.push_back(std::move(run));
}

void ServeEngine::drop_leavers() {
    std::vector<std::unique_ptr<Running>> staying;
    for (auto& run : batch_) {
        if (run->leaving()) {
            finish(*run);
        } else {
            staying.push_back(std::move(run));
        }
    }
    batch_ = std::move(staying);
}

void ServeEngine::pause_pieces_if_idle() {
    if (pieces_) pieces_->pause(batch_.empty());
}

void ServeEngine::decode_step() {
    drop_leavers();  // a client that went away frees its slot before the step
    if (batch_.empty()) {
        pause_pieces_if_idle();
        return;
    }
    std::vector<DecodeRow> rows;
    for (const auto& run : batch_) {
        rows.push_back({run->cache.get(), run->gen->token(), run->gen->pos(), run->group});
    }
    const auto t0 = Clock::now();
    step_starts_.push_back(t0);
    if (step_starts_.size() > 1024) step_starts_.pop_front();
    const std::vector<float> logits = decode_batch(*st_.s->model, rows);
    st_.metrics.observe_decode_step(seconds(Clock::now() - t0), int(rows.size()), in_context_work_);
    if (pieces_) pieces_->restart();  // the next step comes after serve.prefill_chunk tokens
    const size_t V = size_t(st_.s->model->config().n_vocab);
    std::vector<std::unique_ptr<Running>> going_on;
    for (size_t i = 0; i < batch_.size(); ++i) {
        Running& run = *batch_[i];
        run.gen->set_logits(logits.data() + i * V);
        if (run.gen->sample()) {
            going_on.push_back(std::move(batch_[i]));
        } else {
            finish(run);
        }
    }
    batch_ = std::move(going_on);
    // The last stream ended: the context work in hand goes on uncut, as a request alone's.
    pause_pieces_if_idle();
}

void ServeEngine::finish(Running& run) {
    if (run.gen) {  // the batch decoded it: the answer and the decode phase are its result
        const GenerateResult& g = run.gen->result();
        run.r.answer = g.tokens;
        run.r.stopped = g.stopped;
        run.r.cancelled = g.cancelled;
        // The pipeline left its "decode" phase empty (RunHooks::take_cache): rank 0's decode.
        const double ms = run.ids.empty() ? 0.0 : seconds(Clock::now() - run.decode_start) * 1e3;
        for (PhaseTime& p : run.r.phases) {
            if (p.name == "decode") p.ms = ms;
        }
        for (std::vector<PhaseTime>& per_rank : run.r.phases_per_rank) {
            if (!per_rank.empty() && per_rank[0].name == "decode") per_rank[0].ms = ms;
        }
    }
    run.cache.reset();
    // The pages of freed memory back to the system, so the server's RSS stays flat; the pool
    // (serve.buffer_pool_mb) keeps what the next request reuses.
    st_.s->model->backend().release_idle_buffers(k_pool_idle_s);
    return_free_memory();
    const BufferPoolStats pool = st_.s->model->backend().buffer_pool();
    st_.metrics.set_buffer_pool(pool.held, pool.limit, pool.reused);
    if (const PrefixKvCache* pc = st_.s->prefix_cache.get()) {
        st_.metrics.set_prefix_cache(pc->bytes(), pc->hits(), pc->misses());
    }
    st_.sched.release(run.task);
    ++served_;
    st_.queue.record_service_time(seconds(Clock::now() - run.admitted));
    if (run.ended.empty()) run.leaving();  // a deadline that passed on the last token
    if (!run.ended.empty()) {
        st_.metrics.count_cancel(run.ended);
        report_left(run);
        if (run.ended == "timeout") {
            run.task.fail(timeout_error(st_.cfg, "took longer than"));
        } else {
            run.task.fail(ApiError(499, "the client closed the connection", "", "client_closed"));
        }
        return;
    }
    respond(run);
    report(run);
}

void ServeEngine::respond(Running& run) {
    CompletionTask& t = run.task;
    const MethodResult& r = run.r;
    const std::string rest = run.streamer.finish();
    const std::string& text = run.streamer.sent();
    const std::string finish = run.streamer.stop_hit() || r.stopped ? "stop" : "length";
    serve::Usage usage;
    usage.prompt_tokens = r.context_tokens + r.suffix_tokens;
    usage.completion_tokens = int(run.ids.size());
    const double server_ttft_ms =
        run.ids.empty() ? t.seconds_since_arrival() * 1000.0 : t.first_token_s * 1000.0;
    const json info = infoflow_object(r, *st_.s, t.plan, run.queue_ms, server_ttft_ms);
    if (!t.req.stream) {
        t.finish(serve::completion_response(t.head, text, finish, usage, info));
        return;
    }
    json last = json::array();
    last.push_back(serve::stream_chunk(t.head, rest, !run.sent_first, finish, info));
    if (t.req.include_usage) last.push_back(serve::stream_usage_chunk(t.head, usage));
    t.finish(last);
}

void ServeEngine::report(Running& run) {
    const CompletionTask& t = run.task;
    const MethodResult& r = run.r;
    const PlannedRequest& p = t.plan;
    const double server_ttft_ms =
        run.ids.empty() ? t.seconds_since_arrival() * 1000.0 : t.first_token_s * 1000.0;
    st_.metrics.observe_completion(server_ttft_ms / 1000.0, t.seconds_since_arrival(),
                                   r.context_tokens + r.suffix_tokens, int(run.ids.size()));
    st_.metrics.observe_pipeline_ttft(r.ttft_ms / 1000.0);
    const int K = p.prepared.n_chunks() - 1;
    const bool store = !p.cfg.store.path.empty() && p.cfg.method.name != Config::Method::full;
    if (store) st_.metrics.count_store(r.store_chunks, K - r.store_chunks, r.store_added);
    for (const auto& per_rank : r.phases_per_rank) {
        uint64_t sent = 0, recv = 0;
        for (const PhaseTime& ph : per_rank) {
            sent += ph.bytes_sent;
            recv += ph.bytes_recv;
        }
        if (!per_rank.empty()) st_.metrics.count_bytes(per_rank[0].name, sent, recv);
    }
    std::printf(
        "[serve] %s %s %s: %d context + %d prompt tokens, %zu generated; queue %.0f ms, "
        "ttft %.0f ms (pipeline %.0f ms), total %.0f ms, batch %zu%s\n",
        t.head.id.c_str(), t.route().c_str(), r.method.c_str(), r.context_tokens, r.suffix_tokens,
        run.ids.size(), run.queue_ms, server_ttft_ms, r.ttft_ms, t.seconds_since_arrival() * 1000.0,
        batch_.size(),
        store ? (", store " + std::to_string(r.store_chunks) + "/" + std::to_string(K)).c_str()
              : "");
    std::fflush(stdout);
}

void ServeEngine::report_left(const Running& run) {
    // How many decode steps started after the client left: the request holds its slot no
    // longer than the step in progress when its client went away.
    int after = 0;
    if (run.ended == "client_disconnect") {
        const Clock::time_point left = run.task.cancelled_at();
        for (const Clock::time_point t : step_starts_) after += t > left ? 1 : 0;
    }
    std::printf("[serve] %s left: %s after %zu tokens, %d decode steps after its client left\n",
                run.task.head.id.c_str(), run.ended.c_str(), run.ids.size(), after);
    std::fflush(stdout);
}

void ServeEngine::run_documents(DocumentsTask& t) {
    if (st_.comm.size() > 1) command(k_documents, encode_work(t.plan.cfg, t.plan.prepared));
    Session& s = *st_.s;
    StoreBuild built;
    try {
        in_context_work_ = true;
        pause_pieces_if_idle();
        std::unique_ptr<KvStore> store =
            open_store_for(*s.model, t.plan.prepared.tokenizer_hash, t.plan.cfg, true);
        built = build_store_chunks(s, t.plan.cfg, t.plan.prepared, *store);
        in_context_work_ = false;
    } catch (const std::exception& e) {
        in_context_work_ = false;
        t.fail(ApiError(500, std::string("storing the documents failed: ") + e.what(), "",
                        "internal_error"));
        if (st_.comm.size() > 1) throw;
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
    st_.metrics.count_store(0, 0, int(built.totals[2]));
    t.finish(json{{"object", "list"},
                  {"data", data},
                  {"added", int(built.totals[2])},
                  {"already_present", int(built.totals[3])}});
    std::printf("[serve] /v1/documents: %d chunks, %d added, %d already in the store\n",
                req.n_chunks() - 1, int(built.totals[2]), int(built.totals[3]));
    std::fflush(stdout);
}

}  // namespace infoflow
