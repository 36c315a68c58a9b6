// Launch plans of the CUDA backend, in plain C++ so they are tested on any machine: for every
// kernel the backend launches, the grid, block and shared memory its launcher uses (the .cu
// launchers take their dimensions from these functions), the FlashInfer tile / split-KV plan with
// its workspace, the scratch layout of one FlashInfer attention call, and the 32-bit index
// arithmetic the kernels rely on. tests/gpu_flashinfer/host/test_launch_plan.cpp checks them for
// the paper's shapes against the H200's limits (h200_limits()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/backend.h"
#include "kernels/cuda/flashinfer_attention.h"

namespace infoflow {

// What a launch must respect on one device (cudaDeviceProp / cudaDevAttr* figures).
struct DeviceLimits {
    int max_threads_per_block = 1024;
    int64_t max_grid_x = 2147483647;  // 2^31 - 1
    int max_grid_yz = 65535;
    int smem_default = 48 * 1024;  // dynamic + static shared memory without opting in
    int smem_optin = 0;            // cudaDevAttrMaxSharedMemoryPerBlockOptin
    int smem_per_sm = 0;           // cudaDevAttrMaxSharedMemoryPerMultiprocessor
    int num_sm = 0;
    int max_threads_per_sm = 2048;
    int max_blocks_per_sm = 32;
};
// H200 (and H100 SXM), compute capability 9.0: 227 KiB per block opted in, 228 KiB per SM,
// 132 SMs.
DeviceLimits h200_limits();

// One kernel launch.
struct LaunchDims {
    const char* kernel = "";
    uint64_t grid[3] = {1, 1, 1};
    unsigned block[3] = {1, 1, 1};
    size_t dyn_smem = 0;     // bytes of dynamic shared memory
    size_t static_smem = 0;  // bytes of __shared__ arrays
    bool opt_in = false;     // the launcher raises cudaFuncAttributeMaxDynamicSharedMemorySize
    uint64_t blocks() const { return grid[0] * grid[1] * grid[2]; }
    uint64_t threads() const { return uint64_t(block[0]) * block[1] * block[2]; }
};
// Empty when `l` can launch on `d`; otherwise what breaks a limit.
std::string launch_violation(const LaunchDims& l, const DeviceLimits& d);

// ---- the backend's own kernels (elementwise.cu, attention.cu, attn_mask.cu) ----
// Grid-stride kernels over n elements (cast, fill, embed, rope, swiglu, add, bias): 256 threads,
// at most 65536 blocks (the loop covers the rest), at least one.
LaunchDims plan_grid_stride(const char* kernel, size_t n);
// One block of 256 threads per row (rms_norm; 1 KiB of partial sums).
LaunchDims plan_rms_norm(int rows);
// One thread per row (lse_merge).
LaunchDims plan_lse_merge(int rows);
// The own attention kernel: one block of 128 threads per (query, head); static q, p and
// reduction arrays.
LaunchDims plan_attention_own(int n_q, int n_head);
// attention_scores: one thread per column, 128 per block; one query row and its LSE in dynamic
// shared memory (n_head * (head_dim + 1) floats, never opted in: kMaxScoreSharedFloats).
LaunchDims plan_attention_scores(int n_cols, int n_head, int head_dim);
// The custom mask build: one thread per mask byte.
LaunchDims plan_mask_build(int n_q, int n_kv);

// ---- FlashInfer (flashinfer_attention.cu) ----
struct FlashPlan {
    FlashTile tile;
    int num_chunks = 1;    // split-KV chunks (1: no split)
    LaunchDims attn;       // FlashInfer's prefill kernel
    LaunchDims epilogue;   // merge of the chunks (split) or the log2 -> ln LSE conversion
    size_t workspace = 0;  // bytes of split-KV partials (0 without a split)
};
// The plan of one call: `tile` from flashinfer_tile(), `resident_blocks` the blocks of that
// tile's kernel the device holds at once (its occupancy per SM, which the launcher asks the
// device for and tests bound, times the SMs); 0 plans no split.
FlashPlan flashinfer_plan(int n_q, int n_kv, int n_head, int n_head_kv, int head_dim,
                          const FlashTile& tile, int resident_blocks);
// Resident blocks per SM of a tile's kernel as shared memory and threads allow (registers not
// counted): an upper bound of what the occupancy API answers.
int flashinfer_blocks_per_sm_bound(const FlashTile& tile, int head_dim, const DeviceLimits& d);
// Empty when every index FlashInfer forms in 32 bits for this call (element offsets of q, k, v
// and of the output or its split partials, packed query rows) fits, and the custom mask's bit
// count fits 64 bits; otherwise which one overflows.
std::string flashinfer_index_violation(int n_q, int n_kv, int n_head, int n_head_kv, int head_dim,
                                       int kv_stride, int num_chunks);

// True when FlashInfer can read K/V rows where they are: bf16, 16-byte aligned, a row stride
// (in elements) that is a multiple of 8. Otherwise the backend stages them as packed bf16.
bool flash_kv_in_place(KvDtype kv_dtype, const void* k, const void* v, int kv_stride);

// Scratch of one FlashInfer attention call of the CUDA backend (cuda_backend.cpp): q cast to
// bf16, k and v as packed bf16 rows unless they are read in place, the custom mask, the split-KV
// workspace; each part starts on a 256-byte boundary.
struct FlashScratch {
    size_t q = 0, k = 0, v = 0, mask = 0, workspace = 0;  // offsets
    size_t q_bytes = 0, kv_bytes = 0, mask_bytes = 0, workspace_bytes = 0;
    size_t total = 0;
    bool stage_kv = true;  // false: FlashInfer reads the cache's bf16 rows in place
};
FlashScratch plan_flash_scratch(int n_q, int n_kv, int n_head, int n_head_kv, int head_dim,
                                bool kv_in_place, bool masked, size_t workspace_bytes);

}  // namespace infoflow
