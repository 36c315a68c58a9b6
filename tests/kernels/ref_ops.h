// Plain float64 reference implementations of every Backend op (kernels/backend.h), written
// straight from the math as the test oracle. Readable loops, no vectorization, no blocking, no
// shared code with any backend. Inputs are the same fp32 values the backend sees; results are
// double so the only error measured is the backend's own.
//
// Not a backend: these functions take and return host memory and make no claim to speed.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/backend.h"

namespace infoflow {
namespace ref {

// out[i, :] = table[ids[i], :]
inline std::vector<double> embed(const float* table /*[n_vocab, n_embd]*/,
                                 const int32_t* ids /*[n]*/, int n, int n_embd) {
    std::vector<double> out(static_cast<size_t>(n) * n_embd);
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < n_embd; ++j)
            out[static_cast<size_t>(i) * n_embd + j] =
                table[static_cast<size_t>(ids[i]) * n_embd + j];
    return out;
}

// out = x / sqrt(mean(x^2) + eps) * w, per row.
inline std::vector<double> rms_norm(const float* x /*[n, d]*/, const float* w /*[d]*/, int n, int d,
                                    double eps) {
    std::vector<double> out(static_cast<size_t>(n) * d);
    for (int i = 0; i < n; ++i) {
        const float* row = x + static_cast<size_t>(i) * d;
        double ss = 0.0;
        for (int j = 0; j < d; ++j) ss += static_cast<double>(row[j]) * row[j];
        const double r = 1.0 / std::sqrt(ss / d + eps);
        for (int j = 0; j < d; ++j) out[static_cast<size_t>(i) * d + j] = row[j] * r * w[j];
    }
    return out;
}

// out = x W^T (+ bias) (+ prev when prev != nullptr).
inline std::vector<double> matmul(const float* x /*[n, k]*/, const float* w /*[m, k]*/,
                                  const float* bias /*[m] or nullptr*/, int n, int k, int m,
                                  const float* prev /*[n, m] or nullptr*/) {
    std::vector<double> out(static_cast<size_t>(n) * m);
    for (int i = 0; i < n; ++i) {
        for (int o = 0; o < m; ++o) {
            double s = 0.0;
            for (int t = 0; t < k; ++t)
                s += static_cast<double>(x[static_cast<size_t>(i) * k + t]) *
                     w[static_cast<size_t>(o) * k + t];
            if (bias) s += bias[o];
            if (prev) s += prev[static_cast<size_t>(i) * m + o];
            out[static_cast<size_t>(i) * m + o] = s;
        }
    }
    return out;
}

// The rotation angle of RoPE as HF computes it: float(pos) * inv_freq[i], one fp32 product
// (docs/formats.md §4.3/§4.4). Returned widened to double; cos/sin of it are then taken in double.
inline double rope_angle_fp32(int32_t pos, float inv_freq) {
    volatile float a = static_cast<float>(pos) * inv_freq;  // volatile: keep it an fp32 product
    return static_cast<double>(a);
}

// Half-split RoPE (NEOX / rotate_half): pair (i, i + head_dim/2) rotated by the angle of
// `angle_of(pos, inv_freq[i])`.
//   x'[i]       = x[i] cos - x[i+D/2] sin
//   x'[i+D/2]   = x[i] sin + x[i+D/2] cos
// fp32_angle = true matches HF (and the backend contract); false uses the exact angle
// pos * inv_freq in double (for the composition check against exact rotation).
inline std::vector<double> rope(const float* x /*[n, n_head, head_dim]*/,
                                const int32_t* pos /*[n]*/, int n, int n_head, int head_dim,
                                const float* inv_freq /*[head_dim/2]*/, bool fp32_angle = true) {
    const int half = head_dim / 2;
    std::vector<double> out(static_cast<size_t>(n) * n_head * head_dim);
    for (int t = 0; t < n; ++t) {
        for (int h = 0; h < n_head; ++h) {
            const size_t base = (static_cast<size_t>(t) * n_head + h) * head_dim;
            for (int i = 0; i < half; ++i) {
                const double ang = fp32_angle ? rope_angle_fp32(pos[t], inv_freq[i])
                                              : static_cast<double>(pos[t]) * inv_freq[i];
                const double c = std::cos(ang), s = std::sin(ang);
                const double a = x[base + i], b = x[base + i + half];
                out[base + i] = a * c - b * s;
                out[base + i + half] = a * s + b * c;
            }
        }
    }
    return out;
}

// Plain inverse frequencies base^(-2i/D), i in [0, D/2).
inline std::vector<float> rope_inv_freq(int head_dim, double base) {
    std::vector<float> f(head_dim / 2);
    for (int i = 0; i < head_dim / 2; ++i)
        f[i] = static_cast<float>(std::pow(base, -2.0 * i / head_dim));
    return f;
}

// llama3 rope scaling of the inverse frequencies (docs/formats.md §4.5, transformers
// `_compute_llama3_parameters`): with L = original_max_position_embeddings and
// wavelen = 2 pi / inv_freq, frequencies with wavelen < L/high are kept, those with
// wavelen > L/low are divided by `factor`, and those in between are interpolated with
// s = (L/wavelen - low) / (high - low).
inline std::vector<float> llama3_inv_freq(int head_dim, double base, double factor, double low,
                                          double high, double original) {
    const double pi = 3.14159265358979323846;
    std::vector<float> f(head_dim / 2);
    for (int i = 0; i < head_dim / 2; ++i) {
        const double inv = std::pow(base, -2.0 * i / head_dim);
        const double wavelen = 2.0 * pi / inv;
        double v;
        if (wavelen < original / high) {
            v = inv;
        } else if (wavelen > original / low) {
            v = inv / factor;
        } else {
            const double s = (original / wavelen - low) / (high - low);
            v = (1.0 - s) * inv / factor + s * inv;
        }
        f[i] = static_cast<float>(v);
    }
    return f;
}

// Attention with the visibility rule of AttnParams, on host pointers (p.out / p.lse ignored):
// key j is visible to query i iff k_pos[j] <= q_pos[i] and (no groups, or k_group[j] < 0, or
// k_group[j] == q_group[i]). GQA: query head h reads KV head h / (n_head / n_head_kv).
// out = sum_j softmax_j(scale * q.k_j) v_j and lse = log sum_j exp(scale * q.k_j), natural log;
// a row with no visible key gets out = 0 and lse = -inf.
// `max_abs_score` (optional) receives max |scale * q.k| over visible pairs, for tolerances.
inline void attention(const AttnParams& p, std::vector<double>* out /*[n_q, n_head, head_dim]*/,
                      std::vector<double>* lse /*[n_q, n_head]*/, double* max_abs_score = nullptr) {
    const int D = p.head_dim;
    const int stride = p.kv_stride > 0 ? p.kv_stride : p.n_head_kv * D;
    const double scale = p.scale != 0.0f ? static_cast<double>(p.scale) : 1.0 / std::sqrt(D);
    const int group_size = p.n_head / p.n_head_kv;
    out->assign(static_cast<size_t>(p.n_q) * p.n_head * D, 0.0);
    lse->assign(static_cast<size_t>(p.n_q) * p.n_head, -std::numeric_limits<double>::infinity());
    std::vector<double> score(p.n_kv);
    std::vector<char> visible(p.n_kv);
    if (max_abs_score) *max_abs_score = 0.0;
    for (int i = 0; i < p.n_q; ++i) {
        bool any = false;
        for (int j = 0; j < p.n_kv; ++j) {
            bool vis = p.k_pos[j] <= p.q_pos[i];
            if (vis && p.k_group) vis = p.k_group[j] < 0 || p.k_group[j] == p.q_group[i];
            visible[j] = vis;
            any = any || vis;
        }
        if (!any) continue;
        for (int h = 0; h < p.n_head; ++h) {
            const int hk = h / group_size;
            const float* q = p.q + (static_cast<size_t>(i) * p.n_head + h) * D;
            double m = -std::numeric_limits<double>::infinity();
            for (int j = 0; j < p.n_kv; ++j) {
                if (!visible[j]) continue;
                const float* k =
                    p.k + static_cast<size_t>(j) * stride + static_cast<size_t>(hk) * D;
                double s = 0.0;
                for (int d = 0; d < D; ++d) s += static_cast<double>(q[d]) * k[d];
                score[j] = s * scale;
                if (score[j] > m) m = score[j];
                if (max_abs_score && std::fabs(score[j]) > *max_abs_score)
                    *max_abs_score = std::fabs(score[j]);
            }
            double sum = 0.0;
            for (int j = 0; j < p.n_kv; ++j)
                if (visible[j]) sum += std::exp(score[j] - m);
            const double l = m + std::log(sum);
            (*lse)[static_cast<size_t>(i) * p.n_head + h] = l;
            double* o = out->data() + (static_cast<size_t>(i) * p.n_head + h) * D;
            for (int j = 0; j < p.n_kv; ++j) {
                if (!visible[j]) continue;
                const double wgt = std::exp(score[j] - l);
                const float* v =
                    p.v + static_cast<size_t>(j) * stride + static_cast<size_t>(hk) * D;
                for (int d = 0; d < D; ++d) o[d] += wgt * v[d];
            }
        }
    }
}

// Attention-probability column scores (ScoreParams, docs/design.md §3.3), the amount added to col:
// P[h,i,j] = exp(scale * q_i.k_j - lse[i,h]) for a key j visible to row i, else 0 (and 0 for a
// row whose lse is -inf);
//   norm: add[j] = sum_i (1/n_head sum_h P[h,i,j])^2;   sum: add[j] = sum_i sum_h P[h,i,j].
inline std::vector<double> attention_scores(const ScoreParams& p) {
    const int D = p.head_dim;
    const int stride = p.kv_stride > 0 ? p.kv_stride : p.n_head_kv * D;
    const double scale = p.scale != 0.0f ? static_cast<double>(p.scale) : 1.0 / std::sqrt(D);
    const int group_size = p.n_head / p.n_head_kv;
    std::vector<double> add(p.n_cols, 0.0);
    for (int i = 0; i < p.n_q; ++i) {
        for (int j = 0; j < p.n_cols; ++j) {
            bool vis = p.k_pos[j] <= p.q_pos[i];
            if (vis && p.k_group) vis = p.k_group[j] < 0 || p.k_group[j] == p.q_group[i];
            if (!vis) continue;
            double head_sum = 0.0;
            for (int h = 0; h < p.n_head; ++h) {
                const double l = p.lse[static_cast<size_t>(i) * p.n_head + h];
                if (std::isinf(l) && l < 0) continue;
                const float* q = p.q + (static_cast<size_t>(i) * p.n_head + h) * D;
                const float* k =
                    p.k + static_cast<size_t>(j) * stride + static_cast<size_t>(h / group_size) * D;
                double s = 0.0;
                for (int d = 0; d < D; ++d) s += static_cast<double>(q[d]) * k[d];
                head_sum += std::exp(s * scale - l);
            }
            if (p.aggregate_sum) {
                add[j] += head_sum;
            } else {
                const double mean = head_sum / p.n_head;
                add[j] += mean * mean;
            }
        }
    }
    return add;
}

// silu(g) * u = g / (1 + exp(-g)) * u
inline std::vector<double> swiglu(const float* gate, const float* up, size_t n) {
    std::vector<double> out(n);
    for (size_t i = 0; i < n; ++i) {
        const double g = gate[i];
        out[i] = g / (1.0 + std::exp(-g)) * up[i];
    }
    return out;
}

// Merge of two attention states (o, lse) (docs/design.md §5.3): lse = log(e^a + e^b), o = o_a e^(a-lse)
// + o_b e^(b-lse). Two empty states (-inf) stay empty: o unchanged (0 by convention), lse -inf.
inline void lse_merge(std::vector<double>* o_a /*[rows, head_dim]*/,
                      std::vector<double>* lse_a /*[rows]*/, const float* o_b, const float* lse_b,
                      int rows, int head_dim) {
    const double ninf = -std::numeric_limits<double>::infinity();
    for (int r = 0; r < rows; ++r) {
        const double a = (*lse_a)[r], b = lse_b[r];
        if (a == ninf && b == ninf) continue;
        const double m = a > b ? a : b;
        const double l = m + std::log(std::exp(a - m) + std::exp(b - m));
        const double wa = std::exp(a - l), wb = std::exp(b - l);
        for (int d = 0; d < head_dim; ++d) {
            double& o = (*o_a)[static_cast<size_t>(r) * head_dim + d];
            o = o * wa + o_b[static_cast<size_t>(r) * head_dim + d] * wb;
        }
        (*lse_a)[r] = l;
    }
}

}  // namespace ref
}  // namespace infoflow
