// Job dispatch and result output: progress on rank 0, the model load, the job, then the result
// with its provenance (provenance.h) written atomically.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/fs.h"
#include "runtime/core/memory.h"
#include "runtime/core/progress.h"
#include "runtime/jobs/jobs.h"
#include "runtime/jobs/provenance.h"
#include "runtime/jobs/session.h"

namespace infoflow {

std::unique_ptr<Session> open_job_session(const Config& cfg, Communicator& comm) {
    progress::note("load " + cfg.model.path + " ...");
    std::unique_ptr<Session> s = open_session(cfg, comm.local_rank());
    progress::phase_end("load", s->load_ms);
    return_free_memory();  // the loader's dequantization scratch
    {
        char mem[96];
        std::snprintf(mem, sizeof mem, "resident after load: %.0f MiB (peak %.0f MiB)",
                      current_rss_mib(), peak_rss_mib());
        progress::note(mem);
    }
    s->comm = &comm;
    // Every rank must have loaded the same model: weights, shapes and tokenizer (docs/design.md
    // §11).
    check_same_model(
        comm,
        s->weights->fingerprint + (s->tokenizer ? "-" + hex64(s->tokenizer->fingerprint()) : ""),
        s->weights->source);
    s->placement = gather_placement(comm, *s->backend);
    for (const RankPlacement& p : s->placement) s->devices.push_back(p.device);
    progress::note("placement: " + placement_summary(s->placement));
    return s;
}

nlohmann::json run_job(const Config& cfg, Communicator& comm) {
    const std::string start_time = utc_now_iso8601();
    // INFOFLOW_PROGRESS=0 silences the progress lines (standard error, rank 0).
    const char* quiet = std::getenv("INFOFLOW_PROGRESS");
    progress::set_enabled(comm.rank() == 0 && !(quiet && std::strcmp(quiet, "0") == 0));
    progress::set_phase_lines(true);
    progress::note("job " + std::string(to_string(cfg.job)) + " on " + std::to_string(comm.size()) +
                   " rank" + (comm.size() > 1 ? "s" : ""));
    nlohmann::json result;
    std::unique_ptr<Session> s;
    // The server listens before it loads the model (its /health answers 503 meanwhile), so it
    // opens the session itself.
    if (cfg.job != Config::Job::serve) s = open_job_session(cfg, comm);
    switch (cfg.job) {
        case Config::Job::answer:
            result = run_answer(cfg, *s);
            break;
        case Config::Job::niah:
            result = run_niah(cfg, *s);
            break;
        case Config::Job::eval:
            result = run_eval(cfg, *s);
            break;
        case Config::Job::bench_ttft:
            result = run_bench_ttft(cfg, *s);
            break;
        case Config::Job::cache_build:
            result = run_cache_build(cfg, *s);
            break;
        case Config::Job::reform_heads:
            result = run_reform_heads(cfg, *s);
            break;
        case Config::Job::sweep:
            result = run_sweep(cfg, *s);
            break;
        case Config::Job::serve:
            result = run_serve(cfg, comm);
            break;
        default:
            // check_implemented rejects planned jobs at start-up; this is the backstop.
            IF_FAIL("job = \"" << to_string(cfg.job) << "\" is not implemented yet");
    }
    if (comm.rank() == 0 && result.is_object()) {
        add_provenance(result, cfg, comm.size(), start_time);
    }
    if (comm.rank() == 0 && result.is_object() && s) {
        result["devices"] = s->devices;                      // by rank
        result["placement"] = placement_json(s->placement);  // by rank
    }
    if (!cfg.output.path.empty() && comm.rank() == 0) {
        write_file_atomic(cfg.output.path, result.dump(2) + "\n");
        std::printf("results    : %s\n", cfg.output.path.c_str());
    }
    return result;
}

}  // namespace infoflow
