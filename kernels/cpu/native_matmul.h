// Matrix products with weights in their stored type (kernels/backend.h NativeMatrix), the CPU
// backend's matmul_native and embed_native. One path per weight type, whatever the row count:
//  - quantized types: each row of x is quantized once to Q8Block and multiplied by fused
//    stored-type integer dot products (row groups: four weight rows and up to four tokens per
//    kernel call, the weights unpacked once for all of them);
//  - quantized types with NativeMatrix::fp32_activations (the LM head): fp32 x, the codes widened
//    in registers;
//  - F32, F16, BF16: fp32 x, the rows widened in registers, 16 rows and up to 4 tokens per call.
// Each output element is computed by the same operations in the same order whatever n is and
// however the rows are split over threads, so a token's result does not depend on which rank
// computes it or which other tokens share its call (docs/design.md §6.4). On cpu.isa = amx,
// exact-pass calls of at least kAmxMinRows rows take bf16 tiles instead (gemm_amx.h): still one
// fixed sequence per element whatever the call's other tokens, but a different one (bf16 inputs)
// from the calls of fewer rows, which keep gemm_exact. Each thread takes a
// contiguous range of weight rows and runs it over the tokens in blocks of 32.
#pragma once

#include <cstdint>

#include "kernels/backend.h"

namespace infoflow::cpu {

// out = x W^T (+ bias) (+ out when accumulate).
void native_matmul(const float* x /*[n, k]*/, const NativeMatrix& w /*[m, k]*/,
                   const float* bias /*[m] or nullptr*/, int n, float* out /*[n, m]*/,
                   bool accumulate, int n_threads);
// out[i, :] = table[ids[i], :] in fp32.
void native_embed(const NativeMatrix& table /*[n_vocab, n_embd]*/, const int32_t* ids /*[n]*/,
                  int n, float* out /*[n, n_embd]*/);

}  // namespace infoflow::cpu
