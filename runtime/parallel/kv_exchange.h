// The per-layer K/V all-gather of the selected tokens (docs/design.md §5.2 phase 3): the rows
// each rank computed (or owns) travel, in the cache's storage type, into the same tokens' slots of
// every other rank's cache, so every copy is bit-identical. Used by the "kv" recompute and by the
// exchanges that build on it.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "kernels/backend.h"
#include "runtime/model/kv_cache.h"

namespace infoflow {

// The tokens of `lists[p]` (indices into `slot`) travel from rank p, read from its cache at a
// layer, to every other rank's cache; slot[i] is token i's slot on this rank.
class KvExchange {
  public:
    KvExchange(Communicator& comm, Backend& be, KvCache& cache, const std::vector<int32_t>& slot,
               const std::vector<std::vector<int>>& lists);
    // One all-gather of layer `layer`'s rows.
    void run(int layer);

  private:
    Communicator& comm_;
    Backend& be_;
    KvCache& cache_;
    size_t rb_;
    std::vector<std::vector<int32_t>> slots_;
    std::vector<size_t> bytes_;
    Buffer send_, gathered_;
};

}  // namespace infoflow
