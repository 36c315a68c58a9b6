// Stored-type kernels, AVX2 variant (the build baseline: AVX2, FMA, F16C), the type table and the
// choice of variant (quant_dot.h).
#include "kernels/cpu/quant_dot.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/quant_blocks.h"
#include "runtime/core/error.h"

namespace infoflow::cpu {

bool native_type_supported(uint32_t type) { return native_block_bytes(type) != 0; }

bool native_type_quantized(uint32_t type) {
    return native_type_supported(type) && type != ggml_id::f32 && type != ggml_id::f16 &&
           type != ggml_id::bf16;
}

int native_block_elems(uint32_t type) {
    switch (type) {
        case ggml_id::f32:
        case ggml_id::f16:
        case ggml_id::bf16:
            return 1;
        case ggml_id::q4_0:
        case ggml_id::q4_1:
        case ggml_id::q5_0:
        case ggml_id::q5_1:
        case ggml_id::q8_0:
            return 32;
        case ggml_id::q6_k:
            return 256;
        default:
            return 0;
    }
}

size_t native_block_bytes(uint32_t type) {
    switch (type) {
        case ggml_id::f32:
            return 4;
        case ggml_id::f16:
        case ggml_id::bf16:
            return 2;
        case ggml_id::q4_0:
            return 18;
        case ggml_id::q4_1:
            return 20;
        case ggml_id::q5_0:
            return 22;
        case ggml_id::q5_1:
            return 24;
        case ggml_id::q8_0:
            return 34;
        case ggml_id::q6_k:
            return 210;
        default:
            return 0;
    }
}

size_t native_row_bytes(uint32_t type, int64_t k) {
    const int be = native_block_elems(type);
    IF_CHECK(be > 0, "ggml type " << type << " is not a supported weight type");
    IF_CHECK(k >= 0 && k % be == 0,
             "row of " << k << " elements is not a whole number of " << be << "-element blocks");
    return size_t(k / be) * native_block_bytes(type);
}

bool row_group_supported(uint32_t type) {
    return type == ggml_id::q4_0 || type == ggml_id::q4_1 || type == ggml_id::q8_0;
}

namespace {

// Where row r (0..3) of a row group keeps block b (quant_dot.h): its header at
// b * 4 * bytes + r * header, its 16-byte code piece c at b * 4 * bytes + 4 * header + 64 * c +
// 16 * r.
struct GroupShape {
    size_t bytes;   // block bytes
    size_t header;  // header bytes of one row's block
    int pieces;     // 16-byte code pieces of one row's block
};

GroupShape group_shape(uint32_t type) {
    IF_CHECK(row_group_supported(type), "row groups: ggml type " << type << " is not grouped");
    const size_t bytes = native_block_bytes(type);
    const size_t header = type == ggml_id::q4_1 ? 4 : 2;
    return {bytes, header, int((bytes - header) / 16)};
}

// Copies one row's blocks between the plain layout (`plain`) and its place in a row group
// (`group`, the group's first byte); to_group picks the direction.
void move_group_row(const GroupShape& gs, int64_t nb, int r, uint8_t* group, uint8_t* plain,
                    bool to_group) {
    for (int64_t b = 0; b < nb; ++b) {
        uint8_t* gb = group + size_t(b) * kRowGroup * gs.bytes;
        uint8_t* pb = plain + size_t(b) * gs.bytes;
        uint8_t* gh = gb + size_t(r) * gs.header;
        to_group ? std::memcpy(gh, pb, gs.header) : std::memcpy(pb, gh, gs.header);
        for (int c = 0; c < gs.pieces; ++c) {
            uint8_t* gp = gb + kRowGroup * gs.header + 64 * size_t(c) + 16 * size_t(r);
            uint8_t* pp = pb + gs.header + 16 * size_t(c);
            to_group ? std::memcpy(gp, pp, 16) : std::memcpy(pp, gp, 16);
        }
    }
}

}  // namespace

void interleave_row_groups(uint32_t type, uint8_t* data, int64_t rows, int64_t k) {
    const GroupShape gs = group_shape(type);
    IF_CHECK(rows % kRowGroup == 0,
             "row groups: " << rows << " rows are not a multiple of " << kRowGroup);
    const size_t rb = native_row_bytes(type, k);
    std::vector<uint8_t> plain(kRowGroup * rb);
    for (int64_t g = 0; g < rows / kRowGroup; ++g) {
        uint8_t* group = data + size_t(g) * kRowGroup * rb;
        std::memcpy(plain.data(), group, plain.size());
        for (int r = 0; r < kRowGroup; ++r)
            move_group_row(gs, k / 32, r, group, plain.data() + size_t(r) * rb, true);
    }
}

void gather_grouped_row(uint32_t type, const uint8_t* data, int64_t row, int64_t k,
                        uint8_t* out) {
    const GroupShape gs = group_shape(type);
    const size_t rb = native_row_bytes(type, k);
    // move_group_row only reads the group when copying out of it.
    uint8_t* group = const_cast<uint8_t*>(data) + size_t(row / kRowGroup) * kRowGroup * rb;
    move_group_row(gs, k / 32, int(row % kRowGroup), group, out, false);
}

void gather_grouped_blocks(uint32_t type, const uint8_t* data, int64_t row, int64_t k, int64_t b0,
                           int64_t nb, uint8_t* out) {
    const GroupShape gs = group_shape(type);
    const size_t rb = native_row_bytes(type, k);
    IF_CHECK(b0 >= 0 && nb >= 0 && b0 + nb <= k / 32,
             "row groups: blocks [" << b0 << ", " << b0 + nb << ") of a " << k << "-column row");
    uint8_t* group = const_cast<uint8_t*>(data) + size_t(row / kRowGroup) * kRowGroup * rb +
                     size_t(b0) * kRowGroup * gs.bytes;
    move_group_row(gs, nb, int(row % kRowGroup), group, out, false);
}

const QuantKernels& quant_kernels(CpuIsa isa) {
    if (isa_uses_avx512(isa)) {
        IF_CHECK(cpu_has_avx512(), "the AVX-512 kernels need a CPU with AVX-512 (F/BW/VL/DQ)");
        return quant_kernels_avx512();
    }
    return quant_kernels_avx2();
}

const QuantKernels& quant_kernels() { return quant_kernels(active_cpu_isa()); }

namespace {

using namespace blocks;

// Sum of u[i] * x[i] (u unsigned codes <= 63, x signed int8) as 8 int32 lanes (lane i covers
// elements 4i..4i+3); maddubs cannot saturate at these magnitudes.
inline __m256i dot_codes(__m256i u, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

inline __m256i load32(const int8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

template <Codes (*Unpack)(const uint8_t*), size_t kBytes>
float dot_affine(const uint8_t* w, const Q8Block* x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    float acc_m = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
        const Codes c = Unpack(w + b * kBytes);
        const __m256i s = dot_codes(c.u, load32(x[b].qs));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(c.d * x[b].d), acc);
        acc_m += c.m * x[b].ds;
    }
    return hsum(acc) + acc_m;
}

// Q8_0 codes are signed: |w| times x with w's sign moved onto x keeps maddubs in range.
float dot_q8_0(const uint8_t* w, const Q8Block* x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = w + b * 34;
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
        const __m256i xs = _mm256_sign_epi8(load32(x[b].qs), q);
        const __m256i s = dot_codes(_mm256_sign_epi8(q, q), xs);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(half_to_float(blk) * x[b].d),
                              acc);
    }
    return hsum(acc);
}

float dot_q6_k(const uint8_t* w, const Q8Block* x, int64_t n_super) {
    __m256 acc = _mm256_setzero_ps();
    float acc_m = 0.0f;
    for (int64_t s = 0; s < n_super; ++s) {
        const uint8_t* blk = w + s * 210;
        const float d = q6_k_d(blk);
        for (int j = 0; j < 8; ++j) {
            const Q8Block& xb = x[s * 8 + j];
            const Q6Codes c = unpack_q6_k_sub(blk, j);
            __m256i p = dot_codes(c.u, load32(xb.qs));
            p = _mm256_mullo_epi32(
                p, _mm256_setr_epi32(c.sc0, c.sc0, c.sc0, c.sc0, c.sc1, c.sc1, c.sc1, c.sc1));
            const float dd = d * xb.d;
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dd), acc);
            acc_m -= 32.0f * dd * float(c.sc0 * xb.sum_lo + c.sc1 * xb.sum_hi);
        }
    }
    return hsum(acc) + acc_m;
}

float dot_q8_avx2(uint32_t type, const uint8_t* w, const Q8Block* x, int64_t k) {
    const int64_t nb = k / 32;
    switch (type) {
        case ggml_id::q4_0:
            return dot_affine<unpack_q4_0, 18>(w, x, nb);
        case ggml_id::q4_1:
            return dot_affine<unpack_q4_1, 20>(w, x, nb);
        case ggml_id::q5_0:
            return dot_affine<unpack_q5_0, 22>(w, x, nb);
        case ggml_id::q5_1:
            return dot_affine<unpack_q5_1, 24>(w, x, nb);
        case ggml_id::q8_0:
            return dot_q8_0(w, x, nb);
        case ggml_id::q6_k:
            return dot_q6_k(w, x, k / 256);
        default:
            IF_FAIL("dot_q8: ggml type " << type << " is not a quantized weight type");
    }
}

inline __m256 load8_f16(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8_bf16(const uint8_t* p) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
inline float scalar_f16(const uint8_t* p) { return half_to_float(p); }
inline float scalar_bf16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    const uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline float scalar_f32(const uint8_t* p) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
}
inline __m256 load8_f32(const uint8_t* p) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
}

template <__m256 (*Load8)(const uint8_t*), float (*Load1)(const uint8_t*), size_t kBytes>
float dot_float_row(const uint8_t* w, const float* x, int64_t k) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        a0 = _mm256_fmadd_ps(Load8(w + i * kBytes), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(Load8(w + (i + 8) * kBytes), _mm256_loadu_ps(x + i + 8), a1);
    }
    for (; i + 8 <= k; i += 8)
        a0 = _mm256_fmadd_ps(Load8(w + i * kBytes), _mm256_loadu_ps(x + i), a0);
    float s = hsum(_mm256_add_ps(a0, a1));
    for (; i < k; ++i) s += Load1(w + i * kBytes) * x[i];
    return s;
}

float dot_f32_avx2(uint32_t type, const uint8_t* w, const float* x, int64_t k) {
    switch (type) {
        case ggml_id::f32:
            return dot_float_row<load8_f32, scalar_f32, 4>(w, x, k);
        case ggml_id::f16:
            return dot_float_row<load8_f16, scalar_f16, 2>(w, x, k);
        case ggml_id::bf16:
            return dot_float_row<load8_bf16, scalar_bf16, 2>(w, x, k);
        default:
            IF_FAIL("dot_f32: ggml type " << type << " is not a float weight type");
    }
}

// 32 codes to fp32: out = fma(d, code, m), 8 at a time.
inline void store_affine(__m256i u, float d, float m, float* out) {
    const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    const __m128i lo = _mm256_castsi256_si128(u), hi = _mm256_extracti128_si256(u, 1);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int p = 0; p < 4; ++p) {
        const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[p]));
        _mm256_storeu_ps(out + 8 * p, _mm256_fmadd_ps(vd, v, vm));
    }
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
        const __m256 d = _mm256_set1_ps(half_to_float(blk));
        for (int p = 0; p < 4; ++p) {
            const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * p));
            const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
            _mm256_storeu_ps(out + 32 * b + 8 * p, _mm256_mul_ps(d, v));
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
            const __m128i lo = _mm256_castsi256_si128(c.u), hi = _mm256_extracti128_si256(c.u, 1);
            const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
            for (int p = 0; p < 4; ++p) {
                const float sc = p < 2 ? s0 : s1;
                const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[p]));
                _mm256_storeu_ps(
                    o + 8 * p, _mm256_fmadd_ps(_mm256_set1_ps(sc), v, _mm256_set1_ps(-32.0f * sc)));
            }
        }
    }
}

template <__m256 (*Load8)(const uint8_t*), float (*Load1)(const uint8_t*), size_t kBytes>
void dequant_float_row(const uint8_t* w, float* out, int64_t k) {
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) _mm256_storeu_ps(out + i, Load8(w + i * kBytes));
    for (; i < k; ++i) out[i] = Load1(w + i * kBytes);
}

void dequantize_avx2(uint32_t type, const uint8_t* w, float* out, int64_t k) {
    switch (type) {
        case ggml_id::f32:
            std::memcpy(out, w, size_t(k) * 4);
            return;
        case ggml_id::f16:
            return dequant_float_row<load8_f16, scalar_f16, 2>(w, out, k);
        case ggml_id::bf16:
            return dequant_float_row<load8_bf16, scalar_bf16, 2>(w, out, k);
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

void quantize_q8_avx2(const float* x, Q8Block* y, int64_t k) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < k / 32; ++b) {
        const float* xb = x + 32 * b;
        __m256 v[4];
        __m256 amax = _mm256_setzero_ps();
        for (int p = 0; p < 4; ++p) {
            v[p] = _mm256_loadu_ps(xb + 8 * p);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[p]));
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float d = _mm_cvtss_f32(m) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        // Round to nearest (even on ties), then pack 4 x 8 int32 into 32 int8 in element order.
        __m256i q[4];
        for (int p = 0; p < 4; ++p) q[p] = _mm256_cvtps_epi32(_mm256_mul_ps(v[p], vid));
        const __m256i q01 = _mm256_packs_epi32(q[0], q[1]);
        const __m256i q23 = _mm256_packs_epi32(q[2], q[3]);
        __m256i q8 = _mm256_packs_epi16(q01, q23);
        q8 = _mm256_permutevar8x32_epi32(q8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs), q8);
        int lo = 0, hi = 0;
        for (int i = 0; i < 16; ++i) lo += y[b].qs[i];
        for (int i = 16; i < 32; ++i) hi += y[b].qs[i];
        y[b].d = d;
        y[b].sum_lo = int16_t(lo);
        y[b].sum_hi = int16_t(hi);
        y[b].ds = d * float(lo + hi);
    }
}

// Row groups on the AVX2 path: each row taken back to the plain layout, then the row kernels,
// token by token (so a token's sums do not depend on the others in the call).
void dot_q8_group_avx2(uint32_t type, const uint8_t* g, const Q8Block* x, int64_t k, int n,
                       float* out, int64_t ldo) {
    thread_local std::vector<uint8_t> row;
    row.resize(native_row_bytes(type, k));
    const int64_t nb = k / 32;
    for (int r = 0; r < kRowGroup; ++r) {
        gather_grouped_row(type, g, r, k, row.data());
        for (int t = 0; t < n; ++t) out[t * ldo + r] = dot_q8_avx2(type, row.data(), x + t * nb, k);
    }
}

void dot_f32_group_avx2(uint32_t type, const uint8_t* g, const float* x, int64_t ldx, int64_t k,
                        int n, float* out, int64_t ldo) {
    thread_local std::vector<uint8_t> row;
    thread_local std::vector<float> row32;
    row.resize(native_row_bytes(type, k));
    row32.resize(size_t(k));
    for (int r = 0; r < kRowGroup; ++r) {
        gather_grouped_row(type, g, r, k, row.data());
        dequantize_avx2(type, row.data(), row32.data(), k);
        for (int t = 0; t < n; ++t) {
            out[t * ldo + r] = dot_float_row<load8_f32, scalar_f32, 4>(
                reinterpret_cast<const uint8_t*>(row32.data()), x + t * ldx, k);
        }
    }
}

// Float rows on the AVX2 path: the row kernel, row by row and token by token.
void dot_f32_rows_avx2(uint32_t type, const uint8_t* w, size_t row_bytes, int rows, const float* x,
                       int64_t ldx, int64_t k, int n, float* out, int64_t ldo) {
    for (int r = 0; r < rows; ++r)
        for (int t = 0; t < n; ++t)
            out[t * ldo + r] = dot_f32_avx2(type, w + r * row_bytes, x + t * ldx, k);
}

}  // namespace

const QuantKernels& quant_kernels_avx2() {
    static const QuantKernels k{CpuIsa::avx2,     quantize_q8_avx2,  dot_q8_avx2,
                                dot_f32_avx2,     dequantize_avx2,   dot_q8_group_avx2,
                                dot_f32_group_avx2, dot_f32_rows_avx2};
    return k;
}

}  // namespace infoflow::cpu
