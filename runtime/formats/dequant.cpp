// ggml block formats: geometry table, row dequantizers and reference quantizers, written from
// docs/formats.md §3 (ggml `src/ggml-common.h`, `src/ggml-quants.c`). Multiplication order follows ggml
// so results are bit-exact with it.
#include "runtime/formats/dequant.h"

#include <cmath>
#include <cstring>

#include "runtime/core/error.h"
#include "runtime/core/half.h"
#include "runtime/formats/gguf.h"

namespace infoflow {

namespace {

struct BlockInfo {
    uint32_t elems;
    uint32_t bytes;
};

// Indexed by ggml type id; {0, 0} marks unknown, retired and unsupported-layout ids.
constexpr BlockInfo kBlocks[] = {
    {1, 4},                                                              // 0 F32
    {1, 2},                                                              // 1 F16
    {32, 18},                                                            // 2 Q4_0
    {32, 20},                                                            // 3 Q4_1
    {0, 0},                                                              // 4 retired
    {0, 0},                                                              // 5 retired
    {32, 22},                                                            // 6 Q5_0
    {32, 24},                                                            // 7 Q5_1
    {32, 34},                                                            // 8 Q8_0
    {32, 36},                                                            // 9 Q8_1
    {256, 84},                                                           // 10 Q2_K
    {256, 110},                                                          // 11 Q3_K
    {256, 144},                                                          // 12 Q4_K
    {256, 176},                                                          // 13 Q5_K
    {256, 210},                                                          // 14 Q6_K
    {256, 292},                                                          // 15 Q8_K
    {0, 0},     {0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0},  // 16..23 IQ*
    {1, 1},                                                              // 24 I8
    {1, 2},                                                              // 25 I16
    {1, 4},                                                              // 26 I32
    {1, 8},                                                              // 27 I64
    {1, 8},                                                              // 28 F64
    {0, 0},                                                              // 29 IQ1_M
    {1, 2},                                                              // 30 BF16
};
constexpr uint32_t kNumBlocks = sizeof(kBlocks) / sizeof(kBlocks[0]);

inline float load_half(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return fp16_to_fp32(h);
}

inline void store_half(uint8_t* p, float f) {
    const uint16_t h = fp32_to_fp16(f);
    std::memcpy(p, &h, 2);
}

// (int)v clamped to [0, hi], as ggml's `MIN(hi, (int8_t)v)` for the in-range values it sees;
// NaN and infinities are clamped instead of being undefined behaviour.
inline int trunc_clamp(float v, int hi) {
    if (!(v > 0.0f)) return 0;
    if (v >= float(hi)) return hi;
    return int(v);
}

void check_blocks(int64_t n, int64_t block, uint32_t type) {
    IF_CHECK(n >= 0 && n % block == 0, "row of " << n << " elements is not a multiple of the "
                                                 << ggml_type_name(type) << " block size "
                                                 << block);
}

}  // namespace

bool ggml_type_known(uint32_t type) { return type < kNumBlocks && kBlocks[type].elems != 0; }

int64_t ggml_block_elems(uint32_t type) {
    IF_CHECK(ggml_type_known(type), "unknown ggml type " << ggml_type_name(type));
    return kBlocks[type].elems;
}

size_t ggml_block_bytes(uint32_t type) {
    IF_CHECK(ggml_type_known(type), "unknown ggml type " << ggml_type_name(type));
    return kBlocks[type].bytes;
}

size_t ggml_row_bytes(uint32_t type, int64_t n) {
    const int64_t be = ggml_block_elems(type);
    check_blocks(n, be, type);
    return size_t(n / be) * kBlocks[type].bytes;
}

bool ggml_type_dequantizable(uint32_t type) {
    switch (GgmlType(type)) {
        case GgmlType::F32:
        case GgmlType::F16:
        case GgmlType::BF16:
        case GgmlType::Q4_0:
        case GgmlType::Q4_1:
        case GgmlType::Q5_0:
        case GgmlType::Q5_1:
        case GgmlType::Q8_0:
        case GgmlType::Q6_K:
            return true;
        default:
            return false;
    }
}

bool ggml_type_quantizable(uint32_t type) {
    return ggml_type_dequantizable(type) && type != uint32_t(GgmlType::Q6_K);
}

// ---- dequantization ------------------------------------------------------------------------

void dequantize_row_f32(const uint8_t* src, float* dst, int64_t n) {
    if (n == 0) return;  // src/dst may be null for an empty tensor (memcpy needs valid pointers)
    std::memcpy(dst, src, size_t(n) * 4);
}

void dequantize_row_f16(const uint8_t* src, float* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dst[i] = load_half(src + 2 * i);
}

void dequantize_row_bf16(const uint8_t* src, float* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16_to_fp32(h);
    }
}

void dequantize_row_q4_0(const uint8_t* src, float* dst, int64_t n) {
    const int64_t nb = n / 32;
    for (int64_t b = 0; b < nb; ++b, src += 18, dst += 32) {
        const float d = load_half(src);
        const uint8_t* qs = src + 2;
        for (int j = 0; j < 16; ++j) {
            dst[j] = float(int(qs[j] & 0x0F) - 8) * d;
            dst[j + 16] = float(int(qs[j] >> 4) - 8) * d;
        }
    }
}

void dequantize_row_q4_1(const uint8_t* src, float* dst, int64_t n) {
    const int64_t nb = n / 32;
    for (int64_t b = 0; b < nb; ++b, src += 20, dst += 32) {
        const float d = load_half(src);
        const float m = load_half(src + 2);
        const uint8_t* qs = src + 4;
        for (int j = 0; j < 16; ++j) {
            dst[j] = float(qs[j] & 0x0F) * d + m;
            dst[j + 16] = float(qs[j] >> 4) * d + m;
        }
    }
}

void dequantize_row_q5_0(const uint8_t* src, float* dst, int64_t n) {
    const int64_t nb = n / 32;
    for (int64_t b = 0; b < nb; ++b, src += 22, dst += 32) {
        const float d = load_half(src);
        uint32_t h;
        std::memcpy(&h, src + 2, 4);
        const uint8_t* qs = src + 6;
        for (int j = 0; j < 16; ++j) {
            const int x0 = int((qs[j] & 0x0F) | (((h >> j) & 1u) << 4)) - 16;
            const int x1 = int((qs[j] >> 4) | (((h >> (j + 16)) & 1u) << 4)) - 16;
            dst[j] = float(x0) * d;
            dst[j + 16] = float(x1) * d;
        }
    }
}

void dequantize_row_q5_1(const uint8_t* src, float* dst, int64_t n) {
    const int64_t nb = n / 32;
    for (int64_t b = 0; b < nb; ++b, src += 24, dst += 32) {
        const float d = load_half(src);
        const float m = load_half(src + 2);
        uint32_t h;
        std::memcpy(&h, src + 4, 4);
        const uint8_t* qs = src + 8;
        for (int j = 0; j < 16; ++j) {
            const int x0 = int((qs[j] & 0x0F) | (((h >> j) & 1u) << 4));
            const int x1 = int((qs[j] >> 4) | (((h >> (j + 16)) & 1u) << 4));
            dst[j] = float(x0) * d + m;
            dst[j + 16] = float(x1) * d + m;
        }
    }
}

void dequantize_row_q8_0(const uint8_t* src, float* dst, int64_t n) {
    const int64_t nb = n / 32;
    for (int64_t b = 0; b < nb; ++b, src += 34, dst += 32) {
        const float d = load_half(src);
        int8_t qs[32];
        std::memcpy(qs, src + 2, 32);
        for (int j = 0; j < 32; ++j) dst[j] = float(qs[j]) * d;
    }
}

void dequantize_row_q6_k(const uint8_t* src, float* dst, int64_t n) {
    const int64_t nb = n / 256;
    for (int64_t b = 0; b < nb; ++b, src += 210) {
        const float d = load_half(src + 208);
        const uint8_t* ql = src;
        const uint8_t* qh = src + 128;
        int8_t scales[16];
        std::memcpy(scales, src + 192, 16);
        const int8_t* sc = scales;
        for (int half = 0; half < 2; ++half) {
            for (int l = 0; l < 32; ++l) {
                const int s = l / 16;
                const int q1 = int((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = int((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                dst[l] = d * float(sc[s]) * float(q1);
                dst[l + 32] = d * float(sc[s + 2]) * float(q2);
                dst[l + 64] = d * float(sc[s + 4]) * float(q3);
                dst[l + 96] = d * float(sc[s + 6]) * float(q4);
            }
            dst += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

void dequantize_row(uint32_t type, const uint8_t* src, float* dst, int64_t n) {
    IF_CHECK(ggml_type_dequantizable(type),
             "ggml type " << ggml_type_name(type) << " is not supported (supported: F32, F16, "
                          << "BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q6_K)");
    check_blocks(n, ggml_block_elems(type), type);
    switch (GgmlType(type)) {
        case GgmlType::F32:
            dequantize_row_f32(src, dst, n);
            break;
        case GgmlType::F16:
            dequantize_row_f16(src, dst, n);
            break;
        case GgmlType::BF16:
            dequantize_row_bf16(src, dst, n);
            break;
        case GgmlType::Q4_0:
            dequantize_row_q4_0(src, dst, n);
            break;
        case GgmlType::Q4_1:
            dequantize_row_q4_1(src, dst, n);
            break;
        case GgmlType::Q5_0:
            dequantize_row_q5_0(src, dst, n);
            break;
        case GgmlType::Q5_1:
            dequantize_row_q5_1(src, dst, n);
            break;
        case GgmlType::Q8_0:
            dequantize_row_q8_0(src, dst, n);
            break;
        case GgmlType::Q6_K:
            dequantize_row_q6_k(src, dst, n);
            break;
        default:
            IF_FAIL("unreachable ggml type " << ggml_type_name(type));
    }
}

// ---- reference quantizers ------------------------------------------------------------------

void quantize_row_f16_ref(const float* src, uint8_t* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) store_half(dst + 2 * i, src[i]);
}

void quantize_row_bf16_ref(const float* src, uint8_t* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_bf16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
    }
}

namespace {

// The element of largest magnitude, sign kept (first one on ties, as ggml).
float signed_absmax(const float* x) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j) {
        if (amax < std::fabs(x[j])) {
            amax = std::fabs(x[j]);
            max = x[j];
        }
    }
    return max;
}

void min_max(const float* x, float* mn, float* mx) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; ++j) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *mn = lo;
    *mx = hi;
}

}  // namespace

void quantize_row_q4_0_ref(const float* src, uint8_t* dst, int64_t n) {
    const int64_t nb = n / 32;
    for (int64_t b = 0; b < nb; ++b, src += 32, dst += 18) {
        const float d = signed_absmax(src) / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_half(dst, d);
        for (int j = 0; j < 16; ++j) {
            const int x0 = trunc_clamp(src[j] * id + 8.5f, 15);
            const int x1 = trunc_clamp(src[j + 16] * id + 8.5f, 15);
            dst[2 + j] = uint8_t(x0 | (x1 << 4));
        }
    }
}

void quantize_row_q4_1_ref(const float* src, uint8_t* dst, int64_t n) {
    const int64_t nb = n / 32;
    for (int64_t b = 0; b < nb; ++b, src += 32, dst += 20) {
        float mn, mx;
        min_max(src, &mn, &mx);
        const float d = (mx - mn) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_half(dst, d);
        store_half(dst + 2, mn);
        for (int j = 0; j < 16; ++j) {
            const int x0 = trunc_clamp((src[j] - mn) * id + 0.5f, 15);
            const int x1 = trunc_clamp((src[j + 16] - mn) * id + 0.5f, 15);
            dst[4 + j] = uint8_t(x0 | (x1 << 4));
        }
    }
}

void quantize_row_q5_0_ref(const float* src, uint8_t* dst, int64_t n) {
    const int64_t nb = n / 32;
    for (int64_t b = 0; b < nb; ++b, src += 32, dst += 22) {
        const float d = signed_absmax(src) / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_half(dst, d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            const int x0 = trunc_clamp(src[j] * id + 16.5f, 31);
            const int x1 = trunc_clamp(src[j + 16] * id + 16.5f, 31);
            dst[6 + j] = uint8_t((x0 & 0x0F) | ((x1 & 0x0F) << 4));
            qh |= uint32_t((x0 >> 4) & 1) << j;
            qh |= uint32_t((x1 >> 4) & 1) << (j + 16);
        }
        std::memcpy(dst + 2, &qh, 4);
    }
}

void quantize_row_q5_1_ref(const float* src, uint8_t* dst, int64_t n) {
    const int64_t nb = n / 32;
    for (int64_t b = 0; b < nb; ++b, src += 32, dst += 24) {
        float mn, mx;
        min_max(src, &mn, &mx);
        const float d = (mx - mn) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_half(dst, d);
        store_half(dst + 2, mn);
        uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            const int x0 = trunc_clamp((src[j] - mn) * id + 0.5f, 31);
            const int x1 = trunc_clamp((src[j + 16] - mn) * id + 0.5f, 31);
            dst[8 + j] = uint8_t((x0 & 0x0F) | ((x1 & 0x0F) << 4));
            qh |= uint32_t((x0 >> 4) & 1) << j;
            qh |= uint32_t((x1 >> 4) & 1) << (j + 16);
        }
        std::memcpy(dst + 4, &qh, 4);
    }
}

void quantize_row_q8_0_ref(const float* src, uint8_t* dst, int64_t n) {
    const int64_t nb = n / 32;
    for (int64_t b = 0; b < nb; ++b, src += 32, dst += 34) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(src[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_half(dst, d);
        for (int j = 0; j < 32; ++j) {
            float v = std::round(src[j] * id);
            if (!(v >= -128.0f)) v = v != v ? 0.0f : -128.0f;
            if (v > 127.0f) v = 127.0f;
            dst[2 + j] = uint8_t(int8_t(v));
        }
    }
}

void quantize_row(uint32_t type, const float* src, uint8_t* dst, int64_t n) {
    IF_CHECK(ggml_type_quantizable(type), "cannot quantize to ggml type "
                                              << ggml_type_name(type) << " (supported: F32, F16, "
                                              << "BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)");
    check_blocks(n, ggml_block_elems(type), type);
    switch (GgmlType(type)) {
        case GgmlType::F32:
            if (n > 0) std::memcpy(dst, src, size_t(n) * 4);  // empty: pointers may be null
            break;
        case GgmlType::F16:
            quantize_row_f16_ref(src, dst, n);
            break;
        case GgmlType::BF16:
            quantize_row_bf16_ref(src, dst, n);
            break;
        case GgmlType::Q4_0:
            quantize_row_q4_0_ref(src, dst, n);
            break;
        case GgmlType::Q4_1:
            quantize_row_q4_1_ref(src, dst, n);
            break;
        case GgmlType::Q5_0:
            quantize_row_q5_0_ref(src, dst, n);
            break;
        case GgmlType::Q5_1:
            quantize_row_q5_1_ref(src, dst, n);
            break;
        case GgmlType::Q8_0:
            quantize_row_q8_0_ref(src, dst, n);
            break;
        default:
            IF_FAIL("unreachable ggml type " << ggml_type_name(type));
    }
}

}  // namespace infoflow
