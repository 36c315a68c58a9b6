// AVX2 path of the tiled attention kernel (attention_cpu.h) and the choice between the paths.
// Built with the baseline flags (AVX2, FMA, F16C).
#include "kernels/cpu/attention_cpu.h"

#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/attention_cpu_impl.h"
#include "kernels/cpu/cpu_math.h"
#include "runtime/core/error.h"
#include "runtime/core/half.h"

namespace infoflow::cpu {
namespace {

// 8 floats; a key tile is 32 keys (4 registers a score row), 2 query rows per register block.
struct Avx2 {
    using F = __m256;
    static constexpr int L = 8, NV = 4, RB = 2, DV = 4;
    static F zero() { return _mm256_setzero_ps(); }
    static F set1(float x) { return _mm256_set1_ps(x); }
    static F load(const float* x) { return _mm256_loadu_ps(x); }
    static void store(float* x, F v) { _mm256_storeu_ps(x, v); }
    static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
    static F add(F a, F b) { return _mm256_add_ps(a, b); }
    static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
    static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
    static F max(F a, F b) { return _mm256_max_ps(a, b); }
    static F exp(F x) { return exp256(x); }
    static float hmax(F v) {
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
        return _mm_cvtss_f32(m);
    }
    static float hsum(F v) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        return _mm_cvtss_f32(s);
    }
    // Scores of keys invisible to the query (position qp, group qg) become -inf.
    static F mask(F s, const int32_t* kp, const int32_t* kg, int32_t qp, int32_t qg, bool groups) {
        const __m256i pos = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kp));
        __m256i hidden = _mm256_cmpgt_epi32(pos, _mm256_set1_epi32(qp));
        if (groups) {
            const __m256i grp = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kg));
            const __m256i shared = _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_setzero_si256(), grp),
                                                   _mm256_cmpeq_epi32(grp, _mm256_set1_epi32(qg)));
            hidden = _mm256_or_si256(hidden, _mm256_andnot_si256(shared, _mm256_set1_epi32(-1)));
        }
        return _mm256_blendv_ps(s, _mm256_set1_ps(-INFINITY), _mm256_castsi256_ps(hidden));
    }
    static F load_f16(const uint16_t* h) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
    }
    static F load_bf16(const uint16_t* h) {
        const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
    }
    static void widen(KvDtype t, const void* src, int n, float* dst) {
        detail::widen_row_avx2(t, src, n, dst);
    }
    // Lane j of the result = the sum of t[j]'s 8 lanes: pairs, quadruples, then the halves.
    static F reduce_lanes(const F* t) {
        F a[4], b[2];
        for (int i = 0; i < 4; ++i)
            a[i] = _mm256_add_ps(_mm256_unpacklo_ps(t[2 * i], t[2 * i + 1]),
                                 _mm256_unpackhi_ps(t[2 * i], t[2 * i + 1]));
        for (int i = 0; i < 2; ++i)
            b[i] = _mm256_add_ps(_mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44),
                                 _mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE));
        return _mm256_add_ps(_mm256_permute2f128_ps(b[0], b[1], 0x20),
                             _mm256_permute2f128_ps(b[0], b[1], 0x31));
    }
    // dst[c * dst_stride + j] = src[j * stride + c], j < n (<= 8; rows past n are zeros), c < 8:
    // the 8 x 8 transpose in registers (pairs, then 4 x 4 blocks, then 128-bit halves).
    static void transpose(const float* src, size_t stride, int n, float* dst, size_t dst_stride) {
        __m256 r[8], t[8];
        for (int j = 0; j < 8; ++j)
            r[j] = j < n ? _mm256_loadu_ps(src + size_t(j) * stride) : _mm256_setzero_ps();
        for (int i = 0; i < 4; ++i) {
            t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // r[4i + c], 128-bit half L: rows 4i..4i+3 at column 4L + c.
        for (int i = 0; i < 2; ++i) {
            r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
            r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
            r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
            r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
        }
        for (int c = 0; c < 4; ++c) {
            _mm256_storeu_ps(dst + size_t(c) * dst_stride,
                             _mm256_permute2f128_ps(r[c], r[4 + c], 0x20));
            _mm256_storeu_ps(dst + size_t(4 + c) * dst_stride,
                             _mm256_permute2f128_ps(r[c], r[4 + c], 0x31));
        }
    }
};

}  // namespace

namespace detail {

void widen_row_avx2(KvDtype t, const void* src, int n, float* dst) {
    int i = 0;
    if (t == KvDtype::f32) {
        std::memcpy(dst, src, size_t(n) * sizeof(float));
        return;
    }
    const uint16_t* h = static_cast<const uint16_t*>(src);
    if (t == KvDtype::f16) {
        for (; i + 8 <= n; i += 8) {
            const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i));
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(x));
        }
        for (; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
    } else {
        for (; i + 8 <= n; i += 8) {
            const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i));
            const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16);
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(w));
        }
        for (; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
    }
}

void attention_avx2(const AttnParams& p, int n_threads) { tiled::attention<Avx2>(p, n_threads); }

}  // namespace detail

void attention_isa(CpuIsa isa, const AttnParams& p, int n_threads) {
    if (isa == CpuIsa::amx && amx_tiles_for_attention()) {
        attention_amx(p, n_threads, amx_tiles());
    } else if (isa_uses_avx512(isa)) {
        IF_CHECK(cpu_has_avx512(), "attention: the avx512 path needs a CPU with AVX-512");
        detail::attention_avx512(p, n_threads);
    } else {
        detail::attention_avx2(p, n_threads);
    }
}

void attention_amx(const AttnParams& p, int n_threads, const AmxTileOps& tiles) {
    IF_CHECK(cpu_has_avx512(), "attention: the amx path needs a CPU with AVX-512");
    detail::attention_amx(p, n_threads, tiles);
}

void attention(const AttnParams& p, int n_threads) {
    attention_isa(active_cpu_isa(), p, n_threads);
}

void widen_kv_rows(KvDtype t, const void* src, size_t src_stride, int n, int w, float* dst) {
    const bool avx512 = isa_uses_avx512(active_cpu_isa());
    const size_t esize = kv_dtype_size(t);
    for (int i = 0; i < n; ++i) {
        const void* row = static_cast<const char*>(src) + size_t(i) * src_stride * esize;
        if (avx512) {
            detail::widen_row_avx512(t, row, w, dst + size_t(i) * w);
        } else {
            detail::widen_row_avx2(t, row, w, dst + size_t(i) * w);
        }
    }
}

}  // namespace infoflow::cpu
