#include "runtime/parallel/emulate.h"

#include "comm/thread_comm.h"
#include "runtime/core/error.h"
#include "runtime/parallel/run.h"

namespace infoflow {

EmulatedRun run_emulated(Model& model, const PreparedRequest& req, const Config& cfg_in,
                         int n_ranks, const LinkModel& link, const std::vector<int32_t>& stop_ids,
                         const RunHooks& hooks) {
    IF_CHECK(n_ranks >= 1, "emulated ranks: need at least 1 virtual rank, not " << n_ranks);
    Config cfg = cfg_in;
    cfg.parallel.emulate_ranks = 0;  // every virtual rank runs the distributed code itself
    const int P = cfg.method.name == Config::Method::full ? 1 : n_ranks;
    Backend& be = model.backend();
    ThreadWorld world(P, link, [&be] { be.synchronize(); });
    EmulatedRun out;
    out.per_rank.resize(P);
    world.run([&](Communicator& comm) {
        out.per_rank[comm.rank()] = run_request(model, req, cfg, comm, stop_ids, hooks);
    });

    EmulatedTiming& t = out.timing;
    t.ranks = P;
    t.link = link;
    const MethodResult& r0 = out.per_rank[0];
    std::vector<std::string> names;
    for (const PhaseTime& p : r0.phases) {
        if (p.name == "decode") break;
        names.push_back(p.name);
    }
    if (P == 1) {
        // One rank: no communication to model; its phases are measured as they ran.
        for (const PhaseTime& p : r0.phases) {
            if (p.name == "decode") break;
            t.critical_path.push_back({p.name, p.ms});
        }
        t.ttft_ms = r0.ttft_ms;
    } else {
        t.critical_path = world.timeline().critical_path(names);
        t.ttft_ms = 0.0;
        for (const auto& p : t.critical_path) t.ttft_ms += p.second;
    }
    for (int r = 0; r < P; ++r) t.per_rank.push_back(world.timeline().phases(r));
    return out;
}

}  // namespace infoflow
