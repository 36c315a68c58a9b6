// Emulated ranks with timing (bench-ttft with bench.emulate_timing, docs/design.md §10): one
// request run by P virtual ranks in one process, each a thread running the real distributed code
// (the sequence-parallel pipeline or ring attention, through run_request) over a ThreadComm, taking
// turns on the one device (comm/thread_comm.h). The results are those of a real P-rank run (same
// code, same messages, same byte counts); the times are measured per compute segment and laid
// out with the alpha-beta model of the collectives (comm/comm_model.h) into a modelled critical
// path. The model weights and the backend are shared (only one rank computes at a time, and no
// Model scratch is held across a communicator call); each rank builds its own KV caches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm_model.h"
#include "runtime/method/pipeline.h"

namespace infoflow {

struct EmulatedTiming {
    int ranks = 1;
    LinkModel link;
    // Modelled time to the first token: the end of the last phase before "decode" on the
    // slowest rank. For one rank: the measured TTFT of the run.
    double ttft_ms = 0.0;
    // Per phase up to the first token: its share of the critical path (sums to ttft_ms).
    std::vector<std::pair<std::string, double>> critical_path;
    // Per rank, per phase: measured compute, modelled communication and waiting.
    std::vector<std::vector<PhaseTiming>> per_rank;
};

struct EmulatedRun {
    std::vector<MethodResult> per_rank;  // rank r's result; [0] holds the answer and logits
    EmulatedTiming timing;
};

// Runs cfg's method on `n_ranks` virtual ranks. `full` always runs on one rank (the single-GPU
// column). cfg.parallel.emulate_ranks is ignored (each virtual rank runs the distributed code).
// `hooks` go to every virtual rank's run_request (job sweep: shared chunks, teacher forcing).
EmulatedRun run_emulated(Model& model, const PreparedRequest& req, const Config& cfg, int n_ranks,
                         const LinkModel& link, const std::vector<int32_t>& stop_ids,
                         const RunHooks& hooks = {});

}  // namespace infoflow
