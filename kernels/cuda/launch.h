// Launchers of the CUDA kernels (kernels/cuda/*.cu), CUDA-free so host code of any world can
// include it. Every pointer is device memory (index arrays already staged by the backend);
// `stream` is a cudaStream_t. bf16 values travel as their uint16 bit patterns. Launchers check
// the launch and throw infoflow::Error with file:line on failure.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/backend.h"

namespace infoflow::cuda {

// Threads per block of the kernels (their launch plans, launch_plan.h, use the same numbers):
// grid-stride and per-row kernels, the own attention kernel (keys per tile), attention_scores
// (columns per block).
constexpr int kThreads = 256;
constexpr int kAttnThreads = 128;
constexpr int kScoreThreads = 128;

// out[i] = bf16(x[i]), round to nearest even.
struct CastBf16Params {
    const float* x = nullptr;  // [n]
    uint16_t* out = nullptr;   // [n]
    size_t n = 0;
};
void launch_cast_bf16(const CastBf16Params& p, void* stream);

// out[r, c] = bf16(x[r * x_stride + c]) for c < cols: strided rows (a KV cache slice) cast into
// a packed bf16 block, round to nearest even. The rows are fp32 (x) or, for a 16-bit cache, x16
// in x_dtype (f16 widened exactly, then rounded; bf16 copied).
struct CastRowsBf16Params {
    const float* x = nullptr;       // [rows, x_stride] fp32, or nullptr when x16 is given
    const uint16_t* x16 = nullptr;  // [rows, x_stride] f16 / bf16 bits
    KvDtype x_dtype = KvDtype::f32;
    size_t x_stride = 0;      // elements between rows of x, >= cols
    uint16_t* out = nullptr;  // [rows, cols]
    size_t rows = 0;
    size_t cols = 0;
};
void launch_cast_rows_bf16(const CastRowsBf16Params& p, void* stream);

// The KV cache's element conversions (Backend::narrow_kv / widen_kv): dst[i] = src[i] in type t
// (round to nearest even), and back (exact). t is f16 or bf16.
struct KvConvertParams {
    KvDtype t = KvDtype::bf16;
    size_t n = 0;
    const float* src = nullptr;       // narrow: [n]
    uint16_t* dst = nullptr;          // narrow: [n]
    const uint16_t* src16 = nullptr;  // widen: [n]
    float* dst32 = nullptr;           // widen: [n]
};
void launch_kv_narrow(const KvConvertParams& p, void* stream);
void launch_kv_widen(const KvConvertParams& p, void* stream);

// out[i] = bf16(random_weight(key, i, scale)) (kernels/random_init.h).
struct FillRandomParams {
    uint16_t* out = nullptr;  // [n]
    size_t n = 0;
    uint64_t key = 0;
    float scale = 0.0f;
};
void launch_fill_random_bf16(const FillRandomParams& p, void* stream);

// out[i, :] = float(table[ids[i], :])
struct EmbedParams {
    const uint16_t* table = nullptr;  // [n_vocab, n_embd] bf16
    const int32_t* ids = nullptr;     // [n]
    int n = 0;
    int n_embd = 0;
    float* out = nullptr;  // [n, n_embd]
};
void launch_embed(const EmbedParams& p, void* stream);

// out = x * rsqrt(mean(x^2) + eps) * w per row; out may alias x.
struct RmsNormParams {
    const float* x = nullptr;  // [n, d]
    const float* w = nullptr;  // [d]
    int n = 0;
    int d = 0;
    float eps = 0.0f;
    float* out = nullptr;  // [n, d]
};
void launch_rms_norm(const RmsNormParams& p, void* stream);

// In-place half-split RoPE at per-token positions (Backend::rope).
struct RopeParams {
    float* x = nullptr;            // [n, n_head, head_dim]
    const int32_t* pos = nullptr;  // [n]
    int n = 0;
    int n_head = 0;
    int head_dim = 0;
    const float* inv_freq = nullptr;  // [head_dim/2]
};
void launch_rope(const RopeParams& p, void* stream);

// out = silu(gate) * up
struct SwigluParams {
    const float* gate = nullptr;  // [n]
    const float* up = nullptr;    // [n]
    size_t n = 0;
    float* out = nullptr;  // [n]
};
void launch_swiglu(const SwigluParams& p, void* stream);

// y += x
struct AddParams {
    float* y = nullptr;        // [n]
    const float* x = nullptr;  // [n]
    size_t n = 0;
};
void launch_add(const AddParams& p, void* stream);

// out[i, :] += bias
struct AddBiasParams {
    float* out = nullptr;         // [n, m]
    const float* bias = nullptr;  // [m]
    int n = 0;
    int m = 0;
};
void launch_add_bias(const AddBiasParams& p, void* stream);

// Backend::lse_merge.
struct LseMergeParams {
    float* o_a = nullptr;          // [rows, head_dim]
    float* lse_a = nullptr;        // [rows]
    const float* o_b = nullptr;    // [rows, head_dim]
    const float* lse_b = nullptr;  // [rows]
    int rows = 0;
    int head_dim = 0;
};
void launch_lse_merge(const LseMergeParams& p, void* stream);

// Plain attention under the full visibility rule of AttnParams (positions, groups, GQA,
// kv_stride): one block per (query, head), online softmax over key tiles. The GPU oracle and
// fallback. `p` has every pointer on the device, kv_stride and scale resolved, and
// head_dim <= kMaxHeadDim. K/V are read in p.kv_dtype (k/v fp32, or k16/v16) and widened to
// fp32 per element; the scores accumulate in fp32. Grid and block: launch_plan.h.
constexpr int kMaxHeadDim = 512;
void launch_attention(const AttnParams& p, void* stream);
// Column scores (Backend::attention_scores): one thread per column, queries visited in turn,
// nothing of size [n_head, n_q, n_cols] stored. Same preconditions as launch_attention, and
// n_head * (head_dim + 1) <= kMaxScoreSharedFloats (one query row and its LSE live in shared
// memory, at most the 48 KiB a block gets without opting in).
constexpr int kMaxScoreSharedFloats = 12288;
void launch_attention_scores(const ScoreParams& p, void* stream);

}  // namespace infoflow::cuda
