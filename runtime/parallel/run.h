// One request through any method on the ranks of a communicator: the single-rank pipeline on
// one rank (or for `full`, which runs on rank 0 alone: the "single-GPU" column), ring
// attention, or the sequence-parallel pipeline.
#pragma once

#include "comm/communicator.h"
#include "runtime/method/pipeline.h"

namespace infoflow {

// `hooks`: on one rank every RunHooks field (run_method); on P ranks `on_token` (called on rank
// 0; job serve streams with it and ends generations with it) everywhere but reform, and job
// sweep's hooks with the sequence-parallel methods only (run_method_sp); the others must be
// empty.
MethodResult run_request(Model& model, const PreparedRequest& req, const Config& cfg,
                         Communicator& comm, const std::vector<int32_t>& stop_ids,
                         const RunHooks& hooks = {});

}  // namespace infoflow
