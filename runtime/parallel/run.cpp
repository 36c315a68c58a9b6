#include "runtime/parallel/run.h"

#include "runtime/core/error.h"
#include "runtime/core/memory.h"
#include "runtime/method/reform.h"
#include "runtime/parallel/ring.h"
#include "runtime/parallel/sp_pipeline.h"
#include "runtime/parallel/sp_reform.h"

namespace infoflow {
namespace {

MethodResult run_on_ranks(Model& model, const PreparedRequest& req, const Config& cfg,
                          Communicator& comm, const std::vector<int32_t>& stop_ids,
                          const RunHooks& hooks) {
    const Config::Method m = cfg.method.name;
    const bool sp = comm.size() > 1 && m != Config::Method::ring && m != Config::Method::reform &&
                    m != Config::Method::full && !is_long_context_method(m);
    IF_CHECK(!hooks.sweep_hooks() || comm.size() == 1 || sp,
             "method.name = \"" << to_string(m) << "\" on " << comm.size()
                                << " ranks with job hooks (job sweep) is not implemented yet");
    if (m == Config::Method::ring) return run_ring(model, req, cfg, comm, stop_ids, hooks.on_token);
    if (comm.size() == 1) {
        MethodResult r = run_method(model, req, cfg, stop_ids, hooks);
        gather_phases(comm, r);
        return r;
    }
    if (m == Config::Method::reform) {
        IF_CHECK(!hooks.on_token,
                 "method.name = \"reform\": a token callback (job serve's streaming) on P ranks "
                 "is not implemented yet");
        return run_reform_sp(model, req, cfg, comm, stop_ids);
    }
    if (m == Config::Method::full || is_long_context_method(m)) {
        // The single-rank reference (and h2o / streamingllm, which have no distributed form)
        // inside a distributed job: rank 0 computes, the others wait.
        MethodResult r;
        if (comm.rank() == 0) r = run_method(model, req, cfg, stop_ids, hooks);
        std::vector<int32_t> answer_len{int32_t(r.answer.size())};
        comm.broadcast(answer_len.data(), sizeof(int32_t), 0);
        r.ranks = comm.size();
        return r;
    }
    return run_method_sp(model, req, cfg, comm, stop_ids, hooks);
}

}  // namespace

MethodResult run_request(Model& model, const PreparedRequest& req, const Config& cfg,
                         Communicator& comm, const std::vector<int32_t>& stop_ids,
                         const RunHooks& hooks) {
    MethodResult r = run_on_ranks(model, req, cfg, comm, stop_ids, hooks);
    // Every rank's peak resident memory up to the answer (the process's, model load included).
    const double mine = peak_rss_mib();
    r.peak_rss_mib.assign(size_t(comm.size()), 0.0);
    comm.all_gather(&mine, sizeof mine, r.peak_rss_mib.data());
    return r;
}

}  // namespace infoflow
