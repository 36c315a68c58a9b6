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

// parallel.placement = "tokens" (docs/design.md §5.1): where context chunks 1..K must be cut so
// that `n_ranks` shards of even token counts exist. Shard edge s (0 < s < P) lies at
// round(s * C / P) of the C context tokens; an edge within max(1, C / (50 P)) tokens of an
// existing chunk boundary moves onto it (no sliver chunks; a shard stays within 2 % of C / P),
// otherwise the chunk that straddles it is cut there. Returns, per chunk (index 0 = chunk 0,
// never cut), the cut offsets inside it in increasing order; empty = chunk kept whole.
std::vector<std::vector<int>> shard_edge_cuts(const std::vector<int>& chunk_sizes, int n_ranks);

}  // namespace infoflow
