// Private to the flashinfer_attention*.cu files: the interface between the launcher
// (flashinfer_attention.cu) and the kernel instantiations (flashinfer_attention_hd<D>_<mask>.cu,
// via flashinfer_attention_impl.cuh), so the launcher's TU does not compile the kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <flashinfer/attention/mask.cuh>

#include "kernels/cuda/flashinfer_attention.h"

namespace infoflow {
namespace flashinfer_detail {

// One launch: either whole (o = p.out, lse2 = log2 LSE or nullptr) or split into `num_chunks`
// KV chunks (o = partials [n_q, num_chunks, n_head, head_dim], lse2 = [n_q, num_chunks, n_head]).
// grid, block and smem come from the host launch plan (launch_plan.h, flashinfer_plan); the
// kernel checks them against its own traits before launching.
struct Launch {
    const FlashAttnParams* p = nullptr;
    float* o = nullptr;
    float* lse2 = nullptr;
    uint32_t num_chunks = 1;
    uint32_t grid[3] = {1, 1, 1};
    uint32_t block[3] = {1, 1, 1};
    size_t smem = 0;
};

// Tile shape of a launch: CTA_TILE_Q (16 or 128) and NUM_MMA_KV (2 or 4).
struct Tile {
    uint32_t cta_tile_q = 128;
    uint32_t num_mma_kv = 4;
};

template <uint32_t HEAD_DIM, flashinfer::MaskMode MODE>
cudaError_t launch(const Launch& l, const Tile& t, cudaStream_t stream);
// Blocks of the kernel for this tile that one SM holds at once (for the split-KV decision).
template <uint32_t HEAD_DIM, flashinfer::MaskMode MODE>
int blocks_per_sm(const Tile& t);

}  // namespace flashinfer_detail
}  // namespace infoflow
