// Matrix products with weights in their stored type (kernels/backend.h NativeMatrix), the CPU
// backend's matmul_native and embed_native:
//  - n <= kNativeDotMaxTokens (decode, small batches): each row of x is quantized once to
//    Q8Block (F16/BF16/F32 weights take fp32 x), then fused stored-type dot products, output
//    rows split over the threads;
//  - larger n (prefill, recompute): each thread dequantizes one tile of weight rows at a time
//    (up to 8 MB of fp32: a whole SmolLM2 matrix, or its share of one per thread) into its own
//    fp32 scratch, kept between calls, and multiplies it with a single-threaded sgemm.
#pragma once

#include <cstdint>

#include "kernels/backend.h"

namespace infoflow::cpu {

constexpr int kNativeDotMaxTokens = 16;

// out = x W^T (+ bias) (+ out when accumulate).
void native_matmul(const float* x /*[n, k]*/, const NativeMatrix& w /*[m, k]*/,
                   const float* bias /*[m] or nullptr*/, int n, float* out /*[n, m]*/,
                   bool accumulate, int n_threads);
// out[i, :] = table[ids[i], :] in fp32.
void native_embed(const NativeMatrix& table /*[n_vocab, n_embd]*/, const int32_t* ids /*[n]*/,
                  int n, float* out /*[n, n_embd]*/);

}  // namespace infoflow::cpu
