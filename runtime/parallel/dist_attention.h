// Attention whose keys are spread over ranks (docs/design.md §5.2, §5.3): partial (out, lse) states over
// each rank's local keys, merged with the overflow-free LSE merge in rank order, so every rank
// computes bit-identical results regardless of message timing.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "kernels/backend.h"

namespace infoflow {

// Replicated rows (every rank has the same queries): all-gather every rank's partial state and
// merge them in rank order. out: [n_states, head_dim], lse: [n_states] (n_states = rows *
// n_head), replaced by the merged state on every rank.
void merge_partials_allgather(Communicator& comm, Backend& be, float* out, float* lse, int n_states,
                              int head_dim);

// Pass-Q (the "exact" exchange of §5.2): each rank owns `n_own` query rows. Queries (and their
// positions and groups) are all-gathered, every rank attends them over its local keys
// (`local` with q/q_pos/n_q/out/lse left for this function to fill), the partials go back to
// each query's owner with all-to-all-v and are merged in rank order.
// q_own: [n_own, n_head, head_dim] -> out_own: [n_own, n_head, head_dim], lse_own: [n_own, n_head]
void pass_q_attention(Communicator& comm, Backend& be, AttnParams local, const float* q_own,
                      const int32_t* pos_own, int n_own, float* out_own, float* lse_own);

}  // namespace infoflow
