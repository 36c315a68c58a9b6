// Job dispatch and result output.
#include <cstdio>

#include "comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/fs.h"
#include "runtime/jobs/jobs.h"
#include "runtime/jobs/session.h"

namespace infoflow {

nlohmann::json run_job(const Config& cfg, Communicator& comm) {
    std::unique_ptr<Session> s = open_session(cfg);
    s->comm = &comm;
    nlohmann::json result;
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
        default:
            IF_FAIL("job = \"" << to_string(cfg.job) << "\" is not available in this build");
    }
    if (!cfg.output.path.empty() && comm.rank() == 0) {
        write_file_atomic(cfg.output.path, result.dump(2) + "\n");
        std::printf("results    : %s\n", cfg.output.path.c_str());
    }
    return result;
}

}  // namespace infoflow
