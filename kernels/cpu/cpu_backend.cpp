// The CPU backend: the reference implementation of every op (plain, readable loops where they
// are not hot) and a fast path where they are: every matrix product on the project's own kernels
// (kernels/cpu/gemm_exact.h, gemm_amx.h, quant_dot.h, picked per pass and ISA path by
// native_matmul), attention as a blocked online softmax over key blocks (attention_cpu.h). No
// BLAS library: its kernel choice would depend on whether it knows the CPU model.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/attention_cpu.h"
#include "kernels/cpu/buffer_pool.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/cpu_math.h"
#include "kernels/cpu/gemm_exact.h"
#include "kernels/cpu/native_matmul.h"
#include "kernels/random_init.h"
#include "runtime/core/error.h"

namespace infoflow {
namespace {

constexpr int kAttnQueryBlock = 64;  // query tokens per scoring task

// Sets the scores of keys invisible to a query (position qp, group qg) to -inf (AttnParams).
inline void mask_row(float* s, const int32_t* k_pos, const int32_t* k_group, int n, int32_t qp,
                     int32_t qg) {
    if (k_group) {
        for (int j = 0; j < n; ++j) {
            const bool vis = k_pos[j] <= qp && (k_group[j] < 0 || k_group[j] == qg);
            s[j] = vis ? s[j] : -INFINITY;
        }
    } else {
        for (int j = 0; j < n; ++j) s[j] = k_pos[j] <= qp ? s[j] : -INFINITY;
    }
}

class CpuBackend final : public Backend {
  public:
    explicit CpuBackend(int n_threads) { set_threads(n_threads); }

    std::string name() const override { return "cpu"; }
    // The kernel path, for the run summary: "cpu (avx512 (bf16, vnni))".
    std::string device() const override { return "cpu (" + cpu::cpu_isa_summary() + ")"; }

    void set_threads(int n_threads) override {
        n_threads_ = n_threads > 0 ? n_threads : omp_get_max_threads();
        omp_set_num_threads(n_threads_);
    }

    Buffer alloc(size_t bytes) override {
        if (bytes == 0) return Buffer();
        void* p = pool_.take(bytes);
        IF_CHECK(p != nullptr, "CPU allocation of " << bytes << " bytes failed");
        return Buffer(this, p, bytes);
    }
    void release(void* ptr) override { pool_.give(ptr); }
    void set_buffer_pool(size_t bytes) override { pool_.set_limit(bytes); }
    void release_idle_buffers(double seconds) override {
        pool_.release_idle(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(seconds)));
    }
    BufferPoolStats buffer_pool() const override {
        return {pool_.limit(), pool_.held_bytes(), pool_.reused()};
    }
    void upload(void* dst, const void* src, size_t bytes) override {
        if (bytes) std::memcpy(dst, src, bytes);
    }
    void download(void* dst, const void* src, size_t bytes) override {
        if (bytes) std::memcpy(dst, src, bytes);
    }
    void copy(void* dst, const void* src, size_t bytes) override {
        if (bytes) std::memmove(dst, src, bytes);
    }
    void synchronize() override {}

    Buffer load_matrix(const float* host, int rows, int cols) override {
        Buffer b = alloc_floats(size_t(rows) * cols);
        upload(b.data(), host, b.bytes());
        return b;
    }
    Buffer random_matrix(int rows, int cols, const RandomMatrixSpec& spec) override {
        const size_t n = size_t(rows) * cols;
        Buffer b = alloc_floats(n);
        float* d = b.data();
#pragma omp parallel for schedule(static) num_threads(n_threads_) if (n > 65536)
        for (size_t i = 0; i < n; ++i) d[i] = random_weight(spec.key, i, spec.scale);
        return b;
    }

    void embed(const float* table, const int32_t* ids, int n, int n_embd, float* out) override {
        for (int i = 0; i < n; ++i) {
            std::memcpy(out + size_t(i) * n_embd, table + size_t(ids[i]) * n_embd,
                        sizeof(float) * n_embd);
        }
    }

    void rms_norm(const float* x, const float* w, int n, int d, float eps, float* out) override {
#pragma omp parallel for schedule(static) num_threads(n_threads_) if (n > 16)
        for (int i = 0; i < n; ++i) {
            const float* xi = x + size_t(i) * d;
            float* oi = out + size_t(i) * d;
            // Eight double partial sums, added pairwise: a serial double sum does not
            // vectorize, and a fixed order gives the same bits with every compiler.
            double part[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
            int j = 0;
            for (; j + 8 <= d; j += 8)
                for (int u = 0; u < 8; ++u) part[u] += double(xi[j + u]) * xi[j + u];
            for (; j < d; ++j) part[0] += double(xi[j]) * xi[j];
            const double ss = ((part[0] + part[1]) + (part[2] + part[3])) +
                              ((part[4] + part[5]) + (part[6] + part[7]));
            const float r = 1.0f / std::sqrt(float(ss / d) + eps);
            for (int c = 0; c < d; ++c) oi[c] = w[c] * (xi[c] * r);
        }
    }

    // fp32 weights take the products stored-type weights take (kernels/cpu/native_matmul.h): the
    // exact pass, or the bf16 tiles on cpu.isa = amx. The model passes fp32 matrices through
    // matmul_native itself, with the pass it is in (decode steps take the fused dots); this entry
    // point is the exact pass.
    void matmul(const float* x, const float* w, const float* bias, int n, int k, int m, float* out,
                bool accumulate) override {
        if (n == 0 || m == 0) return;
        cpu::native_matmul(x, cpu::f32_matrix(w, m, k, NativePass::exact), bias, n, out,
                           accumulate, n_threads_);
    }

    // 30 per thread with AVX-512 (two 16-lane FMA ports at ~2.5 GHz, about 40 % of peak, as the
    // prefill measures it), 15 with AVX2.
    double nominal_gmacs() const override {
        return n_threads_ * (cpu::isa_uses_avx512(cpu::active_cpu_isa()) ? 30.0 : 15.0);
    }

    bool supports_native_weights() const override { return true; }
    void matmul_native(const float* x, const NativeMatrix& w, const float* bias, int n, float* out,
                       bool accumulate) override {
        cpu::native_matmul(x, w, bias, n, out, accumulate, n_threads_);
    }
    void embed_native(const NativeMatrix& table, const int32_t* ids, int n, float* out) override {
        cpu::native_embed(table, ids, n, out);
    }

    void rope(float* x, const int32_t* pos, int n, int n_head, int head_dim,
              const float* inv_freq) override {
        const int half = head_dim / 2;
        const std::vector<float>& tab = rope_table(pos, n, half, inv_freq);
#pragma omp parallel for schedule(static) num_threads(n_threads_) if (n > 8)
        for (int t = 0; t < n; ++t) {
            const float* cs = tab.data() + size_t(t) * 2 * half;
            const float* sn = cs + half;
            for (int h = 0; h < n_head; ++h) {
                float* v = x + (size_t(t) * n_head + h) * head_dim;
                for (int i = 0; i < half; ++i) {
                    const float a = v[i];
                    const float b = v[i + half];
                    v[i] = a * cs[i] - b * sn[i];
                    v[i + half] = b * cs[i] + a * sn[i];
                }
            }
        }
    }

    void attention(const AttnParams& p) override;
    void attention_scores(const ScoreParams& p) override;

    void swiglu(const float* gate, const float* up, size_t n, float* out) override {
        const size_t block = 4096;
        const size_t n_blocks = (n + block - 1) / block;
#pragma omp parallel for schedule(static) num_threads(n_threads_) if (n > 65536)
        for (size_t b = 0; b < n_blocks; ++b) {
            const size_t i0 = b * block;
            const size_t i1 = std::min(n, i0 + block);
            cpu::swiglu_range(gate + i0, up + i0, i1 - i0, out + i0);
        }
    }

    void add(float* y, const float* x, size_t n) override {
#pragma omp parallel for schedule(static) num_threads(n_threads_) if (n > 65536)
        for (size_t i = 0; i < n; ++i) y[i] += x[i];
    }

    void lse_merge(float* o_a, float* lse_a, const float* o_b, const float* lse_b, int rows,
                   int head_dim) override {
        for (int r = 0; r < rows; ++r) {
            const float a = lse_a[r];
            const float b = lse_b[r];
            if (b == -INFINITY) continue;  // empty partial: nothing to merge
            float* oa = o_a + size_t(r) * head_dim;
            const float* ob = o_b + size_t(r) * head_dim;
            if (a == -INFINITY) {
                std::memcpy(oa, ob, sizeof(float) * head_dim);
                lse_a[r] = b;
                continue;
            }
            // lse = max + log1p(exp(-|a-b|)) never overflows; the weights come from the
            // difference alone, so a large |lse| does not cost precision.
            const float e = std::exp(-std::fabs(a - b));
            const float lse = std::max(a, b) + std::log1p(e);
            const float w_hi = 1.0f / (1.0f + e);
            const float w_lo = e * w_hi;
            const float wa = a >= b ? w_hi : w_lo;
            const float wb = a >= b ? w_lo : w_hi;
            for (int d = 0; d < head_dim; ++d) oa[d] = wa * oa[d] + wb * ob[d];
            lse_a[r] = lse;
        }
    }

  private:
    // cos/sin of pos[t] * inv_freq[i] (fp32 angle, as HF computes it), [n, 2, half]. The table
    // of the previous call is reused when positions and frequencies are the same: a forward
    // step rotates q and k of every layer at one set of positions.
    const std::vector<float>& rope_table(const int32_t* pos, int n, int half,
                                         const float* inv_freq) {
        const bool same = rope_pos_.size() == size_t(n) && rope_inv_.size() == size_t(half) &&
                          std::equal(pos, pos + n, rope_pos_.begin()) &&
                          std::equal(inv_freq, inv_freq + half, rope_inv_.begin());
        if (same) return rope_tab_;
        rope_pos_.assign(pos, pos + n);
        rope_inv_.assign(inv_freq, inv_freq + half);
        rope_tab_.resize(size_t(n) * 2 * half);
#pragma omp parallel for schedule(static) num_threads(n_threads_) if (n > 8)
        for (int t = 0; t < n; ++t) {
            float* cs = rope_tab_.data() + size_t(t) * 2 * half;
            const float p = float(pos[t]);
            for (int i = 0; i < half; ++i) {
                const float theta = p * inv_freq[i];
                cs[i] = std::cos(theta);
                cs[half + i] = std::sin(theta);
            }
        }
        return rope_tab_;
    }

    int n_threads_ = 1;
    cpu::BufferPool pool_;
    std::vector<int32_t> rope_pos_;
    std::vector<float> rope_inv_;
    std::vector<float> rope_tab_;
};

// The tiled kernel of kernels/cpu/attention_cpu.h, on the ISA path picked at run time.
void CpuBackend::attention(const AttnParams& p) { cpu::attention(p, n_threads_); }

// Rows of K (one kv head, `stride` floats apart) as the weight rows of gemm_exact: the scores
// Q·Kᵀ of a column block in the exact pass's fixed order.
class KeyRows : public cpu::GemmRows {
  public:
    KeyRows(const float* k, size_t stride) : k_(k), stride_(stride) {}
    const float* fetch(int j0, int, int c0, int, float*, int64_t* ld) const override {
        *ld = int64_t(stride_);
        return k_ + size_t(j0) * stride_ + c0;
    }

  private:
    const float* k_;
    size_t stride_;
};

// Column scores. A task is a block of columns (so no two threads write the same col[j]); inside,
// query blocks and kv heads are visited, P is rebuilt from the given lse, and the head-mean
// A[i, j] is accumulated before it is squared (norm) or summed (sum).
void CpuBackend::attention_scores(const ScoreParams& p) {
    const int D = p.head_dim;
    const int H = p.n_head;
    const int Hkv = p.n_head_kv;
    IF_CHECK(H > 0 && Hkv > 0 && H % Hkv == 0 && D > 0, "attention_scores: bad head counts");
    const int g = H / Hkv;
    const int kv_stride = p.kv_stride > 0 ? p.kv_stride : Hkv * D;
    const float scale = p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(float(D));
    if (p.n_q == 0 || p.n_cols == 0) return;
    // 16-bit K is widened one column block at a time into fp32 scratch (rows of Hkv * D).
    const bool wide = p.kv_dtype == KvDtype::f32;
    const int stride = wide ? kv_stride : Hkv * D;
    constexpr int kColBlock = 256;
    const int n_cblocks = (p.n_cols + kColBlock - 1) / kColBlock;

#pragma omp parallel num_threads(n_threads_)
    {
        const int max_rows = kAttnQueryBlock * g;
        std::vector<float> qb(size_t(max_rows) * D);
        std::vector<float> s(size_t(max_rows) * kColBlock);
        std::vector<double> a(size_t(kAttnQueryBlock) * kColBlock);
        std::vector<float> kw(wide ? 0 : size_t(kColBlock) * Hkv * D);
#pragma omp for schedule(dynamic, 1)
        for (int cb = 0; cb < n_cblocks; ++cb) {
            const int j0 = cb * kColBlock;
            const int nk = std::min(kColBlock, p.n_cols - j0);
            const float* kblock = kw.data();
            if (wide) {
                kblock = p.k + size_t(j0) * stride;
            } else {
                cpu::widen_kv_rows(p.kv_dtype, p.k16 + size_t(j0) * kv_stride, size_t(kv_stride),
                                   nk, Hkv * D, kw.data());
            }
            int32_t min_kpos = INT32_MAX;
            for (int j = 0; j < nk; ++j) min_kpos = std::min(min_kpos, p.k_pos[j0 + j]);
            std::vector<double> col(nk, 0.0);
            for (int t0 = 0; t0 < p.n_q; t0 += kAttnQueryBlock) {
                const int nt = std::min(kAttnQueryBlock, p.n_q - t0);
                int32_t max_qpos = INT32_MIN;
                for (int t = 0; t < nt; ++t) max_qpos = std::max(max_qpos, p.q_pos[t0 + t]);
                if (max_qpos < min_kpos) continue;  // every key of the block is in the future
                std::fill(a.begin(), a.begin() + size_t(nt) * nk, 0.0);
                for (int hk = 0; hk < Hkv; ++hk) {
                    const int rows = nt * g;
                    for (int t = 0; t < nt; ++t) {
                        for (int gi = 0; gi < g; ++gi) {
                            const float* src = p.q + (size_t(t0 + t) * H + hk * g + gi) * D;
                            float* dst = qb.data() + size_t(t * g + gi) * D;
                            for (int d = 0; d < D; ++d) dst[d] = src[d] * scale;
                        }
                    }
                    cpu::gemm_exact(qb.data(), rows, D, nk, KeyRows(kblock + size_t(hk) * D, stride),
                                    nullptr, s.data(), false, 1);
                    for (int t = 0; t < nt; ++t) {
                        const int32_t qp = p.q_pos[t0 + t];
                        const int32_t qg = p.q_group ? p.q_group[t0 + t] : 0;
                        double* at = a.data() + size_t(t) * nk;
                        for (int gi = 0; gi < g; ++gi) {
                            const float lse = p.lse[size_t(t0 + t) * H + hk * g + gi];
                            if (lse == -INFINITY) continue;
                            float* sr = s.data() + size_t(t * g + gi) * nk;
                            mask_row(sr, p.k_pos + j0, p.k_group ? p.k_group + j0 : nullptr, nk, qp,
                                     qg);
                            cpu::exp_shift_sum(sr, nk, lse);
                            for (int j = 0; j < nk; ++j) at[j] += sr[j];
                        }
                    }
                }
                for (int t = 0; t < nt; ++t) {
                    const double* at = a.data() + size_t(t) * nk;
                    if (p.aggregate_sum) {
                        for (int j = 0; j < nk; ++j) col[j] += at[j];
                    } else {
                        for (int j = 0; j < nk; ++j) {
                            const double m = at[j] / H;
                            col[j] += m * m;
                        }
                    }
                }
            }
            for (int j = 0; j < nk; ++j) p.col[j0 + j] += float(col[j]);
        }
    }
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads) {
    return std::make_unique<CpuBackend>(n_threads);
}

}  // namespace infoflow
