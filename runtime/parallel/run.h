// One request through any method on the ranks of a communicator: the single-rank pipeline on
// one rank (or for `full`, which runs on rank 0 alone: the "single-GPU" column), ring
// attention, or the sequence-parallel pipeline.
#pragma once

#include "comm/communicator.h"
#include "runtime/method/pipeline.h"

namespace infoflow {

// `hooks` (job sweep) go to the pipeline that runs: run_method on one rank, run_method_sp on
// more; other paths (ring, reform, `full` inside a distributed job) take none.
MethodResult run_request(Model& model, const PreparedRequest& req, const Config& cfg,
                         Communicator& comm, const std::vector<int32_t>& stop_ids,
                         const RunHooks& hooks = {});

}  // namespace infoflow
