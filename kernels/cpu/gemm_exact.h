// The CPU backend's matrix product for every pass except decode steps (docs/design.md §6.4):
// out[t, j] = (out[t, j] if accumulating, else 0) + s[t, j] + bias[j], where s[t, j] is the sum
// over k of w[j, c] * x[t, c] computed as one fixed sequence of fp32 operations:
//  - k is cut into chunks of kGemmChunk columns; in each chunk an FMA chain
//    acc = fma(w[j, c], x[t, c], acc) runs over the columns in order from acc = 0;
//  - the chunk sums are added left to right.
// w[j, :] is the weight row in fp32: the fp32 weights themselves, or a stored row dequantized by
// the active path's dequantize (kernels/cpu/quant_dot.h). The kernels vectorize across tokens and
// rows, never across c, so every element is that sequence whatever the number of tokens, the
// tiles, the thread split or the instruction set: a token's result does not depend on which
// rank computes it or which other tokens share its call. gemm_exact_ref is the same sequence
// in plain loops, the oracle of the tests.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_features.h"

namespace infoflow::cpu {

constexpr int kGemmChunk = 512;

// Rows j0..j0+rows-1, columns c0..c0+kc-1 of the weight matrix in fp32: either written to `buf`
// ([rows, kc], returns buf, *ld = kc) or a pointer into fp32 weights (*ld = their row length).
struct GemmRows {
    virtual ~GemmRows() = default;
    virtual const float* fetch(int j0, int rows, int c0, int kc, float* buf, int64_t* ld) const = 0;
};

// out (+)= x W^T (+ bias) as defined above. W is [m, k], supplied by `w`.
void gemm_exact(const float* x /*[n, k]*/, int n, int k, int m, const GemmRows& w,
                const float* bias /*[m] or nullptr*/, float* out /*[n, m]*/, bool accumulate,
                int n_threads);

// The same numbers in plain loops (fmaf), for tests: W given as fp32 rows.
void gemm_exact_ref(const float* x /*[n, k]*/, int n, int k, int m, const float* w /*[m, k]*/,
                    const float* bias /*[m] or nullptr*/, float* out /*[n, m]*/, bool accumulate);

// One tile of the chunk loop: for r < rows, t < nt (<= kGemmTokens), the FMA chain
//   acc(r, t) = fma(w[r, c], xt[c, t], acc(r, t)) for c = 0 .. kc-1 in order,
// starting from 0 (start) or from the lanes in `acc`, which it leaves there:
// acc[r * kGemmTokens + t] (64-byte aligned; lanes beyond nt hold garbage). A chunk's chain may so
// be cut into sub-chunks without changing a bit. xt is a token block transposed, [kc, kGemmTokens]
// with ld kGemmTokens (lanes beyond nt unused).
constexpr int kGemmTokens = 32;
struct GemmKernels {
    CpuIsa isa;
    int rows;  // rows per tile the kernel is fastest at (any rows <= this are taken)
    void (*tile)(const float* w /*[rows, ldw]*/, int64_t ldw, int rows, const float* xt, int kc,
                 int nt, float* acc /*[rows, kGemmTokens]*/, bool start);
    // The epilogue of one lane tile: for t < nt, r < rows,
    //   out[t * ldo + r] = (accumulate ? out[t * ldo + r] : 0) + s[r * kGemmTokens + t]
    //                      + (bias ? bias[r] : 0)
    // in that order (each operation rounded as written).
    void (*store)(const float* s, int rows, int nt, const float* bias, float* out, int64_t ldo,
                  bool accumulate);
};
// The epilogue in plain loops (the AVX2 path's).
void gemm_store_scalar(const float* s, int rows, int nt, const float* bias, float* out,
                       int64_t ldo, bool accumulate);
const GemmKernels& gemm_kernels();  // the active path's (active_cpu_isa())
const GemmKernels& gemm_kernels_avx2();
const GemmKernels& gemm_kernels_avx512();

}  // namespace infoflow::cpu
