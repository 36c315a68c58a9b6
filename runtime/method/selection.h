// Which context tokens are recomputed (docs/design.md §3.4, §3.7, §4): top-k by score with ties to the
// lower position, EPIC's per-chunk leading tokens, and the reorder of chunks by informativeness.
#pragma once

#include <cstdint>
#include <vector>

namespace infoflow {

// k = floor(ratio * T).
int recompute_budget(double ratio, int T);

// The k eligible slots with the largest scores (ties: lower position first), returned sorted by
// position. Fewer when fewer are eligible.
std::vector<int> select_top_k(const std::vector<double>& score /*[T]*/,
                              const std::vector<int32_t>& pos /*[T]*/,
                              const std::vector<uint8_t>& eligible /*[T]*/, int k);

// EPIC: the first tokens of every chunk >= 1, floor(ratio*|C|) each (ratio mode) or min(k, |C|)
// (fixed mode). `chunk_begin`/`chunk_size` describe the chunks in slot order; the chunk whose
// id is 0 is skipped. Returns slots sorted.
std::vector<int> epic_selection(const std::vector<int>& chunk_id,
                                const std::vector<int>& chunk_begin,
                                const std::vector<int>& chunk_size, bool fixed, double ratio,
                                int k);

// CacheBlend's deviation per token: d_j = sum over heads and dims of (fresh - cached)^2.
std::vector<double> kv_deviation(const float* fresh /*[n, row]*/, const float* cached /*[n, row]*/,
                                 int n, int row);

// Reorder (§3.7): f_c = |S ∩ C_c| / |C_c| for chunks 1..K; returns the new chunk order: chunk 0
// first, then chunks 1..K stably sorted by ascending f_c. `slot_chunk` maps a slot to its chunk
// in the current (identity) order.
std::vector<int> reorder_by_selection(const std::vector<int>& selected,
                                      const std::vector<int>& slot_chunk,
                                      const std::vector<int>& chunk_size);

}  // namespace infoflow
