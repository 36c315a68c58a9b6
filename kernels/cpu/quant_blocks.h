// Decoding of one GGUF block (docs/formats.md §3.1, §3.2) into 32 unsigned 8-bit codes in element
// order plus an affine map, value = d * code + m, shared by the AVX2 and AVX-512 kernels
// (quant_dot.cpp, quant_dot_avx512.cpp). Every function is `static inline`, so each of those
// translation units gets its own copy compiled with its own instruction-set flags.
// Offset types fold their offset into m (Q4_0: m = -8d, Q5_0: -16d, Q8_0 with its codes moved to
// unsigned by +128: -128d); fma(d, code, m) is then exactly d * (code - offset), rounded once.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/quant_dot.h"

namespace infoflow::cpu::blocks {

static inline float half_to_float(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

// Elements 0..15 are the low nibbles of qs[0..15], elements 16..31 the high nibbles.
static inline __m256i expand_nibbles(const uint8_t* qs) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(q, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    return _mm256_set_m128i(hi, lo);
}

// Byte k = 0x10 where bit k of h is set (the fifth bit of a Q5 code), else 0.
static inline __m256i fifth_bits(uint32_t h) {
    // Byte k takes byte k/8 of h (both 128-bit lanes hold h broadcast), then tests bit k%8.
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                            2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(int(h)), spread);
    const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

struct Codes {
    __m256i u;  // 32 codes, element order
    float d;
    float m;
};

static inline Codes unpack_q4_0(const uint8_t* b) {
    const float d = half_to_float(b);
    return {expand_nibbles(b + 2), d, -8.0f * d};
}
static inline Codes unpack_q4_1(const uint8_t* b) {
    return {expand_nibbles(b + 4), half_to_float(b), half_to_float(b + 2)};
}
static inline Codes unpack_q5_0(const uint8_t* b) {
    const float d = half_to_float(b);
    uint32_t h;
    std::memcpy(&h, b + 2, 4);
    return {_mm256_or_si256(expand_nibbles(b + 6), fifth_bits(h)), d, -16.0f * d};
}
static inline Codes unpack_q5_1(const uint8_t* b) {
    uint32_t h;
    std::memcpy(&h, b + 4, 4);
    return {_mm256_or_si256(expand_nibbles(b + 8), fifth_bits(h)), half_to_float(b),
            half_to_float(b + 2)};
}
// Q8_0 codes as unsigned (q + 128), for the VNNI dot and as a generic fallback.
static inline Codes unpack_q8_0_unsigned(const uint8_t* b) {
    const float d = half_to_float(b);
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    return {_mm256_xor_si256(q, _mm256_set1_epi8(char(0x80))), d, -128.0f * d};
}

// Q6_K: 32-element sub-block j (0..7) of a 256-element super-block (docs/formats.md §3.2):
// half n = j / 4, quarter k = j % 4 gives outputs 128n + 32k + l, l = 0..31. Codes are the
// unsigned 6-bit values (value = d * sc * (code - 32)); l < 16 uses scale sc0, l >= 16 sc1.
struct Q6Codes {
    __m256i u;
    int sc0;
    int sc1;
};
static inline Q6Codes unpack_q6_k_sub(const uint8_t* b, int j) {
    const int n = j >> 2, k = j & 3;
    const __m256i mask4 = _mm256_set1_epi8(0x0F), mask2 = _mm256_set1_epi8(0x03);
    __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * n + 32 * (k & 1)));
    if (k >= 2) lo = _mm256_srli_epi16(lo, 4);
    lo = _mm256_and_si256(lo, mask4);
    __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * n));
    hi = _mm256_and_si256(_mm256_srl_epi16(hi, _mm_cvtsi32_si128(2 * k)), mask2);
    hi = _mm256_slli_epi16(hi, 4);  // bits 4..5; no carry across bytes (values <= 3)
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * n + 2 * k;
    return {_mm256_or_si256(lo, hi), sc[0], sc[1]};
}
static inline float q6_k_d(const uint8_t* b) { return half_to_float(b + 208); }

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

}  // namespace infoflow::cpu::blocks
