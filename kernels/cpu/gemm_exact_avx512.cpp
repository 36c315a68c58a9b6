// gemm_exact's tile on the AVX-512 path (gemm_exact.h): 16 tokens per register, up to 12 rows x
// 32 tokens of accumulators (24 registers); per column one load of each 16-token half of x^T and
// one broadcast FMA per row and half. Each lane is one (row, token) FMA chain, so the numbers
// are those of the AVX2 tile and of gemm_exact_ref. Only this file is compiled with the AVX-512
// flags; it runs only where active_cpu_isa() picks it.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/gemm_exact.h"
#include "runtime/core/error.h"

namespace infoflow::cpu {
namespace {

template <int R, int V>
void tile_t(const float* w, int64_t ldw, const float* xt, int kc, float* lanes, bool start) {
    __m512 acc[R][V];
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v)
            acc[r][v] = start ? _mm512_setzero_ps()
                              : _mm512_load_ps(lanes + r * kGemmTokens + 16 * v);
    for (int c = 0; c < kc; ++c) {
        __m512 xv[V];
        for (int v = 0; v < V; ++v) xv[v] = _mm512_loadu_ps(xt + size_t(c) * kGemmTokens + 16 * v);
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) {
            const __m512 wb = _mm512_set1_ps(w[r * ldw + c]);
            for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(wb, xv[v], acc[r][v]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v) _mm512_store_ps(lanes + r * kGemmTokens + 16 * v, acc[r][v]);
}

template <int R>
void tile_rows(const float* w, int64_t ldw, const float* xt, int kc, int nt, float* acc,
               bool start) {
    if (nt > 16) {
        tile_t<R, 2>(w, ldw, xt, kc, acc, start);
    } else {
        tile_t<R, 1>(w, ldw, xt, kc, acc, start);
    }
}

void tile(const float* w, int64_t ldw, int rows, const float* xt, int kc, int nt, float* s,
          bool add) {
    switch (rows) {
        case 12: return tile_rows<12>(w, ldw, xt, kc, nt, s, add);
        case 11: return tile_rows<11>(w, ldw, xt, kc, nt, s, add);
        case 10: return tile_rows<10>(w, ldw, xt, kc, nt, s, add);
        case 9: return tile_rows<9>(w, ldw, xt, kc, nt, s, add);
        case 8: return tile_rows<8>(w, ldw, xt, kc, nt, s, add);
        case 7: return tile_rows<7>(w, ldw, xt, kc, nt, s, add);
        case 6: return tile_rows<6>(w, ldw, xt, kc, nt, s, add);
        case 5: return tile_rows<5>(w, ldw, xt, kc, nt, s, add);
        case 4: return tile_rows<4>(w, ldw, xt, kc, nt, s, add);
        case 3: return tile_rows<3>(w, ldw, xt, kc, nt, s, add);
        case 2: return tile_rows<2>(w, ldw, xt, kc, nt, s, add);
        case 1: return tile_rows<1>(w, ldw, xt, kc, nt, s, add);
        default: IF_FAIL("gemm tile: " << rows << " rows (at most 12 on the AVX-512 path)");
    }
}

// m[i] = row i of a 16 x 16 block -> m[j] = column j (unpack within 128-bit lanes, then a 4 x 4
// transpose of the lanes).
inline void transpose16(__m512 m[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_ps(m[2 * i], m[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(m[2 * i], m[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {  // u[4i + j], lane L: rows 4i..4i+3 of column 4L + j
        u[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int j = 0; j < 4; ++j) {
        const __m512 a0 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88);
        const __m512 a1 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xDD);
        const __m512 a2 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88);
        const __m512 a3 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xDD);
        m[j] = _mm512_shuffle_f32x4(a0, a2, 0x88);
        m[j + 8] = _mm512_shuffle_f32x4(a0, a2, 0xDD);
        m[j + 4] = _mm512_shuffle_f32x4(a1, a3, 0x88);
        m[j + 12] = _mm512_shuffle_f32x4(a1, a3, 0xDD);
    }
}

// The epilogue: each 16-token half of the lane tile transposed in registers, then the same three
// roundings as gemm_store_scalar on the token's rows at once (masked to `rows`).
void store(const float* s, int rows, int nt, const float* bias, float* out, int64_t ldo,
           bool accumulate) {
    const __mmask16 mask = __mmask16((1u << rows) - 1);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias) : _mm512_setzero_ps();
    for (int h = 0; h * 16 < nt; ++h) {
        __m512 m[16];
        for (int r = 0; r < 16; ++r)
            m[r] = r < rows ? _mm512_load_ps(s + r * kGemmTokens + 16 * h) : _mm512_setzero_ps();
        transpose16(m);
        for (int t = 0; t < std::min(16, nt - 16 * h); ++t) {
            float* o = out + (16 * h + t) * ldo;
            const __m512 base = accumulate ? _mm512_maskz_loadu_ps(mask, o) : _mm512_setzero_ps();
            _mm512_mask_storeu_ps(o, mask, _mm512_add_ps(_mm512_add_ps(base, m[t]), b));
        }
    }
}

}  // namespace

const GemmKernels& gemm_kernels_avx512() {
    static const GemmKernels k{CpuIsa::avx512, 12, tile, store};
    return k;
}

}  // namespace infoflow::cpu
