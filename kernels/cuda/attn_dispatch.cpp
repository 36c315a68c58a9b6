// Choice of the GPU attention kernel (see attn_dispatch.h).
#include "kernels/cuda/attn_dispatch.h"

#include <algorithm>

#include "kernels/cuda/attn_mask.h"

namespace infoflow {

const char* attn_kernel_name(AttnKernel k) {
    switch (k) {
        case AttnKernel::kFlashCausal:
            return "flashinfer-causal";
        case AttnKernel::kFlashDecode:
            return "flashinfer-decode";
        case AttnKernel::kFlashMasked:
            return "flashinfer-masked";
        case AttnKernel::kOwn:
            return "own";
    }
    return "?";
}

namespace {

AttnDispatch own(const std::string& why) {
    AttnDispatch d;
    d.kernel = AttnKernel::kOwn;
    d.reason = why;
    return d;
}

// Every key visible to every query as far as groups go.
bool groups_trivial(const AttnDispatchInput& in) {
    if (in.k_group == nullptr) return true;
    if (in.n_q == 0) return true;
    const int32_t g = in.q_group[0];
    for (int i = 1; i < in.n_q; ++i) {
        if (in.q_group[i] != g) {
            // Queries of different groups: trivial only if no key is group-restricted.
            return std::all_of(in.k_group, in.k_group + in.n_kv, [](int32_t x) { return x < 0; });
        }
    }
    return std::all_of(in.k_group, in.k_group + in.n_kv,
                       [g](int32_t x) { return x < 0 || x == g; });
}

// Keys sorted by position and each query's visible prefix one longer than the previous row's,
// ending at n_kv: FlashInfer's bottom-right causal rule equals `k_pos <= q_pos`.
bool is_bottom_right_causal(const AttnDispatchInput& in) {
    if (in.n_kv < in.n_q) return false;
    if (!std::is_sorted(in.k_pos, in.k_pos + in.n_kv)) return false;
    const long offset = static_cast<long>(in.n_kv) - in.n_q;
    for (int i = 0; i < in.n_q; ++i) {
        const long c = std::upper_bound(in.k_pos, in.k_pos + in.n_kv, in.q_pos[i]) - in.k_pos;
        if (c != offset + 1 + i) return false;
    }
    return true;
}

}  // namespace

AttnDispatch attn_dispatch(const AttnDispatchInput& in) {
    if (!in.flashinfer_built) return own("FlashInfer not built");
    if (in.head_dim != 64 && in.head_dim != 128) {
        return own("head_dim " + std::to_string(in.head_dim) + " not instantiated (64, 128)");
    }
    if (in.n_head <= 0 || in.n_head_kv <= 0 || in.n_head % in.n_head_kv != 0) {
        return own("head counts " + std::to_string(in.n_head) + "/" + std::to_string(in.n_head_kv) +
                   " not a GQA grouping");
    }
    if (in.n_q <= 0 || in.n_kv <= 0) return own("empty attention");
    if (in.k_group != nullptr && in.q_group == nullptr) {
        return own("key groups given without query groups");
    }
    const bool trivial = groups_trivial(in);
    if (trivial && in.n_q == 1 &&
        std::all_of(in.k_pos, in.k_pos + in.n_kv, [&](int32_t p) { return p <= in.q_pos[0]; })) {
        AttnDispatch d;
        d.kernel = AttnKernel::kFlashDecode;
        d.reason = "one query row, every key visible";
        return d;
    }
    if (trivial && is_bottom_right_causal(in)) {
        AttnDispatch d;
        d.kernel = AttnKernel::kFlashCausal;
        d.reason = "queries are the last rows of a position-sorted sequence";
        return d;
    }
    const size_t bytes = attn_mask_bytes(in.n_q, in.n_kv);
    if (bytes > in.max_mask_bytes) {
        return own("custom mask of " + std::to_string(bytes) + " bytes over the limit of " +
                   std::to_string(in.max_mask_bytes));
    }
    AttnDispatch d;
    d.kernel = AttnKernel::kFlashMasked;
    d.reason =
        trivial ? "positions not a bottom-right causal layout" : "groups restrict visibility";
    d.mask_bytes = bytes;
    return d;
}

}  // namespace infoflow
