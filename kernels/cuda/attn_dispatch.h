// Which GPU attention kernel computes a given attention call exactly (plain C++, no CUDA): the
// FlashInfer kernels of flashinfer_attention.h where their rule equals the AttnParams rule of
// kernels/backend.h, else the backend's own kernel. Decided from host copies of the positions
// and groups, in O(n_q log n_kv + n_kv).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace infoflow {

enum class AttnKernel {
    kFlashCausal,  // launch_flashinfer_prefill, n_q > 1
    kFlashDecode,  // launch_flashinfer_prefill with n_q == 1 (every key visible), split-KV
    kFlashMasked,  // attn_mask build + launch_flashinfer_masked
    kOwn,          // the backend's own attention kernel
};

const char* attn_kernel_name(AttnKernel k);

struct AttnDispatchInput {
    const int32_t* q_pos = nullptr;    // host [n_q]
    const int32_t* k_pos = nullptr;    // host [n_kv]
    const int32_t* q_group = nullptr;  // host [n_q] or nullptr
    const int32_t* k_group = nullptr;  // host [n_kv] or nullptr
    int n_q = 0;
    int n_kv = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int head_dim = 0;
    bool flashinfer_built = false;  // flashinfer_built() of this build
    // Largest custom mask (bytes, attn_mask_bytes) the caller will hold; larger goes kOwn.
    size_t max_mask_bytes = size_t(256) << 20;
};

struct AttnDispatch {
    AttnKernel kernel = AttnKernel::kOwn;
    std::string reason;     // why: one short phrase, for logs and test messages
    size_t mask_bytes = 0;  // kFlashMasked: bytes of the custom mask
};

// The rule: kOwn when FlashInfer is not built, the head dim is not 64/128, the head counts do not
// divide, a size is zero, or key groups come without query groups. Groups are "trivial" when every
// key's group is negative or equal to the single group all queries share; non-trivial groups need
// the mask. With trivial groups and keys sorted by position (non-decreasing), query i sees the key
// prefix of length c_i = #{j : k_pos[j] <= q_pos[i]}; when c_i = n_kv - n_q + 1 + i for every i,
// that is FlashInfer's bottom-right causal rule: kFlashCausal. One query row that sees every key
// (any key order): kFlashDecode. Everything else: kFlashMasked when the mask fits max_mask_bytes,
// else kOwn.
AttnDispatch attn_dispatch(const AttnDispatchInput& in);

}  // namespace infoflow
