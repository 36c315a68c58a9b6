// Ring attention (docs/design.md §5.4): exact causal prefill of the whole sequence (context +
// suffix) over P ranks. Each rank holds a shard of the sequence ("zigzag": 2P blocks, rank r holds
// blocks r and 2P-1-r; "contiguous": rank r holds block P-1-r, so rank 0 always holds the last
// position); per layer the K/V blocks travel P-1 steps around the ring with non-blocking
// send/recv overlapped with the current block's attention, partial states LSE-merged. K/V move
// in the KV cache's storage type (model.kv_dtype: f16/bf16 halve the bytes).
// ring.exchange = "allgather" all-gathers K/V per layer instead (the authors' baseline). The
// first answer token comes from the last position's state on rank 0; decode is distributed.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "runtime/method/pipeline.h"

namespace infoflow {

// Token indices (positions) of each rank's shard of a sequence of n tokens.
std::vector<std::vector<int32_t>> ring_shards(int n, int n_ranks, bool zigzag);

// What the ring's prefill ("p2p") moves on each rank, bytes sent plus received ([n_ranks]), as
// the communicator counts them (comm/communicator.h): per layer P - 1 steps, at step s rank r
// sending the block of rank r - s and receiving that of rank r - s - 1 (mod P), each block its
// shard's K and V rows of `row_bytes`. The reference the exchanges' bytes are held to
// (docs/quality.md, "P ranks").
std::vector<uint64_t> ring_prefill_bytes(int n, int n_ranks, bool zigzag, size_t row_bytes,
                                         int n_layer);

MethodResult run_ring(Model& model, const PreparedRequest& req, const Config& cfg,
                      Communicator& comm, const std::vector<int32_t>& stop_ids,
                      const TokenCallback& on_token = {});

}  // namespace infoflow
