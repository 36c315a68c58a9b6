// The tile emulator's TDPBF16PS on AVX-512 (kernels/cpu/amx_emulator.cpp calls it wherever the CPU
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// has AVX-512, which the amx path needs anyway): the same numbers as the emulator's plain loop,
// each output lane one FMA chain over the pairs in order, two roundings per pair, bf16 denormal
// inputs read as zero and denormal results flushed to a zero of their sign. One register holds
// an accumulator row's 16 columns; the rows are 16 independent chains, interleaved so the FMA
// latency is hidden. Only this file is compiled with the AVX-512 flags.
#include <immintrin.h>

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

}  // namespace

void amx_emulated_dpbf16ps_avx512(uint8_t (*c)[kAmxTileBytes], const uint8_t (*a)[kAmxTileBytes],
                                  const uint8_t (*b)[kAmxTileBytes], int m, int n, int pairs) {
    const __mmask16 cols = __mmask16((1u << n) - 1);
    __m512 b0[kAmxTileRows], b1[kAmxTileRows];
    for (int p = 0; p < pairs; ++p) {
        const __m512i w = _mm512_maskz_loadu_epi32(cols, b[p]);
        b0[p] = widen_pairs<false>(w);
        b1[p] = widen_pairs<true>(w);
    }
    // a's pairs widened, per row: a0[r][p] (even), a1[r][p] (odd).
    alignas(64) float a0[kAmxTileRows][kAmxTileRows], a1[kAmxTileRows][kAmxTileRows];
    const __mmask16 pmask = __mmask16((1u << pairs) - 1);
    for (int r = 0; r < m; ++r) {
        const __m512i w = _mm512_maskz_loadu_epi32(pmask, a[r]);
        _mm512_store_ps(a0[r], widen_pairs<false>(w));
        _mm512_store_ps(a1[r], widen_pairs<true>(w));
    }
    __m512 acc[kAmxTileRows];
    for (int r = 0; r < m; ++r) acc[r] = _mm512_maskz_loadu_ps(cols, c[r]);
    for (int p = 0; p < pairs; ++p) {
#pragma GCC unroll 16
        for (int r = 0; r < kAmxTileRows; ++r) {
            if (r >= m) break;
            const __m512 t = flush(_mm512_fmadd_ps(_mm512_set1_ps(a0[r][p]), b0[p], acc[r]));
            acc[r] = flush(_mm512_fmadd_ps(_mm512_set1_ps(a1[r][p]), b1[p], t));
        }
    }
    for (int r = 0; r < m; ++r) _mm512_mask_storeu_ps(c[r], cols, acc[r]);
}

}  // namespace infoflow::cpu
