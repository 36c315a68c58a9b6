// REFORM on P ranks (docs/design.md §4.1, docs/reform.md): each rank runs phase 1 (compress,
// method/reform.h) on its own contiguous shard of the context, rank 0 (the last shard) also
// embeds the question and broadcasts its embeddings; every rank scores its own tokens and the
// score slices are all-gathered, so every rank pools (the window crosses shard edges: exact,
// no halo needed) and gathers the same set. Rank 0 holds every token id (the request is
// replicated) and runs phase 3 alone; the answer is broadcast.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "runtime/method/pipeline.h"

namespace infoflow {

MethodResult run_reform_sp(Model& model, const PreparedRequest& req, const Config& cfg,
                           Communicator& comm, const std::vector<int32_t>& stop_ids);

}  // namespace infoflow
