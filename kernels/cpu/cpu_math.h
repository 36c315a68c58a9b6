// Small vectorized math helpers for the CPU backend (AVX2/FMA when the build enables it,
// plain loops otherwise). Internal to kernels/cpu.
#pragma once

#include <cmath>
#include <cstddef>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define INFOFLOW_CPU_AVX2 1
#endif

namespace infoflow::cpu {

#if INFOFLOW_CPU_AVX2
// exp for 8 floats (Cephes polynomial, ~1 ulp); inputs below -87 give exactly 0.
inline __m256 exp256(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.3762626647949f);
    const __m256 lo = _mm256_set1_ps(-87.0f);
    const __m256 zero_mask = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(x, hi);
    x = _mm256_max_ps(x, lo);
    __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
    fx = _mm256_floor_ps(fx);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    const __m256 z = _mm256_mul_ps(x, x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, z, x);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    __m256i n = _mm256_cvttps_epi32(fx);
    n = _mm256_add_epi32(n, _mm256_set1_epi32(127));
    n = _mm256_slli_epi32(n, 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(n));
    return _mm256_andnot_ps(zero_mask, y);
}
#endif

// x[i] = exp(x[i] - shift), returns the sum of the results (accumulated in double).
inline double exp_shift_sum(float* x, size_t n, float shift) {
    size_t i = 0;
    double total = 0.0;
#if INFOFLOW_CPU_AVX2
    const __m256 s = _mm256_set1_ps(shift);
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 v = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
        _mm256_storeu_ps(x + i, v);
        acc = _mm256_add_ps(acc, v);
    }
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, acc);
    for (float t : tmp) total += t;
#endif
    for (; i < n; ++i) {
        const float d = x[i] - shift;
        x[i] = d < -87.0f ? 0.0f : std::exp(d);
        total += x[i];
    }
    return total;
}

inline float max_of(const float* x, size_t n) {
    float m = -INFINITY;
    size_t i = 0;
#if INFOFLOW_CPU_AVX2
    __m256 acc = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8) acc = _mm256_max_ps(acc, _mm256_loadu_ps(x + i));
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, acc);
    for (float t : tmp) m = t > m ? t : m;
#endif
    for (; i < n; ++i) m = x[i] > m ? x[i] : m;
    return m;
}

// out[i] = silu(gate[i]) * up[i]; out may alias gate or up.
inline void swiglu_range(const float* gate, const float* up, size_t n, float* out) {
    size_t i = 0;
#if INFOFLOW_CPU_AVX2
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = exp256(_mm256_xor_ps(g, sign));  // exp(-g)
        const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
    }
#endif
    for (; i < n; ++i) {
        const float g = gate[i];
        out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
}

}  // namespace infoflow::cpu
