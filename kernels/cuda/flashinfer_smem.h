// Shared memory of one block of the FlashInfer prefill kernel as this project instantiates it
// (flashinfer_attention_impl.cuh: bf16 q/k/v, fp32 output, head dim 64 or 128, CTA_TILE_Q 16 with
// 4 KV warps or 128 with 1, NUM_MMA_KV 2 or 4), in plain constexpr C++ so the host launch plans
// (launch_plan.h) and their CPU tests know it. flashinfer_attention_impl.cuh static_asserts that
// it equals sizeof(the kernel's SharedStorage) for every instantiation, so it cannot drift from
// FlashInfer's headers unnoticed. The storage is a union of: the bf16 Q tile with one K and one V
// tile; the cross-warp merge of the attention states (several KV warps only); the fp32 output
// tile.
#pragma once

#include <cstddef>

namespace infoflow {

constexpr size_t flashinfer_smem_bytes(int cta_tile_q, int num_mma_kv, int head_dim) {
    const size_t q = size_t(cta_tile_q), d = size_t(head_dim);
    const size_t warps_kv = cta_tile_q == 16 ? 4 : 1;
    const size_t tile_kv = size_t(num_mma_kv) * 16 * warps_kv;
    const size_t qkv = 2 * d * (q + 2 * tile_kv);  // bf16
    // float o[warps_kv * q * min(d, 256)] and float2 md[warps_kv * q], each 16-byte aligned; a
    // single KV warp keeps one-element placeholders (16 + 8 bytes, padded to 32).
    const size_t sync =
        warps_kv == 1 ? 32 : 4 * warps_kv * q * (d > 256 ? 256 : d) + 8 * warps_kv * q;
    const size_t out = 4 * q * d;  // fp32
    const size_t m = qkv > sync ? (qkv > out ? qkv : out) : (sync > out ? sync : out);
    return (m + 15) / 16 * 16;
}

}  // namespace infoflow
