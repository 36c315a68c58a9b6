// Selective recompute (docs/design.md §3.5): the selected tokens run through the layers; at each layer
// their new K/V are written into their cache slots first, then they attend over the whole cache
// with the exact mask key_pos <= query_pos. Unselected slots keep their chunk-local K/V.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/model/model.h"

namespace infoflow {

// `hidden` holds the rows' input to `first_layer` ([n, n_embd]); nullptr = their embeddings
// (first_layer must then be 0).
void recompute_selected(Model& model, KvCache& cache, const std::vector<int32_t>& slots,
                        const std::vector<int32_t>& tokens, const std::vector<int32_t>& pos,
                        const std::vector<int32_t>* group, int first_layer,
                        const float* hidden = nullptr);

}  // namespace infoflow
