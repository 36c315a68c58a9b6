#include "runtime/method/recompute.h"

#include "runtime/core/error.h"

namespace infoflow {

void recompute_selected(Model& model, KvCache& cache, const std::vector<int32_t>& slots,
                        const std::vector<int32_t>& tokens, const std::vector<int32_t>& pos,
                        const std::vector<int32_t>* group, int first_layer, const float* hidden) {
    const int n = int(slots.size());
    if (n == 0) return;
    IF_CHECK(tokens.size() == slots.size() && pos.size() == slots.size(),
             "recompute: slots, tokens and positions differ in size");
    IF_CHECK(hidden != nullptr || first_layer == 0,
             "recompute from layer " << first_layer << " needs hidden states");
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    Buffer h = be.alloc_floats(size_t(n) * c.n_embd);
    if (hidden) {
        be.copy(h.data(), hidden, size_t(n) * c.n_embd * sizeof(float));
    } else {
        model.embed(tokens.data(), n, h.data());
    }
    for (int l = first_layer; l < c.n_layer; ++l) {
        // In pieces of rows between job serve's decode steps (pieces.h), the same bits.
        model.layer_forward_pieces(l, h.data(), n, pos.data(), group ? group->data() : nullptr,
                                   slots.data(), cache);
    }
}

}  // namespace infoflow
