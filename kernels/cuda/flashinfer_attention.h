// Attention on the GPU through FlashInfer's header-only FA2 prefill kernel (CUDA-free header;
// the kernels live in flashinfer_attention*.cu, built only when CMake found FlashInfer's headers
// and CUDA, see INFOFLOW_HAVE_FLASHINFER). bf16 q/k/v on the device, fp32 output and fp32
// natural-log LSE (docs/design.md §5.3): FlashInfer returns a log2-based LSE, converted here.
//
// Which case uses which FlashInfer mode (attn_dispatch.h decides):
//   launch_flashinfer_prefill: dense causal, bottom-right aligned: query i sees keys
//       j <= i + (n_kv - n_q). Exact only where that IS the visibility rule, i.e. the queries are
//       the last n_q rows of the key sequence (attn_dispatch checks it from the positions).
//       Decode (one query row that sees every key) is this case with n_q = 1; the split-KV path
//       (FlashInfer's kernel over key chunks, partials merged by our kernel; the workspace
//       below) gives it parallelism over the keys.
//   launch_flashinfer_masked: any visibility (the exact `key_pos <= query_pos` rule for
//       unsorted positions, groups for shard visibility) as FlashInfer's bit-packed custom mask
//       [n_q, n_kv] (attn_mask.h builds it). The mask is shared by all heads.
// Every visibility rule of AttnParams is expressible (the custom mask carries positions and
// groups). Left to the backend's own kernel: head dims other than 64 and 128 (not instantiated,
// to keep the build short), and masks too large for the caller's memory budget (n_q*n_kv/8
// bytes). These are FlashInfer's FA2 kernels, run on sm_90; its Hopper (FA3) kernels need the
// CUTLASS/CuTe headers and much longer compiles and are not used.
// A query that sees no key gets out = 0 and lse = -inf, as in the CPU backend.
#pragma once

#include <cstddef>
#include <cstdint>

namespace infoflow {

struct FlashAttnParams {
    const void* q = nullptr;        // bf16 [n_q, n_head, head_dim]
    const void* k = nullptr;        // bf16 [n_kv, kv_stride] (kv head hk at offset hk*head_dim)
    const void* v = nullptr;        // bf16 [n_kv, kv_stride]
    const uint8_t* mask = nullptr;  // [attn_mask_bytes(n_q, n_kv)] custom mask (masked only)
    int n_q = 0;
    int n_kv = 0;
    int n_head = 0;
    int n_head_kv = 0;     // n_head % n_head_kv == 0 (GQA: head h reads kv head h / group)
    int head_dim = 0;      // 64 or 128
    int kv_stride = 0;     // elements between consecutive tokens of k and v; 0 = n_head_kv*head_dim
    float scale = 0.0f;    // 0 = 1/sqrt(head_dim)
    float* out = nullptr;  // fp32 [n_q, n_head, head_dim]
    float* lse = nullptr;  // fp32 [n_q, n_head] natural log; optional
    // Device scratch for the split-KV path (few query rows, many keys); nullptr or fewer than
    // flashinfer_workspace_bytes() bytes runs without the split.
    void* workspace = nullptr;
    size_t workspace_bytes = 0;
};

// True when the FlashInfer kernels were compiled into this build.
bool flashinfer_built();
// True when FlashInfer kernels exist for this head dim in this build (64 and 128).
bool flashinfer_supports_head_dim(int head_dim);

// Tile shape of a launch, chosen like FlashInfer chooses it: CTA_TILE_Q 128 when the packed
// query rows (n_q * n_head / n_head_kv) exceed 64, else 16; NUM_MMA_KV (4 or 2) the largest that
// keeps two blocks per SM within the device's shared memory and the register budget.
// num_mma_kv = 0: the device's shared memory is too small for this head dim.
struct FlashTile {
    int cta_tile_q = 128;
    int num_mma_kv = 4;
};
FlashTile flashinfer_tile(int packed_rows, int head_dim, int smem_per_sm, int smem_per_block_optin);
// KV chunks of the split-KV path, as FlashInfer counts them: as many as the device's idle
// resident blocks allow (resident_blocks = blocks per SM * SMs) with chunks of >= 256 keys;
// 1 = no split.
int flashinfer_split_chunks(int grid_blocks /*q tiles * n_head_kv*/, int n_kv, int resident_blocks);

// Device scratch for the split-KV path on the current device (0 where there is no split: many
// query rows already fill the device). Pointer/size go to FlashAttnParams::workspace*.
size_t flashinfer_workspace_bytes(int n_q, int n_kv, int n_head, int n_head_kv, int head_dim);

// All pointers are device pointers; `stream` is a cudaStream_t (nullptr = default stream).
// Errors (unsupported shape, CUDA launch failure) throw infoflow::Error naming the case.
void launch_flashinfer_prefill(const FlashAttnParams& p, void* stream);  // dense causal
void launch_flashinfer_masked(const FlashAttnParams& p, void* stream);   // custom mask

}  // namespace infoflow
