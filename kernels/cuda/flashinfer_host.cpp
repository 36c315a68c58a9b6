// Host-side part of the FlashInfer attention kernels (plain C++, always built): tile and split
// arithmetic, and stand-ins that reject every call when the kernels were not compiled (CMake
// compiles flashinfer_attention*.cu only when it found FlashInfer's headers and CUDA, and then
// defines INFOFLOW_HAVE_FLASHINFER=1 on this file).
#include <algorithm>

#include "kernels/cuda/flashinfer_attention.h"
#include "runtime/core/error.h"

namespace infoflow {

FlashTile flashinfer_tile(int packed_rows, int head_dim, int smem_per_sm,
                          int smem_per_block_optin) {
    FlashTile t;
    t.cta_tile_q = packed_rows > 64 ? 128 : 16;
    // FlashInfer's layouts: CTA_TILE_Q 128 = 4 query warps x 1 KV warp, 2 MMA rows per warp;
    // CTA_TILE_Q 16 = 1 query warp x 4 KV warps, 1 MMA row.
    const int warps_kv = t.cta_tile_q == 16 ? 4 : 1;
    const int num_mma_q = t.cta_tile_q == 16 ? 1 : 2;
    const long fixed = long(t.cta_tile_q) * head_dim * 2;            // the bf16 Q tile
    const long per_mma_kv = long(2 * head_dim) * 16 * warps_kv * 2;  // bf16 K and V rows
    const int ctas_per_sm = smem_per_sm >= 2 * (fixed + per_mma_kv) ? 2 : 1;
    const long per_block = std::min<long>(smem_per_sm / ctas_per_sm, smem_per_block_optin);
    const long by_smem = (per_block - fixed) / per_mma_kv;
    const long by_regs = 8 / num_mma_q;
    const long fit = std::min(by_smem, by_regs);
    // Head dim 64 (4 MMA columns) needs an even NUM_MMA_KV; 2 and 4 are the instantiated ones.
    t.num_mma_kv = fit >= 4 ? 4 : (fit >= 2 ? 2 : 0);
    return t;
}

int flashinfer_split_chunks(int grid_blocks, int n_kv, int resident_blocks) {
    if (grid_blocks <= 0 || n_kv <= 0) return 1;
    const int max_chunks = resident_blocks / grid_blocks;
    if (max_chunks <= 1) return 1;
    const int chunk = std::max((n_kv + max_chunks - 1) / max_chunks, 256);
    return (n_kv + chunk - 1) / chunk;
}

bool flashinfer_supports_head_dim(int head_dim) {
    return flashinfer_built() && (head_dim == 64 || head_dim == 128);
}

#if INFOFLOW_HAVE_FLASHINFER
bool flashinfer_built() { return true; }
#else
bool flashinfer_built() { return false; }

size_t flashinfer_workspace_bytes(int, int, int, int, int) { return 0; }

void launch_flashinfer_prefill(const FlashAttnParams&, void*) {
    IF_FAIL(
        "FlashInfer attention not built: run launch/setup.sh (it unpacks FlashInfer's "
        "headers) and configure with CUDA and INFOFLOW_ENABLE_FLASHINFER=ON");
}

void launch_flashinfer_masked(const FlashAttnParams&, void*) {
    IF_FAIL(
        "FlashInfer attention not built: run launch/setup.sh (it unpacks FlashInfer's "
        "headers) and configure with CUDA and INFOFLOW_ENABLE_FLASHINFER=ON");
}
#endif

}  // namespace infoflow
