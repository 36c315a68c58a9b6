// Host-side decisions of a device backend, in plain C++ so they are tested on any machine:
// argument checks and resolved shapes of the attention ops, packing of the host index arrays
// into one staging block (one host-to-device copy per op), and the mapping of the row-major
// `matmul` onto a column-major BLAS call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/backend.h"

namespace infoflow {

// Resolved head grouping, stride and scale of AttnParams / ScoreParams.
struct AttnShape {
    int group = 1;       // query heads per kv head (n_head / n_head_kv)
    int stride = 0;      // floats between tokens of k and v
    float scale = 0.0f;  // softmax scale
};
// Checks head counts, head_dim (<= max_head_dim), stride, sizes and pointers (errors name the
// op and the bad field) and resolves the defaults (kv_stride 0, scale 0).
AttnShape check_attention_args(const AttnParams& p, int max_head_dim);
AttnShape check_score_args(const ScoreParams& p, int max_head_dim);

// Host int32 arrays packed back to back into one block; absent (nullptr) arrays take no room.
// Each array starts on a multiple of kIndexAlign elements.
constexpr size_t kIndexAlign = 16;
struct IndexArray {
    const int32_t* data = nullptr;  // host; nullptr = absent
    size_t n = 0;
};
struct IndexPack {
    std::vector<size_t> offset;  // element offset of each array in the block; SIZE_MAX = absent
    size_t total = 0;            // elements in the block
};
IndexPack plan_index_pack(const std::vector<IndexArray>& arrays);
// Copies the arrays into `dst` (at least plan.total elements) at the planned offsets.
void pack_indices(const std::vector<IndexArray>& arrays, const IndexPack& plan, int32_t* dst);

// out[n, m] = x[n, k] W[m, k]^T (row-major) as one column-major GEMM C = op(A) op(B),
// C [M, N] with leading dimension ldc: C = out^T, A = W (transposed), B = x^T.
struct GemmPlan {
    bool trans_a = false;
    bool trans_b = false;
    int M = 0, N = 0, K = 0;
    int lda = 0, ldb = 0, ldc = 0;
};
GemmPlan plan_row_major_matmul(int n, int k, int m);

}  // namespace infoflow
