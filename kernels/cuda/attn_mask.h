// Bit-packed attention visibility mask in FlashInfer's custom-mask layout, built from per-token
// positions and optional groups (the AttnParams rule of kernels/backend.h): bit b = i*n_kv + j of
// the flat array (byte b/8, bit b%8, least significant first; rows are not padded) is set iff
// key j is visible to query i:
//   k_pos[j] <= q_pos[i] and (k_group == nullptr or k_group[j] < 0 or q_group[i] == k_group[j]).
// Positions need not be sorted. The same per-byte function runs on the host (attn_mask_build)
// and on the device (launch_attn_mask_build in attn_mask.cu), so the CPU tests check both's rule.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define IF_HOST_DEVICE __host__ __device__
#else
#define IF_HOST_DEVICE
#endif

namespace infoflow {

struct MaskSpec {
    const int32_t* q_pos = nullptr;    // [n_q]
    const int32_t* k_pos = nullptr;    // [n_kv]
    const int32_t* q_group = nullptr;  // [n_q] or nullptr (then k_group must be nullptr too)
    const int32_t* k_group = nullptr;  // [n_kv] or nullptr; a negative group = seen by all
    int n_q = 0;
    int n_kv = 0;
};

inline size_t attn_mask_bytes(int n_q, int n_kv) {
    return (static_cast<size_t>(n_q) * static_cast<size_t>(n_kv) + 7) / 8;
}

IF_HOST_DEVICE inline bool attn_visible(const MaskSpec& s, int i, int j) {
    if (s.k_pos[j] > s.q_pos[i]) return false;
    if (s.k_group == nullptr) return true;
    const int32_t g = s.k_group[j];
    return g < 0 || s.q_group[i] == g;
}

// Byte `byte_idx` of the mask: its 8 bits cover flat pairs 8*byte_idx .. 8*byte_idx+7 (the last
// byte may be partly past the end; those bits are 0).
IF_HOST_DEVICE inline uint8_t attn_mask_byte(const MaskSpec& s, size_t byte_idx) {
    const size_t total = static_cast<size_t>(s.n_q) * static_cast<size_t>(s.n_kv);
    uint8_t bits = 0;
    for (int b = 0; b < 8; ++b) {
        const size_t flat = byte_idx * 8 + static_cast<size_t>(b);
        if (flat >= total) break;
        const int i = static_cast<int>(flat / static_cast<size_t>(s.n_kv));
        const int j = static_cast<int>(flat % static_cast<size_t>(s.n_kv));
        if (attn_visible(s, i, j)) bits = static_cast<uint8_t>(bits | (1u << b));
    }
    return bits;
}

// Host pointers. Fills bits[0 .. attn_mask_bytes(n_q, n_kv)); n_visible[i] (optional) = keys
// query i sees (0 = a fully masked row: out 0, lse -inf).
void attn_mask_build(const MaskSpec& s, uint8_t* bits /*[attn_mask_bytes(n_q, n_kv)]*/,
                     int32_t* n_visible /*[n_q] or nullptr*/);
// Reads bit (i, j) of a mask built for n_kv keys.
inline bool attn_mask_get(const uint8_t* bits, int n_kv, int i, int j) {
    const size_t flat = static_cast<size_t>(i) * static_cast<size_t>(n_kv) + static_cast<size_t>(j);
    return (bits[flat / 8] >> (flat % 8)) & 1u;
}

// Device version (attn_mask.cu, CUDA builds only): every pointer in `s` and `bits` on the
// device; `stream` is a cudaStream_t.
void launch_attn_mask_build(const MaskSpec& s, uint8_t* bits /*[attn_mask_bytes(n_q, n_kv)]*/,
                            void* stream);

}  // namespace infoflow
