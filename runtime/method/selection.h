// Which context tokens are recomputed (docs/design.md §3.4, §3.7, §4): top-k by score with ties to
// the lower position, EPIC's per-chunk leading tokens, and the reorder of chunks by
// informativeness.
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

// InfoFlow's selection options (scoring.span, scoring.chunk_decay, scoring.chunk_floor;
// docs/quality.md "Selection variants"). All zero: plain top-k.
struct SelectOptions {
    int span = 0;              // scores max-pooled over +-span slots of the same chunk
    double chunk_decay = 0.0;  // the m-th best token of a chunk (m = 0, 1, ..) counts 1/(1+d*m)
    double chunk_floor = 0.0;  // share of k reserved as per-chunk quotas
    bool plain() const { return span == 0 && chunk_decay == 0.0 && chunk_floor == 0.0; }
};

// The k eligible slots InfoFlow recomputes, sorted by position. In order: (1) each eligible
// slot's score becomes the largest score of the eligible slots within `span` of it in the same
// chunk (slot_chunk; a chunk's slots are contiguous); (2) within each chunk the slots are ranked
// by that score (ties: lower position) and the m-th is weighted 1 / (1 + chunk_decay * m);
// (3) F = floor(chunk_floor * k) slots are reserved as quotas: chunk c gets
// min(n_c, max(1, floor(F * n_c / N))) of its best slots (n_c its eligible slots, N all), and
// when F > 0 the quotas are taken first (the best of them if they exceed k), the rest of k by
// global rank. Ranks compare weighted scores, ties to the lower position. All options zero =
// select_top_k.
std::vector<int> select_infoflow(const std::vector<double>& score /*[T]*/,
                                 const std::vector<int32_t>& pos /*[T]*/,
                                 const std::vector<uint8_t>& eligible /*[T]*/,
                                 const std::vector<int>& slot_chunk /*[T]*/, int k,
                                 const SelectOptions& opt);

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
