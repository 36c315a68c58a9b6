// The InfoFlow attention-norm criterion (docs/design.md §3.3): scoring rows (question or suffix
// tokens) run through layers 0..max(scoring layers) over the assembled, not-yet-recomputed context
// with keys at the positions of a layout; at each scoring layer the rows' attention probabilities
// over context columns are aggregated per column ("norm": sqrt of the sum over rows of the
// squared head-mean, averaged over layers; "sum": summed over layers, heads and rows). The
// probabilities are rebuilt block by block from the attention LSE, never materialized whole.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/config/config.h"
#include "runtime/method/chunk_kv.h"

namespace infoflow {

// Positions of the context slots (chunks placed in `order`) under a layout, and the position of
// the first scoring row.
struct LayoutPositions {
    std::vector<int32_t> key_pos;  // [T], in assembled order
    int32_t row_start = 0;
};
LayoutPositions layout_positions(Config::Layout layout, const std::vector<ChunkKv>& chunks,
                                 const std::vector<int>& order);

// Global positions of the context slots: chunk order[i] starts at the sum of the sizes before it.
std::vector<int32_t> global_positions(const std::vector<ChunkKv>& chunks,
                                      const std::vector<int>& order);

struct ScoreOptions {
    Config::Layout layout = Config::Layout::global;
    std::vector<int> layers;  // resolved scoring layers
    bool aggregate_sum = false;
    // scoring.value_norm: each layer's column score times the L2 norm of the column's value
    // row at that layer (all KV heads together): attended tokens that carry a near-zero value
    // move little information.
    bool value_norm = false;
};

// The L2 norm of the value rows of slots [first, first + n) of `layer` (host result).
std::vector<double> value_row_norms(Backend& be, const KvCache& cache, int layer, int first, int n);

// Scores of the T context slots (assembled order) for the scoring `rows` (token ids).
std::vector<double> score_context(Model& model, const std::vector<ChunkKv>& chunks,
                                  const std::vector<int>& order, const std::vector<int32_t>& rows,
                                  const ScoreOptions& opt);

// The same scores over a cache that already holds the T context slots at the layout's positions
// in its first T slots (the context cache of the global layout, with no visibility groups):
// the rows are appended at positions row_start.., run through layers 0..max(layers) and dropped
// again (the cache is truncated back to T), so no second copy of the context is assembled.
std::vector<double> score_assembled(Model& model, KvCache& cache, int T, int32_t row_start,
                                    const std::vector<int32_t>& rows, const ScoreOptions& opt);

// One layer's per-column attention aggregate of n query rows over the first n_cols slots of
// `cache` (the rows' probabilities rebuilt from their LSE over all their keys): per column, the sum
// over heads and rows of the probability (aggregate_sum) or of the squared head-mean (norm). `col`
// is device scratch of at least n_cols floats; the result is on the host. Used by the InfoFlow
// score tap and by REFORM's heavy-hitter statistics.
std::vector<float> layer_column_scores(Backend& be, Buffer& col, const ModelConfig& c,
                                       const KvCache& cache, int layer,
                                       const float* q /*[n, n_head, head_dim]*/,
                                       const float* lse /*[n, n_head]*/, int n,
                                       const int32_t* pos /*[n]*/, const int32_t* group /*[n]*/,
                                       int n_cols, bool aggregate_sum);

}  // namespace infoflow
