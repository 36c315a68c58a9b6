// Weight matrices kept in their stored GGUF type (docs/formats.md §2.3, §3) and the CPU kernels
// that use them without an fp32 copy of the model:
//  - dot products of one stored weight row with activations quantized per 32-element block to
//    int8 (`Q8Block`, one fp32 scale per block, as llama.cpp does), for decode and small batches;
//    F16/BF16/F32 rows are multiplied with fp32 activations directly;
//  - dequantization of stored rows to fp32, for one weight tile at a time before an sgemm
//    (prefill, recompute).
// Each kernel has an AVX2 variant (quant_dot.cpp, the build baseline) and an AVX-512 variant
// (quant_dot_avx512.cpp: 512-bit converts, VNNI integer dots); `quant_kernels()` returns the one
// active_cpu_isa() picks. Accumulation is in fp32 (integer sums within a block are exact).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cpu_features.h"

namespace infoflow::cpu {

// ggml type ids of the stored types the kernels take (docs/formats.md §2.3).
namespace ggml_id {
constexpr uint32_t f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8, q6_k = 14,
                   bf16 = 30;
}  // namespace ggml_id

// One block of 32 activations quantized to int8: x[i] ~= d * qs[i], d = max|x| / 127, and the
// sums the weight formats with an offset or a minimum need (sum_lo: qs[0..15], sum_hi:
// qs[16..31], ds = d * (sum_lo + sum_hi)).
struct Q8Block {
    float d;
    float ds;
    int16_t sum_lo;
    int16_t sum_hi;
    int8_t qs[32];
};
constexpr int kQ8BlockElems = 32;

bool native_type_supported(uint32_t type);  // F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q6_K
bool native_type_quantized(uint32_t type);  // true: dots take Q8Block activations
int native_block_elems(uint32_t type);      // 1, 32 or 256; 0 when unsupported
size_t native_block_bytes(uint32_t type);   // 0 when unsupported
// Bytes of a row of k elements (k a multiple of the block size).
size_t native_row_bytes(uint32_t type, int64_t k);

// Row groups: a matrix of Q4_0, Q4_1 or Q8_0 whose row count is a multiple of kRowGroup may be
// kept with its rows block-interleaved in groups of kRowGroup (the same bytes, in another order),
// so that one vector load takes one block of every row of the group and the dot products of the
// group share the loads of the activations and one horizontal reduction:
//   group g (rows 4g..4g+3) occupies bytes [4g * row_bytes, (4g + 4) * row_bytes); within it,
//   block b occupies 4 * block_bytes bytes: the 4 rows' block headers (Q4_0, Q8_0: the fp16 d;
//   Q4_1: the fp16 d and m), then their codes: Q4_0/Q4_1 the 4 rows' 16 nibble bytes, Q8_0 the
//   4 rows' codes 0..15, then the 4 rows' codes 16..31.
constexpr int kRowGroup = 4;
bool row_group_supported(uint32_t type);
// Plain rows -> row groups, in place (rows a multiple of kRowGroup, k of the block size).
void interleave_row_groups(uint32_t type, uint8_t* data /*[rows, row_bytes]*/, int64_t rows,
                           int64_t k);
// Row `row` of a row-grouped matrix in the plain layout.
void gather_grouped_row(uint32_t type, const uint8_t* data, int64_t row, int64_t k,
                        uint8_t* out /*[row_bytes]*/);
// Blocks [b0, b0 + nb) of that row in the plain layout.
void gather_grouped_blocks(uint32_t type, const uint8_t* data, int64_t row, int64_t k, int64_t b0,
                           int64_t nb, uint8_t* out /*[nb * block_bytes]*/);

struct QuantKernels {
    CpuIsa isa;
    // x: [k], y: [k / 32]; k a multiple of 32.
    void (*quantize_q8)(const float* x /*[k]*/, Q8Block* y /*[k/32]*/, int64_t k);
    // One stored row of a quantized type times quantized activations: sum_i w[i] * x[i].
    float (*dot_q8)(uint32_t type, const uint8_t* w /*[row_bytes]*/, const Q8Block* x /*[k/32]*/,
                    int64_t k);
    // One F32/F16/BF16 row times fp32 activations (any k).
    float (*dot_f32)(uint32_t type, const uint8_t* w /*[row_bytes]*/, const float* x /*[k]*/,
                     int64_t k);
    // One stored row (any supported type) to fp32.
    void (*dequantize)(uint32_t type, const uint8_t* w /*[row_bytes]*/, float* out /*[k]*/,
                       int64_t k);
    // The kRowGroup rows of one row group (row_group_supported types) times n token rows of
    // quantized activations (out[t * ldo + r] = dot_q8 of row r and token t), and times fp32
    // activations (the codes widened in registers; fp32 products and sums). A token's sums are
    // the same bits whatever n is and whichever tokens share the call: native_matmul runs every
    // row count through these, so a token's result does not depend on how the work is split
    // (docs/design.md §6.4).
    void (*dot_q8_group)(uint32_t type, const uint8_t* g /*[4 * row_bytes]*/,
                         const Q8Block* x /*[n, k/32]*/, int64_t k, int n,
                         float* out /*[n, ldo]*/, int64_t ldo);
    void (*dot_f32_group)(uint32_t type, const uint8_t* g /*[4 * row_bytes]*/,
                          const float* x /*[n, ldx]*/, int64_t ldx, int64_t k, int n,
                          float* out /*[n, ldo]*/, int64_t ldo);
    // `rows` F32/F16/BF16 rows times n token rows of fp32 activations: out[t * ldo + r] =
    // dot_f32 of row r and token t, the same bits whatever rows and n are.
    void (*dot_f32_rows)(uint32_t type, const uint8_t* w /*[rows, row_bytes]*/, size_t row_bytes,
                         int rows, const float* x /*[n, ldx]*/, int64_t ldx, int64_t k, int n,
                         float* out /*[n, ldo]*/, int64_t ldo);
};

// The kernels of one path (tests run both); throws when `isa` is avx512 and this CPU lacks it.
const QuantKernels& quant_kernels(CpuIsa isa);
// The kernels of the active path (active_cpu_isa()).
const QuantKernels& quant_kernels();

// The two variants, defined in quant_dot.cpp and quant_dot_avx512.cpp.
const QuantKernels& quant_kernels_avx2();
const QuantKernels& quant_kernels_avx512();

}  // namespace infoflow::cpu
