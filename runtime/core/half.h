// IEEE binary16 and bfloat16 <-> float conversions (exact; subnormals, inf and NaN included).
#pragma once

#include <cstdint>
#include <cstring>

namespace infoflow {

inline float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t mant = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0x1Fu) {
        bits = sign | 0x7F800000u | (mant << 13);
    } else if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {
            // Subnormal: normalize.
            int e = -1;
            do {
                ++e;
                mant <<= 1;
            } while ((mant & 0x400u) == 0);
            mant &= 0x3FFu;
            bits = sign | uint32_t(127 - 15 - e) << 23 | (mant << 13);
        }
    } else {
        bits = sign | (exp + (127 - 15)) << 23 | (mant << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// Round to nearest even.
inline uint16_t fp32_to_fp16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t abs = x & 0x7FFFFFFFu;
    if (abs > 0x7F800000u) return uint16_t(sign | 0x7E00u);   // NaN
    if (abs >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // overflow -> inf
    if (abs < 0x38800000u) {                                  // subnormal or zero in fp16
        if (abs < 0x33000000u) return uint16_t(sign);
        const uint32_t e = abs >> 23;
        const uint32_t m = (abs & 0x7FFFFFu) | 0x800000u;
        // value = m * 2^(e-150); in fp16 subnormal units of 2^-24 that is m >> (126 - e).
        const uint32_t shift = 126 - e;
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) ++r;
        return uint16_t(sign | r);
    }
    uint32_t r = ((abs - 0x38000000u) >> 13);
    const uint32_t rem = abs & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
    return uint16_t(sign | r);
}

inline float bf16_to_fp32(uint16_t h) {
    const uint32_t bits = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// Round to nearest even; NaN stays NaN (ggml's rule).
inline uint16_t fp32_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 64u);
    return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace infoflow
