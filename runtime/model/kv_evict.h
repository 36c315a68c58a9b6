// KV-cache compression for the recurrent chunked forward of REFORM and its baselines
// (docs/design.md §4.1, docs/reform.md): which slots a compression keeps (H2O heavy hitters +
// recent window, or StreamingLLM sinks + recent window) and the compaction itself. The cache
// holds one contiguous sequence, slot s at position s in every layer; a compaction keeps `keep`
// slots per layer (each layer its own set, all of one size), moves them to slots 0..k-1 in
// their order and re-rotates their keys to positions 0..k-1, so the invariant holds afterwards
// and the cache never needs more positions than budget + chunk.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/model/model.h"

namespace infoflow {

// H2O: of `n` slots keep the last min(recent, budget) and, among the others, the
// budget - recent with the largest accumulated attention `score` (ties: the lower slot).
// All n when n <= budget. Returned sorted.
std::vector<int> heavy_hitters(const std::vector<double>& score /*[n]*/, int n, int budget,
                               int recent);

// StreamingLLM: the first min(sink, budget) slots and the last budget - sink. All n when
// n <= budget. Returned sorted.
std::vector<int> sink_and_recent(int n, int budget, int sink);

// Compacts layer `layer`: slot keep[i] -> slot i, its key re-rotated from position keep[i] to
// i. `keep` is sorted and unique. Call for every layer, then `finish_compaction`.
void compact_layer(Model& model, KvCache& cache, int layer, const std::vector<int>& keep);
// Positions 0..k-1 for the first k slots, the rest dropped.
void finish_compaction(KvCache& cache, int k);

}  // namespace infoflow
