// Host construction of the bit-packed visibility mask (see attn_mask.h).
#include "kernels/cuda/attn_mask.h"

#include "runtime/core/error.h"

namespace infoflow {

void attn_mask_build(const MaskSpec& s, uint8_t* bits, int32_t* n_visible) {
    IF_CHECK(s.n_q >= 0 && s.n_kv >= 0,
             "attn_mask_build: negative size n_q=" << s.n_q << " n_kv=" << s.n_kv);
    IF_CHECK((s.n_q == 0 || s.q_pos) && (s.n_kv == 0 || s.k_pos),
             "attn_mask_build: positions missing");
    IF_CHECK(s.k_group == nullptr || s.q_group != nullptr,
             "attn_mask_build: key groups given without query groups");
    const size_t n_bytes = attn_mask_bytes(s.n_q, s.n_kv);
    for (size_t b = 0; b < n_bytes; ++b) bits[b] = attn_mask_byte(s, b);
    if (n_visible) {
        for (int i = 0; i < s.n_q; ++i) {
            int32_t c = 0;
            for (int j = 0; j < s.n_kv; ++j) c += attn_visible(s, i, j) ? 1 : 0;
            n_visible[i] = c;
        }
    }
}

}  // namespace infoflow
