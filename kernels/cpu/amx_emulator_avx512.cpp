// The tile emulator's TDPBF16PS on AVX-512 (kernels/cpu/amx_emulator.cpp calls it wherever the CPU
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// has AVX-512, which the amx path needs anyway): the same numbers as the emulator's plain loop,
// each output lane one FMA chain over the pairs in order, two roundings per pair, bf16 denormal
// inputs read as zero and denormal results flushed to a zero of their sign. One register holds
// an accumulator row's 16 columns; the rows are 16 independent chains, interleaved so the FMA
// latency is hidden. Only this file is compiled with the AVX-512 flags.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/amx_emulator.h"

namespace infoflow::cpu {
namespace {

// The even (kHigh = false) or odd bf16 of each 32-bit pair word widened to fp32, a denormal
// (exponent 0) read as a zero of its sign.
template <bool kHigh>
inline __m512 widen_pairs(__m512i words) {
    const __m512i x = kHigh ? _mm512_and_si512(words, _mm512_set1_epi32(int(0xFFFF0000u)))
                            : _mm512_slli_epi32(words, 16);
    const __mmask16 denormal = _mm512_testn_epi32_mask(x, _mm512_set1_epi32(0x7F800000));
    return _mm512_castsi512_ps(
        _mm512_mask_and_epi32(x, denormal, x, _mm512_set1_epi32(int(0x80000000u))));
}

// A denormal lane flushed to a zero of its sign (VFPCLASSPS class 0x20: denormal).
inline __m512 flush(__m512 x) {
    const __mmask16 denormal = _mm512_fpclass_ps_mask(x, 0x20);
    return _mm512_mask_and_ps(x, denormal, x,
                              _mm512_castsi512_ps(_mm512_set1_epi32(int(0x80000000u))));
}

// Folds the biased exponents of x's nonzero lanes (a denormal's is 0) into the lane-wise minima
// `emin`.
inline void fold_exponents(__m512 x, __mmask16 lanes, __m512i& emin) {
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i e = _mm512_srli_epi32(_mm512_and_si512(bits, _mm512_set1_epi32(0x7F800000)), 23);
    const __mmask16 nonzero =
        _mm512_mask_test_epi32_mask(lanes, bits, _mm512_set1_epi32(0x7FFFFFFF));
    emin = _mm512_mask_min_epu32(emin, nonzero, emin, e);
}

inline int reduce_min(__m512i emin) { return int(_mm512_reduce_min_epu32(emin)); }

template <bool kFlush>
void dp_rows(__m512* acc, const float (*a0)[kAmxTileRows], const float (*a1)[kAmxTileRows],
             const __m512* b0, const __m512* b1, int m, int pairs) {
    for (int p = 0; p < pairs; ++p) {
#pragma GCC unroll 16
        for (int r = 0; r < kAmxTileRows; ++r) {
            if (r >= m) break;
            __m512 t = _mm512_fmadd_ps(_mm512_set1_ps(a0[r][p]), b0[p], acc[r]);
            if (kFlush) t = flush(t);
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(a1[r][p]), b1[p], t);
            if (kFlush) acc[r] = flush(acc[r]);
        }
    }
}

}  // namespace

// Every value in the chains is a multiple of the smallest quantum among the inputs: a product of
// bf16 values of exponents ea, eb one of 2^(ea + eb - 14), an accumulator of exponent ec one of
// 2^(ec - 23); rounding to nearest keeps a nonzero multiple of 2^Q at least 2^Q in magnitude. So
// when that quantum is at least 2^-126 (FLT_MIN) no step can produce a denormal, and the chains
// run without the flush, bit for bit the same (the common case: activations and weights far
// from 2^-100). Otherwise every step is flushed as the definition says.
void amx_emulated_dpbf16ps_avx512(uint8_t (*c)[kAmxTileBytes], const uint8_t (*a)[kAmxTileBytes],
                                  const uint8_t (*b)[kAmxTileBytes], int m, int n, int pairs) {
    const __mmask16 cols = __mmask16((1u << n) - 1);
    const __mmask16 pmask = __mmask16((1u << pairs) - 1);
    __m512i ea = _mm512_set1_epi32(255), eb = ea, ec = ea;
    __m512 b0[kAmxTileRows], b1[kAmxTileRows];
    for (int p = 0; p < pairs; ++p) {
        const __m512i w = _mm512_maskz_loadu_epi32(cols, b[p]);
        b0[p] = widen_pairs<false>(w);
        b1[p] = widen_pairs<true>(w);
        fold_exponents(b0[p], cols, eb);
        fold_exponents(b1[p], cols, eb);
    }
    // a's pairs widened, per row: a0[r][p] (even), a1[r][p] (odd).
    alignas(64) float a0[kAmxTileRows][kAmxTileRows], a1[kAmxTileRows][kAmxTileRows];
    for (int r = 0; r < m; ++r) {
        const __m512i w = _mm512_maskz_loadu_epi32(pmask, a[r]);
        const __m512 x0 = widen_pairs<false>(w), x1 = widen_pairs<true>(w);
        _mm512_store_ps(a0[r], x0);
        _mm512_store_ps(a1[r], x1);
        fold_exponents(x0, pmask, ea);
        fold_exponents(x1, pmask, ea);
    }
    __m512 acc[kAmxTileRows];
    for (int r = 0; r < m; ++r) {
        acc[r] = _mm512_maskz_loadu_ps(cols, c[r]);
        fold_exponents(acc[r], cols, ec);
    }
    // Biased exponents: products' quantum 2^(ea + eb - 254 - 14), accumulators' 2^(ec - 127 - 23).
    // (a and b hold no denormal: widen_pairs read them as zero; a denormal accumulator's exponent
    // 0 fails the test.)
    const bool exact_without_flush =
        reduce_min(ea) + reduce_min(eb) - 268 >= -126 && reduce_min(ec) - 150 >= -126;
    if (exact_without_flush) {
        dp_rows<false>(acc, a0, a1, b0, b1, m, pairs);
    } else {
        dp_rows<true>(acc, a0, a1, b0, b1, m, pairs);
    }
    for (int r = 0; r < m; ++r) _mm512_mask_storeu_ps(c[r], cols, acc[r]);
}

}  // namespace infoflow::cpu
