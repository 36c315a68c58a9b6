// Placement of context chunks on ranks (docs/design.md §5.1): contiguous, token-balanced shards; shards
// are assigned from the tail, so rank 0 (the decode rank) holds the shard next to the suffix.
// Chunk 0 and the suffix are replicated on every rank.
#pragma once

#include <vector>

namespace infoflow {

struct Placement {
    int n_ranks = 1;
    std::vector<int> chunk_rank;    // [n_chunks]: owner of chunk i >= 1; -1 for chunk 0
    std::vector<int> first_chunk;   // [n_ranks]: the rank's chunks are [first_chunk, end_chunk)
    std::vector<int> end_chunk;     // [n_ranks]
    std::vector<int> shard_tokens;  // [n_ranks]
};

// chunk_sizes[0] is chunk 0 (replicated); chunks 1..K are dealt to `n_ranks` shards in position
// order, minimizing the largest shard (ties: the earlier cut), shard s going to rank P-1-s.
// Ranks may get no chunk when K < P.
Placement place_chunks(const std::vector<int>& chunk_sizes, int n_ranks);

}  // namespace infoflow
