// job = "serve" (docs/serve.md): the OpenAI-compatible server over the sequence-parallel runtime.
// This file only wires the parts together:
//   serve_http.h    rank 0's HTTP side: requests planned and checked, queued (runtime/serve)
//   serve_engine.h  rank 0's worker: admission (runtime/serve/scheduler.h), context work in
//                   pieces, the batched decode, responses
//   serve_ranks.h   signals, the command collective, ranks > 0 following rank 0's commands
// Rank 0 listens before the model loads (/health is 503 meanwhile); every rank loads the model
// once; then rank 0 serves and the others follow until the drain.
#include "comm/communicator.h"
#include "runtime/core/progress.h"
#include "runtime/jobs/jobs.h"
#include "runtime/jobs/serve_engine.h"
#include "runtime/jobs/serve_http.h"
#include "runtime/jobs/serve_ranks.h"
#include "runtime/jobs/session.h"

namespace infoflow {

namespace {

// Stops the HTTP side before the backend it calls goes away (on every way out).
struct HttpStopper {
    ServeState& st;
    ~HttpStopper() { st.http.reset(); }
};

}  // namespace

nlohmann::json run_serve(const Config& cfg, Communicator& comm) {
    install_drain_handlers(comm.rank(), comm.size());
    ServeState st(cfg, comm);
    ApiBackend api(st);
    const HttpStopper stopper{st};
    if (comm.rank() == 0) api.listen();
    std::unique_ptr<Session> s = open_job_session(cfg, comm);
    st.s = s.get();
    // Freed buffers kept for the next request (docs/serve.md "Memory"), on every rank.
    s->model->backend().set_buffer_pool(size_t(cfg.serve.buffer_pool_mb) << 20);
    // Chunk 0 kept across requests (docs/serve.md "Batching"), on every rank.
    if (cfg.serve.prefix_cache_mb > 0) {
        s->prefix_cache = std::make_unique<PrefixKvCache>(size_t(cfg.serve.prefix_cache_mb) << 20);
    }
    if (comm.rank() == 0) api.set_session();
    api.check_store();
    // Many requests print one line each; the per-phase progress lines would drown them.
    progress::set_enabled(false);
    if (comm.rank() != 0) {
        follow_commands(*s, comm);
        return nlohmann::json();
    }
    api.set_ready();
    return ServeEngine(st).run();
}

}  // namespace infoflow
