// gemm_exact (gemm_exact.h): the driver, the plain-loop reference and the AVX2 tile (the build
// baseline; the AVX-512 tile is in gemm_exact_avx512.cpp).
//
// The driver. Tokens are taken in groups whose transposed activations (x^T, [k, 32] per block of
// 32 tokens) stay in L2; each thread takes a contiguous range of weight rows and, per group,
// runs it panel by panel (kPanel strips of gk.rows rows): each chunk of kGemmChunk columns of the
// panel's strips is fetched (dequantized) once; the chunk is then walked kGemmSub columns at a
// time, each token block's slice of x^T multiplied with every strip while it is in L1, the FMA
// chains kept in per-(strip, block) accumulators across the cuts; at the chunk's end its sums are
// added to the panel's partial sums, which go through the one epilogue at the end.
#include "kernels/cpu/gemm_exact.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "runtime/core/error.h"

namespace infoflow::cpu {
namespace {

// Bytes of transposed activations a token group may take (L2 on the development machines is
// 1.25-2 MB per core; the strip and its partial sums are small).
constexpr size_t kGroupBytes = size_t(2) << 20;
// Columns of a chunk taken at a time: one token block's slice of x^T (kGemmSub x 32 floats,
// 8 KB) stays in L1 while the strips of a panel (kPanel strips of gk.rows rows) pass over it;
// the chains go on across the cut through the tile's accumulators (gemm_exact.h).
constexpr int kGemmSub = 64;
constexpr int kPanel = 8;

inline void epilogue(float* o, float s, const float* bias, int j, bool accumulate) {
    *o = (accumulate ? *o : 0.0f) + s + (bias ? bias[j] : 0.0f);
}

// r[i] = row i of an 8 x 8 block -> r[j] = column j.
inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {
        u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int j = 0; j < 4; ++j) {
        r[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
        r[j + 4] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
    }
}

// x[t0 .. t0 + nt) as blocks of 32 tokens, each [k, 32] (lanes beyond nt zero): 8 x 8 blocks
// transposed in registers, the edges element by element (a copy: no arithmetic).
void transpose_tokens(const float* x, int t0, int nt, int k, float* xt, int n_threads) {
    const int n_blocks = (nt + kGemmTokens - 1) / kGemmTokens;
#pragma omp parallel for num_threads(n_threads) schedule(static) if (n_threads > 1 && n_blocks > 1)
    for (int b = 0; b < n_blocks; ++b) {
        float* blk = xt + size_t(b) * k * kGemmTokens;
        const int tb = t0 + b * kGemmTokens, cnt = std::min(kGemmTokens, t0 + nt - tb);
        const int c8 = k / 8 * 8, t8 = cnt / 8 * 8;
        for (int c = 0; c < c8; c += 8) {
            for (int t = 0; t < t8; t += 8) {
                __m256 r[8];
                for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(x + size_t(tb + t + i) * k + c);
                transpose8(r);
                for (int j = 0; j < 8; ++j)
                    _mm256_storeu_ps(blk + size_t(c + j) * kGemmTokens + t, r[j]);
            }
        }
        for (int c = 0; c < k; ++c) {
            float* row = blk + size_t(c) * kGemmTokens;
            for (int t = c < c8 ? t8 : 0; t < cnt; ++t) row[t] = x[size_t(tb + t) * k + c];
            for (int t = cnt; t < kGemmTokens; ++t) row[t] = 0.0f;
        }
    }
}

float* aligned64(std::vector<float>& v, size_t n) {
    v.resize(n + 16);
    const size_t misalign = (reinterpret_cast<uintptr_t>(v.data()) / sizeof(float)) % 16;
    return v.data() + (16 - misalign) % 16;
}

// One thread's rows [j0, j1) over the tokens of one group (xt: its blocks), as described above.
// acc and sum hold one [R, kGemmTokens] lane tile per (strip, block): the running chains and the
// sum of the finished chunks.
void run_rows(const GemmKernels& gk, const GemmRows& w, int k, int m, int j0, int j1,
              const float* xt, int t0, int nt, const float* bias, float* out, bool accumulate) {
    const int R = gk.rows, PR = kPanel * R, L = R * kGemmTokens;
    const int n_blocks = (nt + kGemmTokens - 1) / kGemmTokens;
    static thread_local std::vector<float> buf, acc_store, sum_store;
    buf.resize(size_t(PR) * kGemmChunk);
    float* acc = aligned64(acc_store, size_t(kPanel) * n_blocks * L);
    float* sum = aligned64(sum_store, size_t(kPanel) * n_blocks * L);
    for (int p0 = j0; p0 < j1; p0 += PR) {
        const int p1 = std::min(j1, p0 + PR), n_strips = (p1 - p0 + R - 1) / R;
        const size_t tiles = size_t(n_strips) * n_blocks * L;
        for (int c0 = 0; c0 < k; c0 += kGemmChunk) {
            const int kc = std::min(kGemmChunk, k - c0);
            const float* wr[kPanel];
            int64_t ld[kPanel];
            for (int q = 0; q < n_strips; ++q) {
                const int r0 = p0 + q * R, rows = std::min(R, p1 - r0);
                wr[q] = w.fetch(r0, rows, c0, kc, buf.data() + size_t(q) * R * kGemmChunk, &ld[q]);
            }
            for (int sc = 0; sc < kc; sc += kGemmSub) {
                const int kk = std::min(kGemmSub, kc - sc);
                for (int b = 0; b < n_blocks; ++b) {
                    const float* blk = xt + (size_t(b) * k + c0 + sc) * kGemmTokens;
                    const int cnt = std::min(kGemmTokens, nt - b * kGemmTokens);
                    for (int q = 0; q < n_strips; ++q) {
                        const int rows = std::min(R, p1 - (p0 + q * R));
                        gk.tile(wr[q] + sc, ld[q], rows, blk, kk, cnt,
                                acc + (size_t(q) * n_blocks + b) * L, sc == 0);
                    }
                }
            }
            // The chunk's sums, added left to right (lanes beyond a tile's rows/nt are unused).
            if (c0 == 0) {
                std::swap(acc, sum);
            } else {
                for (size_t i = 0; i < tiles; ++i) sum[i] += acc[i];
            }
        }
        for (int b = 0; b < n_blocks; ++b) {
            const int cnt = std::min(kGemmTokens, nt - b * kGemmTokens);
            for (int q = 0; q < n_strips; ++q) {
                const int r0 = p0 + q * R, rows = std::min(R, p1 - r0);
                gk.store(sum + (size_t(q) * n_blocks + b) * L, rows, cnt,
                         bias ? bias + r0 : nullptr, out + size_t(t0 + b * kGemmTokens) * m + r0, m,
                         accumulate);
            }
        }
    }
}

// ---- the AVX2 tile: 8 tokens per register, up to 6 rows x 16 tokens of accumulators ----

template <int R, int V>
void tile_avx2_t(const float* w, int64_t ldw, const float* xt, int kc, float* lanes, bool start) {
    __m256 acc[R][V];
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v)
            acc[r][v] =
                start ? _mm256_setzero_ps() : _mm256_load_ps(lanes + r * kGemmTokens + 8 * v);
    for (int c = 0; c < kc; ++c) {
        __m256 xv[V];
        for (int v = 0; v < V; ++v) xv[v] = _mm256_loadu_ps(xt + size_t(c) * kGemmTokens + 8 * v);
        for (int r = 0; r < R; ++r) {
            const __m256 wb = _mm256_broadcast_ss(w + r * ldw + c);
            for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(wb, xv[v], acc[r][v]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v) _mm256_store_ps(lanes + r * kGemmTokens + 8 * v, acc[r][v]);
}

template <int R>
void tile_avx2_rows(const float* w, int64_t ldw, const float* xt, int kc, int nt, float* acc,
                    bool start) {
    for (int t0 = 0; t0 < nt; t0 += 16) {
        const int cnt = std::min(16, nt - t0);
        if (cnt > 8) {
            tile_avx2_t<R, 2>(w, ldw, xt + t0, kc, acc + t0, start);
        } else {
            tile_avx2_t<R, 1>(w, ldw, xt + t0, kc, acc + t0, start);
        }
    }
}

void tile_avx2(const float* w, int64_t ldw, int rows, const float* xt, int kc, int nt, float* acc,
               bool start) {
    switch (rows) {
        case 6:
            return tile_avx2_rows<6>(w, ldw, xt, kc, nt, acc, start);
        case 5:
            return tile_avx2_rows<5>(w, ldw, xt, kc, nt, acc, start);
        case 4:
            return tile_avx2_rows<4>(w, ldw, xt, kc, nt, acc, start);
        case 3:
            return tile_avx2_rows<3>(w, ldw, xt, kc, nt, acc, start);
        case 2:
            return tile_avx2_rows<2>(w, ldw, xt, kc, nt, acc, start);
        case 1:
            return tile_avx2_rows<1>(w, ldw, xt, kc, nt, acc, start);
        default:
            IF_FAIL("gemm tile: " << rows << " rows (at most 6 on the AVX2 path)");
    }
}

}  // namespace

void gemm_store_scalar(const float* s, int rows, int nt, const float* bias, float* out, int64_t ldo,
                       bool accumulate) {
    for (int t = 0; t < nt; ++t)
        for (int r = 0; r < rows; ++r)
            epilogue(out + t * ldo + r, s[r * kGemmTokens + t], bias, r, accumulate);
}

const GemmKernels& gemm_kernels_avx2() {
    static const GemmKernels k{CpuIsa::avx2, 6, tile_avx2, gemm_store_scalar};
    return k;
}

const GemmKernels& gemm_kernels() {
    return isa_uses_avx512(active_cpu_isa()) ? gemm_kernels_avx512() : gemm_kernels_avx2();
}

void gemm_exact(const float* x, int n, int k, int m, const GemmRows& w, const float* bias,
                float* out, bool accumulate, int n_threads) {
    if (n <= 0 || m <= 0) return;
    IF_CHECK(k > 0, "gemm_exact: k = " << k);
    const GemmKernels& gk = gemm_kernels();
    const size_t per_token = size_t(k) * sizeof(float);
    const int group =
        int(std::clamp<size_t>(kGroupBytes / per_token / kGemmTokens, 1, 16)) * kGemmTokens;
    const int n_units = (m + gk.rows - 1) / gk.rows;
    const int threads = std::max(1, std::min(n_threads, n_units));
    static thread_local std::vector<float> xt;
    xt.resize(size_t((std::min(n, group) + kGemmTokens - 1) / kGemmTokens) * kGemmTokens * k);
    for (int t0 = 0; t0 < n; t0 += group) {
        const int nt = std::min(group, n - t0);
        transpose_tokens(x, t0, nt, k, xt.data(), threads);
        const float* xtp = xt.data();
#pragma omp parallel num_threads(threads) if (threads > 1)
        {
            const int th = omp_get_thread_num(), nth = omp_get_num_threads();
            const int j0 = std::min(m, int(int64_t(n_units) * th / nth) * gk.rows);
            const int j1 = std::min(m, int(int64_t(n_units) * (th + 1) / nth) * gk.rows);
            if (j0 < j1) run_rows(gk, w, k, m, j0, j1, xtp, t0, nt, bias, out, accumulate);
        }
    }
}

void gemm_exact_ref(const float* x, int n, int k, int m, const float* w, const float* bias,
                    float* out, bool accumulate) {
    for (int t = 0; t < n; ++t) {
        for (int j = 0; j < m; ++j) {
            float s = 0.0f;
            for (int c0 = 0; c0 < k; c0 += kGemmChunk) {
                float acc = 0.0f;
                for (int c = c0; c < std::min(k, c0 + kGemmChunk); ++c)
                    acc = std::fma(w[size_t(j) * k + c], x[size_t(t) * k + c], acc);
                s = c0 > 0 ? s + acc : acc;
            }
            epilogue(out + size_t(t) * m + j, s, bias, j, accumulate);
        }
    }
}

}  // namespace infoflow::cpu
