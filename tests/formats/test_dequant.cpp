// Dequantization and reference quantizers (docs/formats.md §3): hand-built blocks whose element k
// encodes a known value (nibble placement), a hand-built Q6_K block, and quantize/dequantize
// round trips checked byte-for-byte against an independent scalar implementation below.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/core/half.h"
#include "runtime/formats/dequant.h"
#include "runtime/formats/gguf.h"

using namespace infoflow;

namespace {

constexpr uint32_t T(GgmlType t) { return uint32_t(t); }

void put_half(std::vector<uint8_t>& b, size_t at, float f) {
    const uint16_t h = fp32_to_fp16(f);
    std::memcpy(&b[at], &h, 2);
}

std::vector<float> deq(GgmlType t, const std::vector<uint8_t>& b, int64_t n) {
    std::vector<float> y(size_t(n), -999.0f);
    dequantize_row(T(t), b.data(), y.data(), n);
    return y;
}

// ---- independent scalar implementation, written from docs/formats.md §3.3 element by element ------
// Element k of a 32-block lives in byte k % 16 of qs, low nibble when k < 16, high otherwise.

void set_nibble(uint8_t* qs, int k, int q) {
    if (k < 16) {
        qs[k] = uint8_t((qs[k] & 0xF0) | (q & 0xF));
    } else {
        qs[k - 16] = uint8_t((qs[k - 16] & 0x0F) | ((q & 0xF) << 4));
    }
}

int to_int(float v) { return int(v); }  // truncation, as ggml's (int8_t) cast for v >= 0

std::vector<uint8_t> test_quantize(GgmlType t, const std::vector<float>& x) {
    const size_t nb = x.size() / 32;
    std::vector<uint8_t> out;
    for (size_t b = 0; b < nb; ++b) {
        const float* v = &x[b * 32];
        float amax = 0, smax = 0, mn = v[0], mx = v[0];
        for (int k = 0; k < 32; ++k) {
            if (std::fabs(v[k]) > amax) {
                amax = std::fabs(v[k]);
                smax = v[k];
            }
            mn = std::min(mn, v[k]);
            mx = std::max(mx, v[k]);
        }
        std::vector<uint8_t> blk;
        if (t == GgmlType::Q4_0) {
            blk.assign(18, 0);
            const float d = smax / -8.0f, id = d ? 1.0f / d : 0.0f;
            put_half(blk, 0, d);
            for (int k = 0; k < 32; ++k)
                set_nibble(&blk[2], k, std::min(15, to_int(v[k] * id + 8.5f)));
        } else if (t == GgmlType::Q4_1) {
            blk.assign(20, 0);
            const float d = (mx - mn) / 15.0f, id = d ? 1.0f / d : 0.0f;
            put_half(blk, 0, d);
            put_half(blk, 2, mn);
            for (int k = 0; k < 32; ++k) {
                set_nibble(&blk[4], k, std::min(15, to_int((v[k] - mn) * id + 0.5f)));
            }
        } else if (t == GgmlType::Q5_0 || t == GgmlType::Q5_1) {
            const bool one = t == GgmlType::Q5_1;
            blk.assign(one ? 24 : 22, 0);
            const float d = one ? (mx - mn) / 31.0f : smax / -16.0f, id = d ? 1.0f / d : 0.0f;
            put_half(blk, 0, d);
            if (one) put_half(blk, 2, mn);
            uint32_t h = 0;
            for (int k = 0; k < 32; ++k) {
                const int q = one ? std::min(31, to_int((v[k] - mn) * id + 0.5f))
                                  : std::min(31, to_int(v[k] * id + 16.5f));
                set_nibble(&blk[one ? 8 : 6], k, q);
                h |= uint32_t(q >> 4) << k;
            }
            std::memcpy(&blk[one ? 4 : 2], &h, 4);
        } else {
            blk.assign(34, 0);
            const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
            put_half(blk, 0, d);
            for (int k = 0; k < 32; ++k) blk[2 + k] = uint8_t(int8_t(std::round(v[k] * id)));
        }
        out.insert(out.end(), blk.begin(), blk.end());
    }
    return out;
}

}  // namespace

TEST_CASE("ggml block geometry", "[dequant]") {
    CHECK(ggml_row_bytes(T(GgmlType::Q4_1), 576) == 360);
    CHECK(ggml_row_bytes(T(GgmlType::Q8_0), 576) == 612);
    CHECK(ggml_row_bytes(T(GgmlType::Q4_1), 1536) == 960);
    CHECK(ggml_row_bytes(T(GgmlType::Q6_K), 512) == 420);
    CHECK(ggml_row_bytes(T(GgmlType::Q5_0), 32) == 22);
    CHECK(ggml_row_bytes(T(GgmlType::Q5_1), 32) == 24);
    CHECK(ggml_row_bytes(T(GgmlType::Q4_0), 64) == 36);
    CHECK(ggml_row_bytes(T(GgmlType::F16), 3) == 6);
    CHECK(ggml_row_bytes(T(GgmlType::BF16), 3) == 6);
    CHECK(ggml_row_bytes(T(GgmlType::F32), 3) == 12);
    CHECK_THROWS_AS(ggml_row_bytes(T(GgmlType::Q4_0), 33), Error);
    CHECK_THROWS_AS(ggml_row_bytes(4, 32), Error);  // retired id
    CHECK_FALSE(ggml_type_known(17));
    CHECK_FALSE(ggml_type_known(1000));
    CHECK(std::string(ggml_type_name(17)) == "type 17");
}

TEST_CASE("unsupported types are rejected by name", "[dequant]") {
    std::vector<uint8_t> b(144, 0);
    std::vector<float> y(256);
    try {
        dequantize_row(T(GgmlType::Q4_K), b.data(), y.data(), 256);
        FAIL("no error");
    } catch (const Error& e) {
        CHECK_THAT(e.what(), Catch::Contains("Q4_K"));
    }
    try {
        dequantize_row(17, b.data(), y.data(), 256);
        FAIL("no error");
    } catch (const Error& e) {
        CHECK_THAT(e.what(), Catch::Contains("type 17"));
    }
    CHECK_THROWS_AS(quantize_row(T(GgmlType::Q6_K), y.data(), b.data(), 256), Error);
    CHECK_THROWS_AS(dequantize_row(T(GgmlType::Q8_0), b.data(), y.data(), 31), Error);
}

TEST_CASE("F32, F16 and BF16 rows", "[dequant]") {
    const uint16_t h[] = {0x3C00, 0xC000, 0x0001, 0x7C00, 0xFC00, 0x3555};
    std::vector<uint8_t> b(sizeof h);
    std::memcpy(b.data(), h, sizeof h);
    auto y = deq(GgmlType::F16, b, 6);
    CHECK(y[0] == 1.0f);
    CHECK(y[1] == -2.0f);
    CHECK(y[2] == std::ldexp(1.0f, -24));
    CHECK(std::isinf(y[3]));
    CHECK(y[4] < 0);
    CHECK(y[5] == Approx(0.33325195f).epsilon(0));
    const uint16_t nan16 = 0x7E00;
    std::memcpy(b.data(), &nan16, 2);
    CHECK(std::isnan(deq(GgmlType::F16, b, 1)[0]));

    const uint16_t bf[] = {0x3F80, 0xC030, 0x0000, 0x7FC0};
    std::memcpy(b.data(), bf, sizeof bf);
    y = deq(GgmlType::BF16, b, 4);
    CHECK(y[0] == 1.0f);
    CHECK(y[1] == -2.75f);
    CHECK(y[2] == 0.0f);
    CHECK(std::isnan(y[3]));

    const float f[] = {1.5f, -0.25f};
    std::vector<uint8_t> fb(8);
    std::memcpy(fb.data(), f, 8);
    y = deq(GgmlType::F32, fb, 2);
    CHECK(y[0] == 1.5f);
    CHECK(y[1] == -0.25f);
}

TEST_CASE("Q4_0 and Q4_1: nibble placement", "[dequant]") {
    // Byte j: low nibble = j (element j), high nibble = 15 - j (element j + 16).
    std::vector<uint8_t> b(18, 0);
    put_half(b, 0, 1.0f);
    for (int j = 0; j < 16; ++j) b[2 + j] = uint8_t(j | ((15 - j) << 4));
    auto y = deq(GgmlType::Q4_0, b, 32);
    for (int k = 0; k < 32; ++k) {
        const int q = k < 16 ? k : 15 - (k - 16);
        INFO("element " << k);
        CHECK(y[k] == float(q - 8));
    }
    std::vector<uint8_t> b1(20, 0);
    put_half(b1, 0, 0.5f);
    put_half(b1, 2, -1.0f);
    for (int j = 0; j < 16; ++j) b1[4 + j] = uint8_t(j | ((15 - j) << 4));
    y = deq(GgmlType::Q4_1, b1, 32);
    for (int k = 0; k < 32; ++k) {
        const int q = k < 16 ? k : 15 - (k - 16);
        INFO("element " << k);
        CHECK(y[k] == float(q) * 0.5f - 1.0f);
    }
}

TEST_CASE("Q5_0 and Q5_1: element k encodes k", "[dequant]") {
    // q_k = k: low nibble of byte j is j (element j) and the high nibble j (element j + 16);
    // bit 4 (qh bit k) is set exactly for k >= 16.
    std::vector<uint8_t> b(22, 0);
    put_half(b, 0, 1.0f);
    const uint32_t qh = 0xFFFF0000u;
    std::memcpy(&b[2], &qh, 4);
    for (int j = 0; j < 16; ++j) b[6 + j] = uint8_t(j | (j << 4));
    auto y = deq(GgmlType::Q5_0, b, 32);
    for (int k = 0; k < 32; ++k) {
        INFO("element " << k);
        CHECK(y[k] == float(k - 16));
    }
    std::vector<uint8_t> b1(24, 0);
    put_half(b1, 0, 0.25f);
    put_half(b1, 2, 2.0f);
    std::memcpy(&b1[4], &qh, 4);
    for (int j = 0; j < 16; ++j) b1[8 + j] = uint8_t(j | (j << 4));
    y = deq(GgmlType::Q5_1, b1, 32);
    for (int k = 0; k < 32; ++k) {
        INFO("element " << k);
        CHECK(y[k] == float(k) * 0.25f + 2.0f);
    }
    // A single high bit: only element 5 gains 16.
    const uint32_t one = 1u << 5;
    std::memcpy(&b1[4], &one, 4);
    y = deq(GgmlType::Q5_1, b1, 32);
    CHECK(y[5] == (5 + 16) * 0.25f + 2.0f);
    CHECK(y[21] == 5 * 0.25f + 2.0f);
}

TEST_CASE("Q8_0: element k", "[dequant]") {
    std::vector<uint8_t> b(2 * 34, 0);
    put_half(b, 0, 0.5f);
    put_half(b, 34, -2.0f);
    for (int k = 0; k < 32; ++k) {
        b[2 + k] = uint8_t(int8_t(k - 16));
        b[36 + k] = uint8_t(int8_t(k == 0 ? -128 : 127 - k));
    }
    auto y = deq(GgmlType::Q8_0, b, 64);
    for (int k = 0; k < 32; ++k) {
        INFO("element " << k);
        CHECK(y[k] == float(k - 16) * 0.5f);
        CHECK(y[32 + k] == float(k == 0 ? -128 : 127 - k) * -2.0f);
    }
}

TEST_CASE("Q6_K: hand-built block", "[dequant]") {
    // Pack q6[y] = (7 * y + 3) % 64 following docs/formats.md §3.2's table; scales 1..16 with two
    // negatives; d = 0.5.
    std::vector<int> q6(256);
    for (int i = 0; i < 256; ++i) q6[i] = (7 * i + 3) % 64;
    int8_t sc[16];
    for (int s = 0; s < 16; ++s) sc[s] = int8_t(s + 1);
    sc[3] = -5;
    sc[12] = -128;
    std::vector<uint8_t> b(210, 0);
    for (int n = 0; n < 2; ++n) {
        uint8_t* ql = &b[64 * n];
        uint8_t* qh = &b[128 + 32 * n];
        for (int l = 0; l < 32; ++l) {
            const int* q = &q6[128 * n];
            ql[l] = uint8_t((q[l] & 0xF) | ((q[l + 64] & 0xF) << 4));
            ql[l + 32] = uint8_t((q[l + 32] & 0xF) | ((q[l + 96] & 0xF) << 4));
            qh[l] = uint8_t((q[l] >> 4) | ((q[l + 32] >> 4) << 2) | ((q[l + 64] >> 4) << 4) |
                            ((q[l + 96] >> 4) << 6));
        }
    }
    std::memcpy(&b[192], sc, 16);
    put_half(b, 208, 0.5f);
    auto y = deq(GgmlType::Q6_K, b, 256);
    for (int i = 0; i < 256; ++i) {
        const int n = i / 128, r = i % 128, l = r % 32, part = r / 32;
        const int s = 8 * n + l / 16 + 2 * part;
        const float want = (0.5f * float(sc[s])) * float(q6[i] - 32);
        INFO("element " << i << " scale " << s);
        CHECK(y[i] == want);
    }
    // Spot values computed by hand: element 0: q = 3 -> (0.5 * 1) * (3 - 32) = -14.5.
    CHECK(y[0] == -14.5f);
    // Element 200: n 1, l 8, part 2 -> scale 8 + 0 + 4 = 12 (-128); q = 1403 % 64 = 59.
    CHECK(y[200] == (0.5f * -128.0f) * 27.0f);
}

TEST_CASE("quantizers match an independent implementation and round-trip", "[dequant]") {
    std::mt19937 rng(42);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t n = 32 * 64;
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = nd(rng);
    // Edge blocks: all zero, constant, one outlier, all negative.
    for (int k = 0; k < 32; ++k) {
        x[k] = 0.0f;
        x[32 + k] = 0.75f;
        x[64 + k] = k == 7 ? 100.0f : 0.01f * k;
        x[96 + k] = -1.0f - 0.1f * k;
    }
    struct Case {
        GgmlType t;
        double max_rel_rms;
    };
    for (Case c :
         {Case{GgmlType::Q4_0, 0.12}, Case{GgmlType::Q4_1, 0.10}, Case{GgmlType::Q5_0, 0.06},
          Case{GgmlType::Q5_1, 0.05}, Case{GgmlType::Q8_0, 0.01}}) {
        INFO("type " << ggml_type_name(T(c.t)));
        std::vector<uint8_t> q(ggml_row_bytes(T(c.t), n));
        quantize_row(T(c.t), x.data(), q.data(), n);
        CHECK(q == test_quantize(c.t, x));
        auto y = deq(c.t, q, n);
        for (int k = 0; k < 32; ++k) CHECK(y[k] == 0.0f);
        double err = 0, ref = 0;
        for (int64_t i = 128; i < n; ++i) {
            err += (x[i] - y[i]) * (x[i] - y[i]);
            ref += x[i] * x[i];
        }
        CHECK(std::sqrt(err / ref) < c.max_rel_rms);
    }
    // F16 / BF16: exact for representable values, round-to-nearest-even otherwise.
    const std::vector<float> f = {1.0f, -2.75f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 512, 65504.0f};
    std::vector<uint8_t> hb(f.size() * 2);
    quantize_row(T(GgmlType::BF16), f.data(), hb.data(), int64_t(f.size()));
    auto yb = deq(GgmlType::BF16, hb, int64_t(f.size()));
    CHECK(yb[0] == 1.0f);
    CHECK(yb[1] == -2.75f);
    CHECK(yb[2] == 1.0f);               // tie -> even (down)
    CHECK(yb[3] == 1.0f + 1.0f / 128);  // above half -> up
    quantize_row(T(GgmlType::F16), f.data(), hb.data(), int64_t(f.size()));
    auto yh = deq(GgmlType::F16, hb, int64_t(f.size()));
    CHECK(yh[2] == 1.0f + 1.0f / 256);
    CHECK(yh[4] == 65504.0f);
}

TEST_CASE("F16 quantizer round-trips every finite half, subnormals included", "[dequant][half]") {
    // Scales d of small-magnitude blocks are fp16 subnormals (|d| < 6.1e-5), so this matters
    // for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 as well as F16 tensors.
    std::vector<float> x;
    std::vector<uint16_t> want;
    for (uint32_t h = 0; h < 0x7C00; ++h) {
        for (uint32_t sign : {0u, 0x8000u}) {
            const uint16_t v = uint16_t(h | sign);
            x.push_back(fp16_to_fp32(v));
            want.push_back(v);
        }
    }
    std::vector<uint16_t> got(x.size());
    quantize_row_f16_ref(x.data(), reinterpret_cast<uint8_t*>(got.data()), int64_t(x.size()));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        if (got[i] != want[i] && bad++ == 0) first = i;
    }
    INFO(bad << " halves do not round-trip; first: " << x[first] << " -> 0x" << std::hex
             << got[first] << ", want 0x" << want[first]);
    CHECK(bad == 0);
    CHECK(fp32_to_fp16(1.9759033e-05f) == 0x014C);
    CHECK(fp32_to_fp16(std::ldexp(1.0f, -24)) == 0x0001);
}
