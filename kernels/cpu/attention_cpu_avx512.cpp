// AVX-512 path of the tiled attention kernel (attention_cpu.h). This file alone is built with the
// AVX-512 flags (CMakeLists.txt) and runs only where active_cpu_isa() picks it.
#include "kernels/cpu/attention_cpu.h"
#include "runtime/core/error.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
// GCC 12 reports its own AVX-512 intrinsics (built on _mm512_undefined_*) as maybe-uninitialized
// once inlined; the warning says nothing about this file.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/attention_cpu_impl.h"
#include "runtime/core/half.h"

namespace infoflow::cpu {
namespace {

// exp for 16 floats (the Cephes polynomial of exp256, kernels/cpu/cpu_math.h); inputs below -87
// give exactly 0.
inline __m512 exp512(__m512 x) {
    const __mmask16 zero_mask = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f));
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 fx = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f));
    fx = _mm512_roundscale_ps(fx, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    const __m512 z = _mm512_mul_ps(x, x);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_fmadd_ps(y, z, x);
    y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
    __m512i n = _mm512_cvttps_epi32(fx);
    n = _mm512_slli_epi32(_mm512_add_epi32(n, _mm512_set1_epi32(127)), 23);
    y = _mm512_mul_ps(y, _mm512_castsi512_ps(n));
    return _mm512_maskz_mov_ps(_knot_mask16(zero_mask), y);
}

// 16 floats; a key tile is 64 keys (4 registers a score row), 4 query rows per register block.
struct Avx512 {
    using F = __m512;
    static constexpr int L = 16, NV = 4, RB = 4, DV = 4;
    static F zero() { return _mm512_setzero_ps(); }
    static F set1(float x) { return _mm512_set1_ps(x); }
    static F load(const float* x) { return _mm512_loadu_ps(x); }
    static void store(float* x, F v) { _mm512_storeu_ps(x, v); }
    static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
    static F add(F a, F b) { return _mm512_add_ps(a, b); }
    static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
    static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
    static F max(F a, F b) { return _mm512_max_ps(a, b); }
    static F exp(F x) { return exp512(x); }
    static float hmax(F v) { return _mm512_reduce_max_ps(v); }
    static float hsum(F v) { return _mm512_reduce_add_ps(v); }
    // Scores of keys invisible to the query (position qp, group qg) become -inf.
    static F mask(F s, const int32_t* kp, const int32_t* kg, int32_t qp, int32_t qg, bool groups) {
        __mmask16 vis = _mm512_cmple_epi32_mask(_mm512_loadu_si512(kp), _mm512_set1_epi32(qp));
        if (groups) {
            const __m512i grp = _mm512_loadu_si512(kg);
            vis &= _mm512_cmplt_epi32_mask(grp, _mm512_setzero_si512()) |
                   _mm512_cmpeq_epi32_mask(grp, _mm512_set1_epi32(qg));
        }
        return _mm512_mask_blend_ps(vis, _mm512_set1_ps(-INFINITY), s);
    }
    static F load_f16(const uint16_t* h) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
    }
    static F load_bf16(const uint16_t* h) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
    }
    static void widen(KvDtype t, const void* src, int n, float* dst) {
        detail::widen_row_avx512(t, src, n, dst);
    }
    // Lane j of the result = the sum of t[j]'s 16 lanes: pairs, then quadruples, then 128-bit
    // blocks added while they are interleaved into key order.
    static F reduce_lanes(const F* t) {
        F a[8], b[4];
        for (int i = 0; i < 8; ++i)
            a[i] = _mm512_add_ps(_mm512_unpacklo_ps(t[2 * i], t[2 * i + 1]),
                                 _mm512_unpackhi_ps(t[2 * i], t[2 * i + 1]));
        // b[i], 128-bit block L: block L's sums of t[4i..4i+3].
        for (int i = 0; i < 4; ++i)
            b[i] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44),
                                 _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE));
        const F d01 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], 0x88),
                                    _mm512_shuffle_f32x4(b[0], b[1], 0xDD));
        const F d23 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], 0x88),
                                    _mm512_shuffle_f32x4(b[2], b[3], 0xDD));
        return _mm512_add_ps(_mm512_shuffle_f32x4(d01, d23, 0x88),
                             _mm512_shuffle_f32x4(d01, d23, 0xDD));
    }
    // dst[c * dst_stride + j] = src[j * stride + c], j < n (<= 16; rows past n are zeros),
    // c < 16: the 16 x 16 transpose in registers (pairs, then 4 x 4 blocks, then 128-bit lanes).
    static void transpose(const float* src, size_t stride, int n, float* dst, size_t dst_stride) {
        __m512 r[16], t[16];
        for (int j = 0; j < 16; ++j)
            r[j] = j < n ? _mm512_loadu_ps(src + size_t(j) * stride) : _mm512_setzero_ps();
        for (int i = 0; i < 8; ++i) {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // r[4i + c], 128-bit lane L: rows 4i..4i+3 at column 4L + c.
        for (int i = 0; i < 4; ++i) {
            r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
            r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
            r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
            r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
        }
        // Column 4L + c gathers lane L of r[c], r[4 + c], r[8 + c], r[12 + c].
        for (int c = 0; c < 4; ++c) {
            const __m512 a = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
            const __m512 b = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
            const __m512 e = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
            const __m512 f = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
            _mm512_storeu_ps(dst + size_t(c) * dst_stride, _mm512_shuffle_f32x4(a, b, 0x88));
            _mm512_storeu_ps(dst + size_t(8 + c) * dst_stride, _mm512_shuffle_f32x4(a, b, 0xDD));
            _mm512_storeu_ps(dst + size_t(4 + c) * dst_stride, _mm512_shuffle_f32x4(e, f, 0x88));
            _mm512_storeu_ps(dst + size_t(12 + c) * dst_stride, _mm512_shuffle_f32x4(e, f, 0xDD));
        }
    }
};

}  // namespace

namespace detail {

void widen_row_avx512(KvDtype t, const void* src, int n, float* dst) {
    if (t == KvDtype::f32) {
        std::memcpy(dst, src, size_t(n) * sizeof(float));
        return;
    }
    const uint16_t* h = static_cast<const uint16_t*>(src);
    int i = 0;
    if (t == KvDtype::f16) {
        for (; i + 16 <= n; i += 16) {
            const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i));
            _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(x));
        }
        for (; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
    } else {
        for (; i + 16 <= n; i += 16) {
            const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i));
            const __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16);
            _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(w));
        }
        for (; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
    }
}

void attention_avx512(const AttnParams& p, int n_threads) {
    tiled::attention<Avx512>(p, n_threads);
}

void attention_amx(const AttnParams& p, int n_threads, const AmxTileOps& tiles) {
    tiled::attention_tiles<Avx512>(p, n_threads, tiles);
}

}  // namespace detail
}  // namespace infoflow::cpu

#else  // built without the AVX-512 flags (not an x86-64 build): the path does not exist

namespace infoflow::cpu::detail {
void widen_row_avx512(KvDtype, const void*, int, float*) {
    IF_CHECK(false, "the avx512 CPU path is not built on this architecture");
}
void attention_avx512(const AttnParams&, int) {
    IF_CHECK(false, "the avx512 CPU path is not built on this architecture");
}
void attention_amx(const AttnParams&, int, const AmxTileOps&) {
    IF_CHECK(false, "the amx CPU path is not built on this architecture");
}
}  // namespace infoflow::cpu::detail

#endif
