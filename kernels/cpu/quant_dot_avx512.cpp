// Stored-type kernels, AVX-512 variant (quant_dot.h): two 32-element blocks per 512-bit register,
// integer dots with VNNI (vpdpbusd) where the CPU has it, 16-wide converts, masked tails. Only
// this file is compiled with the AVX-512 flags; it runs only where active_cpu_isa() picks it.
// GCC 12 reports its own AVX-512 intrinsics (built on _mm512_undefined_*) as maybe-uninitialized
// once inlined; the warning says nothing about this file.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/quant_dot.h"
#include "runtime/core/error.h"

namespace infoflow::cpu {
namespace {
// Row groups stream a matrix once per token from memory; the hardware prefetcher alone leaves
// the loads waiting. Decode on the development machine (1 thread, medians of 5-6 interleaved
// rounds): no prefetch ~47 tokens/s, 1 KiB ahead 54-65, 2 KiB 61, 3-8 KiB 70-76 (flat).
constexpr int kPrefetchBytes = 4096;

using namespace blocks;

inline __m256i load32(const int8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
inline __m512i join(__m256i a, __m256i b) {
    return _mm512_inserti64x4(_mm512_zextsi256_si512(a), b, 1);
}
inline __m512 join_scales(float a, float b) {
    return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1);
}

// Sum of u[i] * x[i] (u unsigned codes, x signed int8) as 16 int32 lanes (lane i covers
// elements 4i..4i+3). VNNI accumulates in int32 directly (any u8 code); without it maddubs
// needs codes <= 63 (the 4-, 5- and 6-bit types).
template <bool kVnni>
inline __m512i dot_codes(__m512i u, __m512i x) {
    if constexpr (kVnni) {
        return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, x);
    } else {
        return _mm512_madd_epi16(_mm512_maddubs_epi16(u, x), _mm512_set1_epi16(1));
    }
}

template <bool kVnni, Codes (*Unpack)(const uint8_t*), size_t kBytes>
float dot_affine(const uint8_t* w, const Q8Block* x, int64_t nb) {
    __m512 acc = _mm512_setzero_ps();
    float acc_m = 0.0f;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        const Codes c0 = Unpack(w + b * kBytes), c1 = Unpack(w + (b + 1) * kBytes);
        const __m512i s =
            dot_codes<kVnni>(join(c0.u, c1.u), join(load32(x[b].qs), load32(x[b + 1].qs)));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), join_scales(c0.d * x[b].d, c1.d * x[b + 1].d),
                              acc);
        acc_m += c0.m * x[b].ds + c1.m * x[b + 1].ds;
    }
    float tail = 0.0f;
    if (b < nb) {
        const Codes c = Unpack(w + b * kBytes);
        const __m512i s =
            dot_codes<kVnni>(_mm512_zextsi256_si512(c.u), _mm512_zextsi256_si512(load32(x[b].qs)));
        // Only the low 8 lanes hold this block.
        const __m256i s8 = _mm512_castsi512_si256(s);
        tail = hsum(_mm256_cvtepi32_ps(s8)) * (c.d * x[b].d) + c.m * x[b].ds;
    }
    return _mm512_reduce_add_ps(acc) + acc_m + tail;
}

// Q8_0 without VNNI: signed codes, |w| times x with w's sign moved onto x.
inline __m512i dot_signed(__m512i q, __m512i x) {
    const __mmask64 neg = _mm512_movepi8_mask(q);
    const __m512i aq = _mm512_abs_epi8(q);
    const __m512i xs = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
    return _mm512_madd_epi16(_mm512_maddubs_epi16(aq, xs), _mm512_set1_epi16(1));
}

template <bool kVnni>
float dot_q8_0(const uint8_t* w, const Q8Block* x, int64_t nb) {
    __m512 acc = _mm512_setzero_ps();
    float acc_m = 0.0f;
    int64_t b = 0;
    auto block_pair = [&](int64_t b0, int64_t n) {
        const uint8_t* w0 = w + b0 * 34;
        const uint8_t* w1 = w + (b0 + n - 1) * 34;
        const __m256i q0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0 + 2));
        const __m256i q1 = n == 2 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w1 + 2))
                                  : _mm256_setzero_si256();
        const __m256i x1 = n == 2 ? load32(x[b0 + 1].qs) : _mm256_setzero_si256();
        const __m512i xq = join(load32(x[b0].qs), x1);
        const float d0 = half_to_float(w0) * x[b0].d;
        const float d1 = n == 2 ? half_to_float(w1) * x[b0 + 1].d : 0.0f;
        __m512i s;
        if constexpr (kVnni) {
            // Codes moved to unsigned (q + 128); the offset comes back through the block sums.
            const __m512i u = _mm512_xor_si512(join(q0, q1), _mm512_set1_epi8(char(0x80)));
            s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, xq);
            acc_m -= 128.0f * (half_to_float(w0) * x[b0].ds +
                               (n == 2 ? half_to_float(w1) * x[b0 + 1].ds : 0.0f));
        } else {
            s = dot_signed(join(q0, q1), xq);
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), join_scales(d0, d1), acc);
    };
    for (; b + 2 <= nb; b += 2) block_pair(b, 2);
    if (b < nb) block_pair(b, 1);
    return _mm512_reduce_add_ps(acc) + acc_m;
}

template <bool kVnni>
float dot_q6_k(const uint8_t* w, const Q8Block* x, int64_t n_super) {
    __m512 acc = _mm512_setzero_ps();
    float acc_m = 0.0f;
    for (int64_t s = 0; s < n_super; ++s) {
        const uint8_t* blk = w + s * 210;
        const float d = q6_k_d(blk);
        for (int j = 0; j < 8; j += 2) {
            const Q8Block& x0 = x[s * 8 + j];
            const Q8Block& x1 = x[s * 8 + j + 1];
            const Q6Codes c0 = unpack_q6_k_sub(blk, j), c1 = unpack_q6_k_sub(blk, j + 1);
            __m512i p = dot_codes<kVnni>(join(c0.u, c1.u), join(load32(x0.qs), load32(x1.qs)));
            p = _mm512_mullo_epi32(
                p,
                _mm512_setr_epi32(c0.sc0, c0.sc0, c0.sc0, c0.sc0, c0.sc1, c0.sc1, c0.sc1, c0.sc1,
                                  c1.sc0, c1.sc0, c1.sc0, c1.sc0, c1.sc1, c1.sc1, c1.sc1, c1.sc1));
            const float dd0 = d * x0.d, dd1 = d * x1.d;
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), join_scales(dd0, dd1), acc);
            acc_m -= 32.0f * (dd0 * float(c0.sc0 * x0.sum_lo + c0.sc1 * x0.sum_hi) +
                              dd1 * float(c1.sc0 * x1.sum_lo + c1.sc1 * x1.sum_hi));
        }
    }
    return _mm512_reduce_add_ps(acc) + acc_m;
}

template <bool kVnni>
float dot_q8(uint32_t type, const uint8_t* w, const Q8Block* x, int64_t k) {
    const int64_t nb = k / 32;
    switch (type) {
        case ggml_id::q4_0:
            return dot_affine<kVnni, unpack_q4_0, 18>(w, x, nb);
        case ggml_id::q4_1:
            return dot_affine<kVnni, unpack_q4_1, 20>(w, x, nb);
        case ggml_id::q5_0:
            return dot_affine<kVnni, unpack_q5_0, 22>(w, x, nb);
        case ggml_id::q5_1:
            return dot_affine<kVnni, unpack_q5_1, 24>(w, x, nb);
        case ggml_id::q8_0:
            return dot_q8_0<kVnni>(w, x, nb);
        case ggml_id::q6_k:
            return dot_q6_k<kVnni>(w, x, k / 256);
        default:
            IF_FAIL("dot_q8: ggml type " << type << " is not a quantized weight type");
    }
}

// ---- row groups (quant_dot.h) ----
// Lane 4r + j (j = 0..3) of a 512-bit register belongs to row r of the group: a 64-byte load of
// the group's codes gives every row's elements 0..15 (Q8_0: and another its 16..31; Q4: the low
// nibbles and the high nibbles), and the activations of a block, broadcast to the four 128-bit
// lanes, multiply all four rows at once.

// The four row sums of a register laid out as above.
inline __m128 reduce_rows4(__m512 v) {
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));  // lanes (1, 0, 3, 2) within each 128 bits
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));  // lanes (2, 3, 0, 1)
    return _mm512_castps512_ps128(_mm512_maskz_compress_ps(0x1111, v));
}

inline __m512i bcast16(const int8_t* p) {
    return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The group's block headers as fp32: Q4_1 [d0 m0 d1 m1 d2 m2 d3 m3], Q4_0/Q8_0 [d0 d1 d2 d3].
template <uint32_t kType>
inline __m512 group_headers(const uint8_t* p) {
    if constexpr (kType == ggml_id::q4_1) {
        return _mm512_zextps256_ps512(
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    } else {
        return _mm512_zextps128_ps512(
            _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    }
}

template <uint32_t kType>
constexpr size_t group_header_bytes() {
    return kType == ggml_id::q4_1 ? 4 : 2;
}

// C tokens at once: the group's codes are loaded and unpacked once per block for all of them,
// and each token's lanes go through exactly the operations of the one-token kernel (C = 1), in
// the same order, so a token's four sums do not depend on which other tokens share the call.
template <bool kVnni, uint32_t kType, int C>
void dot_q8_group_t(const uint8_t* g, const Q8Block* x, int64_t nb, float* out, int64_t ldo) {
    constexpr size_t kH = group_header_bytes<kType>();
    constexpr size_t kBlock = 4 * (kType == ggml_id::q4_0 ? 18 : kType == ggml_id::q4_1 ? 20 : 34);
    constexpr bool kQ4 = kType != ggml_id::q8_0;
    // Lane 4r + j takes row r's d (and, for Q4_1, its m) from the headers.
    const __m512i idx_d = kType == ggml_id::q4_1
                              ? _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6)
                              : _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i idx_m = _mm512_setr_epi32(1, 0, 0, 0, 3, 0, 0, 0, 5, 0, 0, 0, 7, 0, 0, 0);
    const __m512i nib = _mm512_set1_epi8(0x0F);
    // Offset types: value = d * (code - off); Q8_0 codes become unsigned (+128) for VNNI.
    constexpr float kOff = kType == ggml_id::q4_0 ? 8.0f : kType == ggml_id::q8_0 ? 128.0f : 0.0f;
    // Q8_0 without VNNI multiplies signed codes: no offset term.
    constexpr bool kMinTerm = kType == ggml_id::q4_1 || kQ4 || kVnni;
    __m512 acc[C], acc_m[C];
    for (int t = 0; t < C; ++t) acc[t] = acc_m[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = g + size_t(b) * kBlock;
        _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
        const __m512 hd = group_headers<kType>(p);
        __m512i lo, hi;
        if constexpr (kQ4) {
            const __m512i q = _mm512_loadu_si512(p + 4 * kH);
            lo = _mm512_and_si512(q, nib);
            hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), nib);
        } else {
            lo = _mm512_loadu_si512(p + 4 * kH);
            hi = _mm512_loadu_si512(p + 4 * kH + 64);
            if constexpr (kVnni) {
                lo = _mm512_xor_si512(lo, _mm512_set1_epi8(char(0x80)));
                hi = _mm512_xor_si512(hi, _mm512_set1_epi8(char(0x80)));
            }
        }
        const __m512 d = _mm512_permutexvar_ps(idx_d, hd);
        // The minimum (Q4_1) or the offset: m_r * (d_x * sum x), in lane 4r alone.
        __m512 m = _mm512_setzero_ps();
        if constexpr (kType == ggml_id::q4_1) {
            m = _mm512_maskz_permutexvar_ps(0x1111, idx_m, hd);
        } else if constexpr (kMinTerm) {
            m = _mm512_mul_ps(_mm512_maskz_permutexvar_ps(0x1111, idx_d, hd),
                              _mm512_set1_ps(-kOff));
        }
#pragma GCC unroll 8
        for (int t = 0; t < C; ++t) {
            const Q8Block& xb = x[t * nb + b];
            const __m512i xlo = bcast16(xb.qs), xhi = bcast16(xb.qs + 16);
            __m512i s;
            if constexpr (!kQ4 && !kVnni) {
                s = _mm512_add_epi32(dot_signed(lo, xlo), dot_signed(hi, xhi));
            } else if constexpr (kVnni) {
                s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xlo), hi,
                                        xhi);
            } else {
                s = _mm512_add_epi32(dot_codes<false>(lo, xlo), dot_codes<false>(hi, xhi));
            }
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, _mm512_set1_ps(xb.d)),
                                     acc[t]);
            if constexpr (kMinTerm) acc_m[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(xb.ds), acc_m[t]);
        }
    }
    for (int t = 0; t < C; ++t)
        _mm_storeu_ps(out + t * ldo, reduce_rows4(_mm512_add_ps(acc[t], acc_m[t])));
}

// Tokens in runs of 4 (register pressure: 2 accumulators per token), the rest one by one.
template <bool kVnni, uint32_t kType>
void dot_q8_group_n(const uint8_t* g, const Q8Block* x, int64_t nb, int n, float* out,
                    int64_t ldo) {
    int t = 0;
    for (; t + 4 <= n; t += 4) dot_q8_group_t<kVnni, kType, 4>(g, x + t * nb, nb, out + t * ldo, ldo);
    for (; t < n; ++t) dot_q8_group_t<kVnni, kType, 1>(g, x + t * nb, nb, out + t * ldo, ldo);
}

template <bool kVnni>
void dot_q8_group(uint32_t type, const uint8_t* g, const Q8Block* x, int64_t k, int n, float* out,
                  int64_t ldo) {
    switch (type) {
        case ggml_id::q4_0:
            return dot_q8_group_n<kVnni, ggml_id::q4_0>(g, x, k / 32, n, out, ldo);
        case ggml_id::q4_1:
            return dot_q8_group_n<kVnni, ggml_id::q4_1>(g, x, k / 32, n, out, ldo);
        case ggml_id::q8_0:
            return dot_q8_group_n<kVnni, ggml_id::q8_0>(g, x, k / 32, n, out, ldo);
        default:
            IF_FAIL("dot_q8_group: ggml type " << type << " has no row groups");
    }
}

// fp32 activations: each row's codes widened to fp32 in registers, one block at a time;
// out[r] = sum_b d_rb * (codes_rb . x_b) (+ m_rb * sum x_b).
template <uint32_t kType, int C>
void dot_f32_group_t(const uint8_t* g, const float* x, int64_t ldx, int64_t nb, float* out,
                     int64_t ldo) {
    constexpr size_t kH = group_header_bytes<kType>();
    constexpr size_t kBlock = 4 * (kType == ggml_id::q4_0 ? 18 : kType == ggml_id::q4_1 ? 20 : 34);
    const __m128i nib = _mm_set1_epi8(0x0F);
    __m512 acc[C][4];
    for (int t = 0; t < C; ++t)
        for (int r = 0; r < 4; ++r) acc[t][r] = _mm512_setzero_ps();
    alignas(64) float hdr[16];
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = g + size_t(b) * kBlock;
        _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
        if constexpr (kBlock > 64)
            _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes + 64, _MM_HINT_T0);
        _mm512_store_ps(hdr, group_headers<kType>(p));
        __m512 x0[C], x1[C], xs[C];
        for (int t = 0; t < C; ++t) {
            x0[t] = _mm512_loadu_ps(x + t * ldx + 32 * b);
            x1[t] = _mm512_loadu_ps(x + t * ldx + 32 * b + 16);
            xs[t] = _mm512_add_ps(x0[t], x1[t]);
        }
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
            __m512i lo, hi;
            if constexpr (kType == ggml_id::q8_0) {
                lo = _mm512_cvtepi8_epi32(
                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4 * kH + 16 * r)));
                hi = _mm512_cvtepi8_epi32(
                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4 * kH + 64 + 16 * r)));
            } else {
                const __m128i q =
                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4 * kH + 16 * r));
                lo = _mm512_cvtepu8_epi32(_mm_and_si128(q, nib));
                hi = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), nib));
                if constexpr (kType == ggml_id::q4_0) {
                    lo = _mm512_sub_epi32(lo, _mm512_set1_epi32(8));
                    hi = _mm512_sub_epi32(hi, _mm512_set1_epi32(8));
                }
            }
            const __m512 flo = _mm512_cvtepi32_ps(lo), fhi = _mm512_cvtepi32_ps(hi);
            const float d = kType == ggml_id::q4_1 ? hdr[2 * r] : hdr[r];
            for (int t = 0; t < C; ++t) {
                __m512 v = _mm512_mul_ps(flo, x0[t]);
                v = _mm512_fmadd_ps(fhi, x1[t], v);
                acc[t][r] = _mm512_fmadd_ps(_mm512_set1_ps(d), v, acc[t][r]);
                if constexpr (kType == ggml_id::q4_1)
                    acc[t][r] = _mm512_fmadd_ps(_mm512_set1_ps(hdr[2 * r + 1]), xs[t], acc[t][r]);
            }
        }
    }
    for (int t = 0; t < C; ++t)
        for (int r = 0; r < 4; ++r) out[t * ldo + r] = _mm512_reduce_add_ps(acc[t][r]);
}

template <uint32_t kType>
void dot_f32_group_n(const uint8_t* g, const float* x, int64_t ldx, int64_t nb, int n, float* out,
                     int64_t ldo) {
    int t = 0;
    for (; t + 2 <= n; t += 2)
        dot_f32_group_t<kType, 2>(g, x + t * ldx, ldx, nb, out + t * ldo, ldo);
    for (; t < n; ++t) dot_f32_group_t<kType, 1>(g, x + t * ldx, ldx, nb, out + t * ldo, ldo);
}

void dot_f32_group(uint32_t type, const uint8_t* g, const float* x, int64_t ldx, int64_t k, int n,
                   float* out, int64_t ldo) {
    switch (type) {
        case ggml_id::q4_0:
            return dot_f32_group_n<ggml_id::q4_0>(g, x, ldx, k / 32, n, out, ldo);
        case ggml_id::q4_1:
            return dot_f32_group_n<ggml_id::q4_1>(g, x, ldx, k / 32, n, out, ldo);
        case ggml_id::q8_0:
            return dot_f32_group_n<ggml_id::q8_0>(g, x, ldx, k / 32, n, out, ldo);
        default:
            IF_FAIL("dot_f32_group: ggml type " << type << " has no row groups");
    }
}

// n (<= 16) stored floats to fp32; the rest of the register is zero.
inline __m512 load16(uint32_t type, const uint8_t* p, int n) {
    const __mmask16 m = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
    switch (type) {
        case ggml_id::f16:
            return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
        case ggml_id::bf16:
            return _mm512_castsi512_ps(
                _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
        default:
            return _mm512_maskz_loadu_ps(m, p);
    }
}

float dot_f32(uint32_t type, const uint8_t* w, const float* x, int64_t k) {
    IF_CHECK(type == ggml_id::f32 || type == ggml_id::f16 || type == ggml_id::bf16,
             "dot_f32: ggml type " << type << " is not a float weight type");
    const size_t es = native_block_bytes(type);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        a0 = _mm512_fmadd_ps(load16(type, w + i * es, 16), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(load16(type, w + (i + 16) * es, 16), _mm512_loadu_ps(x + i + 16), a1);
    }
    for (; i < k; i += 16) {
        const int n = int(k - i < 16 ? k - i : 16);
        const __mmask16 m = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
        a0 = _mm512_fmadd_ps(load16(type, w + i * es, n), _mm512_maskz_loadu_ps(m, x + i), a0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

// R rows times C tokens, each (row, token) through exactly dot_f32's operations in its order
// (two accumulators over alternate 16-element steps, the tail into the first, one reduction):
// a row is widened once per step for all C tokens and a token's x once for all R rows.
template <int R, int C>
void dot_f32_tile(uint32_t type, const uint8_t* w, size_t row_bytes, const float* x, int64_t ldx,
                  int64_t k, float* out, int64_t ldo) {
    const size_t es = native_block_bytes(type);
    __m512 a0[R][C], a1[R][C];
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < C; ++t) a0[r][t] = a1[r][t] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        __m512 x0[C], x1[C];
        for (int t = 0; t < C; ++t) {
            x0[t] = _mm512_loadu_ps(x + t * ldx + i);
            x1[t] = _mm512_loadu_ps(x + t * ldx + i + 16);
        }
        for (int r = 0; r < R; ++r) {
            const uint8_t* wr = w + r * row_bytes;
            const __m512 w0 = load16(type, wr + i * es, 16), w1 = load16(type, wr + (i + 16) * es, 16);
            for (int t = 0; t < C; ++t) {
                a0[r][t] = _mm512_fmadd_ps(w0, x0[t], a0[r][t]);
                a1[r][t] = _mm512_fmadd_ps(w1, x1[t], a1[r][t]);
            }
        }
    }
    for (; i < k; i += 16) {
        const int n = int(k - i < 16 ? k - i : 16);
        const __mmask16 m = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
        for (int r = 0; r < R; ++r) {
            const __m512 wv = load16(type, w + r * row_bytes + i * es, n);
            for (int t = 0; t < C; ++t)
                a0[r][t] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x + t * ldx + i), a0[r][t]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < C; ++t)
            out[t * ldo + r] = _mm512_reduce_add_ps(_mm512_add_ps(a0[r][t], a1[r][t]));
}

template <int R>
void dot_f32_rows_r(uint32_t type, const uint8_t* w, size_t row_bytes, const float* x,
                    int64_t ldx, int64_t k, int n, float* out, int64_t ldo) {
    int t = 0;
    for (; t + 4 <= n; t += 4) dot_f32_tile<R, 4>(type, w, row_bytes, x + t * ldx, ldx, k, out + t * ldo, ldo);
    for (; t < n; ++t) dot_f32_tile<R, 1>(type, w, row_bytes, x + t * ldx, ldx, k, out + t * ldo, ldo);
}

void dot_f32_rows(uint32_t type, const uint8_t* w, size_t row_bytes, int rows, const float* x,
                  int64_t ldx, int64_t k, int n, float* out, int64_t ldo) {
    IF_CHECK(type == ggml_id::f32 || type == ggml_id::f16 || type == ggml_id::bf16,
             "dot_f32_rows: ggml type " << type << " is not a float weight type");
    int r = 0;
    for (; r + 2 <= rows; r += 2)
        dot_f32_rows_r<2>(type, w + r * row_bytes, row_bytes, x, ldx, k, n, out + r, ldo);
    for (; r < rows; ++r)
        dot_f32_rows_r<1>(type, w + r * row_bytes, row_bytes, x, ldx, k, n, out + r, ldo);
}

// 32 codes to fp32: out = fma(d, code, m), 16 at a time.
inline void store_affine(__m256i u, float d, float m, float* out) {
    const __m512 vd = _mm512_set1_ps(d), vm = _mm512_set1_ps(m);
    const __m512 v0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(u)));
    const __m512 v1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(u, 1)));
    _mm512_storeu_ps(out, _mm512_fmadd_ps(vd, v0, vm));
    _mm512_storeu_ps(out + 16, _mm512_fmadd_ps(vd, v1, vm));
}

template <Codes (*Unpack)(const uint8_t*), size_t kBytes>
void dequant_affine(const uint8_t* w, float* out, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b) {
        const Codes c = Unpack(w + b * kBytes);
        store_affine(c.u, c.d, c.m, out + 32 * b);
    }
}

void dequant_q8_0(const uint8_t* w, float* out, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = w + b * 34;
        const __m512 d = _mm512_set1_ps(half_to_float(blk));
        for (int p = 0; p < 2; ++p) {
            const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2 + 16 * p));
            const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
            _mm512_storeu_ps(out + 32 * b + 16 * p, _mm512_mul_ps(d, v));
        }
    }
}

void dequant_q6_k(const uint8_t* w, float* out, int64_t n_super) {
    for (int64_t s = 0; s < n_super; ++s) {
        const uint8_t* blk = w + s * 210;
        const float d = q6_k_d(blk);
        for (int j = 0; j < 8; ++j) {
            const Q6Codes c = unpack_q6_k_sub(blk, j);
            // (d * sc) * (code - 32), as ggml orders it (docs/formats.md §3.2).
            const float s0 = d * float(c.sc0), s1 = d * float(c.sc1);
            float* o = out + 256 * s + 32 * j;
            const __m512 v0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(c.u)));
            const __m512 v1 =
                _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(c.u, 1)));
            _mm512_storeu_ps(o,
                             _mm512_fmadd_ps(_mm512_set1_ps(s0), v0, _mm512_set1_ps(-32.0f * s0)));
            _mm512_storeu_ps(o + 16,
                             _mm512_fmadd_ps(_mm512_set1_ps(s1), v1, _mm512_set1_ps(-32.0f * s1)));
        }
    }
}

void dequant_float_row(uint32_t type, const uint8_t* w, float* out, int64_t k) {
    const size_t es = native_block_bytes(type);
    for (int64_t i = 0; i < k; i += 16) {
        const int n = int(k - i < 16 ? k - i : 16);
        const __mmask16 m = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
        _mm512_mask_storeu_ps(out + i, m, load16(type, w + i * es, n));
    }
}

void dequantize(uint32_t type, const uint8_t* w, float* out, int64_t k) {
    switch (type) {
        case ggml_id::f32:
            std::memcpy(out, w, size_t(k) * 4);
            return;
        case ggml_id::f16:
        case ggml_id::bf16:
            return dequant_float_row(type, w, out, k);
        case ggml_id::q4_0:
            return dequant_affine<unpack_q4_0, 18>(w, out, k / 32);
        case ggml_id::q4_1:
            return dequant_affine<unpack_q4_1, 20>(w, out, k / 32);
        case ggml_id::q5_0:
            return dequant_affine<unpack_q5_0, 22>(w, out, k / 32);
        case ggml_id::q5_1:
            return dequant_affine<unpack_q5_1, 24>(w, out, k / 32);
        case ggml_id::q8_0:
            return dequant_q8_0(w, out, k / 32);
        case ggml_id::q6_k:
            return dequant_q6_k(w, out, k / 256);
        default:
            IF_FAIL("dequantize: ggml type " << type << " is not a supported weight type");
    }
}

void quantize_q8(const float* x, Q8Block* y, int64_t k) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t b = 0; b < k / 32; ++b) {
        const __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
        const __m512 amax = _mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1));
        const float d = _mm512_reduce_max_ps(amax) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m512 vid = _mm512_set1_ps(id);
        // Round to nearest (even on ties), as the AVX2 variant does.
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(y[b].qs), _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(y[b].qs + 16), _mm512_cvtsepi32_epi8(q1));
        const int lo = _mm512_reduce_add_epi32(q0), hi = _mm512_reduce_add_epi32(q1);
        y[b].d = d;
        y[b].sum_lo = int16_t(lo);
        y[b].sum_hi = int16_t(hi);
        y[b].ds = d * float(lo + hi);
    }
}

}  // namespace

const QuantKernels& quant_kernels_avx512() {
    const bool vnni = cpu_has_avx512_vnni();
    static const QuantKernels k{CpuIsa::avx512,
                                quantize_q8,
                                vnni ? dot_q8<true> : dot_q8<false>,
                                dot_f32,
                                dequantize,
                                vnni ? dot_q8_group<true> : dot_q8_group<false>,
                                dot_f32_group,
                                dot_f32_rows};
    return k;
}

}  // namespace infoflow::cpu
