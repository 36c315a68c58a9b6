// Matrix products with weights in their stored type (kernels/backend.h NativeMatrix; fp32 weights
// too, as F32 rows), the CPU backend's matmul_native and embed_native. The pass picks the
// product (docs/design.md §6), never the row count:
//  - NativePass::exact (every pass but decode steps): fp32 activations times the rows in fp32
//    (stored blocks dequantized by the active path), one fixed sequence of fp32 operations per
//    output element (gemm_exact.h); on cpu.isa = amx the bf16 tiles instead (gemm_amx.h), whatever
//    the number of rows: also one fixed sequence per element, but of bf16-rounded inputs;
//  - NativePass::decode: quantized types multiply each row of x quantized once to Q8Block by fused
//    stored-type integer dot products (row groups: four weight rows and up to four tokens per
//    kernel call); F32, F16 and BF16 rows are widened in registers, 16 rows and up to 4 tokens
//    per call;
//  - NativePass::decode_fp32 (the LM head): fp32 x, the codes widened in registers.
// Every path computes each output element by the same operations in the same order whatever n
// is and however the rows are split over threads, so a token's result does not depend on which
// rank computes it or which other tokens share its call. Each thread takes a contiguous range of
// weight rows and runs it over the tokens in blocks of 32.
#pragma once

#include <cstdint>

#include "kernels/backend.h"

namespace infoflow::cpu {

// out = x W^T (+ bias) (+ out when accumulate).
void native_matmul(const float* x /*[n, k]*/, const NativeMatrix& w /*[m, k]*/,
                   const float* bias /*[m] or nullptr*/, int n, float* out /*[n, m]*/,
                   bool accumulate, int n_threads);
// fp32 weights ([rows, cols], row-major, host memory) as an F32 NativeMatrix for `pass`.
NativeMatrix f32_matrix(const float* w, int rows, int cols, NativePass pass);
// out[i, :] = table[ids[i], :] in fp32.
void native_embed(const NativeMatrix& table /*[n_vocab, n_embd]*/, const int32_t* ids /*[n]*/,
                  int n, float* out /*[n, n_embd]*/);

}  // namespace infoflow::cpu
