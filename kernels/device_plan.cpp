#include "kernels/device_plan.h"

#include <cmath>
#include <cstring>

#include "runtime/core/error.h"

namespace infoflow {
namespace {

template <class P>
AttnShape check_common(const P& p, const char* op, int n_rows, int n_keys, int max_head_dim) {
    IF_CHECK(p.n_head > 0 && p.n_head_kv > 0 && p.n_head % p.n_head_kv == 0,
             op << ": n_head " << p.n_head << " is not a positive multiple of n_head_kv "
                << p.n_head_kv);
    IF_CHECK(p.head_dim > 0 && p.head_dim <= max_head_dim,
             op << ": head_dim " << p.head_dim << " outside [1, " << max_head_dim << "]");
    IF_CHECK(n_rows >= 0 && n_keys >= 0, op << ": negative sizes " << n_rows << ", " << n_keys);
    AttnShape s;
    s.group = p.n_head / p.n_head_kv;
    s.stride = p.kv_stride > 0 ? p.kv_stride : p.n_head_kv * p.head_dim;
    IF_CHECK(s.stride >= p.n_head_kv * p.head_dim, op << ": kv_stride " << s.stride
                                                      << " < n_head_kv * head_dim "
                                                      << p.n_head_kv * p.head_dim);
    s.scale = p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(float(p.head_dim));
    if (n_rows > 0) {
        IF_CHECK(p.q && p.q_pos, op << ": q and q_pos are required");
    }
    if (n_rows > 0 && n_keys > 0) {
        const bool wide = p.kv_dtype == KvDtype::f32;
        IF_CHECK((wide ? p.k != nullptr : p.k16 != nullptr) && p.k_pos,
                 op << ": " << (wide ? "k" : "k16") << " and k_pos are required ("
                    << kv_dtype_name(p.kv_dtype) << " keys)");
    }
    return s;
}

}  // namespace

AttnShape check_attention_args(const AttnParams& p, int max_head_dim) {
    const AttnShape s = check_common(p, "attention", p.n_q, p.n_kv, max_head_dim);
    if (p.n_q > 0) {
        IF_CHECK(p.out, "attention: out is required");
        if (p.n_kv > 0) {
            const bool wide = p.kv_dtype == KvDtype::f32;
            IF_CHECK(wide ? p.v != nullptr : p.v16 != nullptr,
                     "attention: " << (wide ? "v" : "v16") << " is required ("
                                   << kv_dtype_name(p.kv_dtype) << " values)");
        }
    }
    return s;
}

AttnShape check_score_args(const ScoreParams& p, int max_head_dim) {
    const AttnShape s = check_common(p, "attention_scores", p.n_q, p.n_cols, max_head_dim);
    if (p.n_q > 0 && p.n_cols > 0) {
        IF_CHECK(p.lse && p.col, "attention_scores: lse and col are required");
    }
    return s;
}

IndexPack plan_index_pack(const std::vector<IndexArray>& arrays) {
    IndexPack plan;
    for (const IndexArray& a : arrays) {
        if (a.data == nullptr) {
            plan.offset.push_back(SIZE_MAX);
            continue;
        }
        plan.offset.push_back(plan.total);
        plan.total += (a.n + kIndexAlign - 1) / kIndexAlign * kIndexAlign;
    }
    return plan;
}

void pack_indices(const std::vector<IndexArray>& arrays, const IndexPack& plan, int32_t* dst) {
    IF_CHECK(plan.offset.size() == arrays.size(), "pack_indices: plan of another array list");
    for (size_t i = 0; i < arrays.size(); ++i) {
        if (arrays[i].data && arrays[i].n) {
            std::memcpy(dst + plan.offset[i], arrays[i].data, arrays[i].n * sizeof(int32_t));
        }
    }
}

GemmPlan plan_row_major_matmul(int n, int k, int m) {
    IF_CHECK(n >= 0 && k > 0 && m >= 0, "matmul: bad sizes n " << n << ", k " << k << ", m " << m);
    // Row-major W[m, k] is column-major W^T [k, m] (ld k); row-major x[n, k] is column-major
    // x^T [k, n] (ld k); row-major out[n, m] is column-major out^T [m, n] (ld m).
    // out^T = W x^T = op_T(W^T) * x^T.
    GemmPlan g;
    g.trans_a = true;
    g.trans_b = false;
    g.M = m;
    g.N = n;
    g.K = k;
    g.lda = k;
    g.ldb = k;
    g.ldc = m;
    return g;
}

}  // namespace infoflow
