// The tile emulator (kernels/cpu/amx_emulator.cpp) against TDPBF16PS computed by hand on tiny
// inputs: the VNNI pair layout, the order and rounding of the accumulation (two FMA steps per
// pair, each rounded to nearest even), bf16 denormal inputs read as zero, denormal results
// flushed to zero, and the shape checks. Then gemm_amx on the emulator against its plain-loop
// reference (gemm_amx_ref) bit for bit, and a token's bits independent of the other tokens of
// its call. Emulator only: the CPU's tiles are compared with the fp32 references in
// test_amx_ops.cpp.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/amx_emulator.h"
#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemm_amx.h"
#include "runtime/core/half.h"
#include "tests/amx/amx_test_util.h"

using namespace infoflow;
using namespace infoflow::cpu;

namespace {

uint16_t bf(float f) { return fp32_to_bf16(f); }

// One accumulator row: c (fp32, N = 1 column) += the pairs of a (1 row) with b (pairs x 1).
// Tiles sized to the inputs: c 1 x 4 bytes, a 1 x 4 * pairs bytes, b pairs x 4 bytes.
float dp_one(float c0, const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
    const AmxTileOps& t = amx_tiles_emulated();
    const int pairs = int(a.size() / 2);
    AmxTileShape s;
    s.rows[0] = 1;
    s.colsb[0] = 4;
    s.rows[4] = 1;
    s.colsb[4] = 4 * pairs;
    s.rows[5] = pairs;
    s.colsb[5] = 4;
    t.config(s);
    float c = c0;
    t.load(0, &c, 4);
    t.load(4, a.data(), 4 * pairs);
    t.load(5, b.data(), 4);
    t.dpbf16ps(0, 4, 5);
    t.store(0, &c, 4);
    t.release();
    return c;
}

uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

}  // namespace

TEST_CASE("amx emulator: tdpbf16ps by hand: sums, pair order and rounding", "[amx][emulator]") {
    // 0.5 + 1*3 + 2*4 = 11.5 (exact).
    CHECK(dp_one(0.5f, {bf(1.0f), bf(2.0f)}, {bf(3.0f), bf(4.0f)}) == 11.5f);
    // Two pairs: 1 + (1*1 + 2*2) + (3*3 + 4*4) = 31.
    CHECK(dp_one(1.0f, {bf(1), bf(2), bf(3), bf(4)}, {bf(1), bf(2), bf(3), bf(4)}) == 31.0f);
    // Each product 2^-24 is half an ulp of 1.0: each of the two accumulation steps rounds to
    // even and drops it, so 1.0 stays 1.0 (summing the pair first, 2^-23, would give 1 + 2^-23).
    const float e = std::ldexp(1.0f, -12);
    CHECK(bits(dp_one(1.0f, {bf(e), bf(e)}, {bf(e), bf(e)})) == bits(1.0f));
    // From 1 + 2^-23 (odd last bit) a half ulp rounds up to even: 1 + 2^-22, then the second
    // half ulp ties to even again (stays): 1 + 2^-22.
    const float odd = 1.0f + std::ldexp(1.0f, -23);
    CHECK(bits(dp_one(odd, {bf(e), bf(0.0f)}, {bf(e), bf(0.0f)})) ==
          bits(1.0f + std::ldexp(1.0f, -22)));
    CHECK(bits(dp_one(odd, {bf(e), bf(e)}, {bf(e), bf(e)})) == bits(1.0f + std::ldexp(1.0f, -22)));
    // Three quarters of an ulp rounds up: 1 + 3 * 2^-25 -> 1 + 2^-23.
    CHECK(bits(dp_one(1.0f, {bf(3 * std::ldexp(1.0f, -13)), bf(0.0f)},
                      {bf(std::ldexp(1.0f, -12)), bf(0.0f)})) == bits(odd));
}

TEST_CASE("amx emulator: bf16 denormal inputs read as zero, denormal sums flushed",
          "[amx][emulator]") {
    const uint16_t denormal = 0x0001;  // the smallest positive bf16 denormal, ~9.2e-41
    const float big = std::ldexp(1.0f, 100);
    // Without DAZ the product would be ~1.2e-10: it adds nothing.
    CHECK(dp_one(1.0f, {denormal, bf(0.0f)}, {bf(big), bf(0.0f)}) == 1.0f);
    CHECK(dp_one(0.0f, {bf(big), bf(0.0f)}, {uint16_t(0x8003), bf(0.0f)}) == 0.0f);
    // 2^-70 * 2^-70 = 2^-140 is an fp32 denormal: flushed to zero.
    const float tiny = std::ldexp(1.0f, -70);
    const float got = dp_one(0.0f, {bf(tiny), bf(0.0f)}, {bf(tiny), bf(0.0f)});
    CHECK(got == 0.0f);
    // A sum that leaves the normal range keeps its sign: -2^-140 flushes to -0.
    // (the pair's second product is -0 * 0 = -0, so the second step keeps the sign: -0 + -0.)
    const float neg = dp_one(0.0f, {bf(-tiny), uint16_t(0x8000)}, {bf(tiny), bf(0.0f)});
    CHECK(neg == 0.0f);
    CHECK(std::signbit(neg));
    // Normal results near the bottom of the range stay: 2^-63 * 2^-63 = 2^-126 (FLT_MIN).
    const float lo = std::ldexp(1.0f, -63);
    CHECK(dp_one(0.0f, {bf(lo), bf(0.0f)}, {bf(lo), bf(0.0f)}) == std::ldexp(1.0f, -126));
}

TEST_CASE("amx emulator: full tiles follow the VNNI pair layout", "[amx][emulator]") {
    // C[16 x 16] = A[16 x 32] B[32 x 16] with small integers (every sum exact), B given as
    // pairs [16][16][2]: element [p][n][e] = B[2p + e][n].
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> d(-4, 4);
    std::vector<float> A(16 * 32), B(32 * 16), C0(16 * 16);
    for (float& v : A) v = float(d(rng));
    for (float& v : B) v = float(d(rng));
    for (float& v : C0) v = float(d(rng));
    std::vector<uint16_t> a(16 * 32), b(16 * 16 * 2);
    for (int i = 0; i < 16 * 32; ++i) a[i] = bf(A[i]);
    for (int k = 0; k < 32; ++k)
        for (int n = 0; n < 16; ++n) b[(k / 2) * 32 + n * 2 + k % 2] = bf(B[k * 16 + n]);
    std::vector<float> c = C0;
    const AmxTileOps& t = amx_tiles_emulated();
    t.config(amx_full_tiles());
    t.load(1, c.data(), 64);
    t.load(6, a.data(), 64);
    t.load(7, b.data(), 64);
    t.dpbf16ps(1, 6, 7);
    t.store(1, c.data(), 64);
    t.release();
    for (int m = 0; m < 16; ++m) {
        for (int n = 0; n < 16; ++n) {
            float want = C0[m * 16 + n];
            for (int k = 0; k < 32; ++k) want += A[m * 32 + k] * B[k * 16 + n];
            INFO("m=" << m << " n=" << n);
            CHECK(c[m * 16 + n] == want);
        }
    }
}

TEST_CASE("amx emulator: the AVX-512 tdpbf16ps gives the plain loop's bits", "[amx][emulator]") {
    REQUIRE(cpu_has_avx512());  // tests_amx runs where the amx path can (AVX-512)
    // Bit patterns drawn to reach every case of the definition: normal values of mixed scales
    // (cancellations and rounding ties), bf16 denormals, zeros of both signs, infinities, and
    // products near the bottom of the normal range (denormal sums, flushed with their sign);
    // every tile shape the kernels can configure (rows, columns and pairs 1..16).
    std::mt19937 rng(29);
    auto pick = [&rng]() -> uint16_t {
        switch (rng() % 8) {
            case 0:
                return uint16_t(rng() & 0x807F);  // denormal or zero
            case 1:  // 2^-77 .. 2^-58: products in and near the denormal range
                return uint16_t((rng() & 0x8000) | ((50 + rng() % 20) << 7) | (rng() & 0x7F));
            case 2:
                return uint16_t(rng() % 64 == 0 ? 0x7F80 | (rng() & 0x8000) : 0x3F80);
            default:
                return fp32_to_bf16(std::ldexp(float(int(rng() % 255) - 127), -int(rng() % 8)));
        }
    };
    alignas(64) uint8_t a[kAmxTileRows][kAmxTileBytes], b[kAmxTileRows][kAmxTileBytes];
    alignas(64) uint8_t c1[kAmxTileRows][kAmxTileBytes], c2[kAmxTileRows][kAmxTileBytes];
    for (int trial = 0; trial < 400; ++trial) {
        const int m = 1 + int(rng() % 16), n = 1 + int(rng() % 16), pairs = 1 + int(rng() % 16);
        for (auto* t : {&a, &b}) {
            for (auto& row : *t) {
                for (int i = 0; i < kAmxTileBytes / 2; ++i) {
                    const uint16_t h = pick();
                    std::memcpy(row + 2 * i, &h, 2);
                }
            }
        }
        for (int r = 0; r < kAmxTileRows; ++r) {
            for (int i = 0; i < kAmxTileBytes / 4; ++i) {
                const float v = trial % 3 == 0
                                    ? 0.0f
                                    : std::ldexp(float(int(rng() % 64) - 32), -int(rng() % 130));
                std::memcpy(c1[r] + 4 * i, &v, 4);
            }
        }
        std::memcpy(c2, c1, sizeof(c1));
        amx_emulated_dpbf16ps_plain(c1, a, b, m, n, pairs);
        amx_emulated_dpbf16ps_avx512(c2, a, b, m, n, pairs);
        INFO("trial " << trial << ": m=" << m << " n=" << n << " pairs=" << pairs);
        // NaN results (inf - inf) compare by class: their payloads may differ.
        for (int r = 0; r < m; ++r) {
            for (int i = 0; i < n; ++i) {
                float x, y;
                std::memcpy(&x, c1[r] + 4 * i, 4);
                std::memcpy(&y, c2[r] + 4 * i, 4);
                if (std::isnan(x) || std::isnan(y)) {
                    CHECK((std::isnan(x) && std::isnan(y)));
                } else {
                    CHECK(bits(x) == bits(y));
                }
            }
        }
    }
}

TEST_CASE("amx emulator: misuse is reported as the CPU would fault", "[amx][emulator]") {
    const AmxTileOps& t = amx_tiles_emulated();
    float buf[256] = {};
    CHECK_THROWS_WITH(t.load(0, buf, 64), Catch::Contains("before config"));
    t.config(amx_full_tiles());
    CHECK_THROWS_WITH(t.dpbf16ps(4, 5, 6), Catch::Contains("accumulator 0..3"));
    CHECK_THROWS_WITH(t.dpbf16ps(0, 5, 5), Catch::Contains("distinct"));
    t.release();
    AmxTileShape s = amx_full_tiles();
    s.rows[5] = 8;  // b with 8 pair rows against a's 16 pairs
    t.config(s);
    CHECK_THROWS_WITH(t.dpbf16ps(0, 4, 5), Catch::Contains("shapes"));
    t.release();
    s.colsb[2] = 65;
    CHECK_THROWS(t.config(s));
}

TEST_CASE("amx: the CPU's tiles are refused where AMX is not usable", "[amx][emulator]") {
    if (cpu_has_amx()) {
        CHECK(std::string(amx_tiles_hw().name) == "amx");
    } else {
        CHECK_THROWS_WITH(amx_tiles_hw(), Catch::Contains(cpu_amx_missing()));
    }
}

TEST_CASE("amx emulator: gemm_amx equals its plain-loop reference bit for bit", "[amx][emulator]") {
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    struct Shape {
        int n, k, m;
    };
    for (const Shape s : {Shape{16, 32, 16}, Shape{17, 40, 50}, Shape{70, 96, 33}, Shape{33, 7, 5},
                          Shape{64, 576, 64}}) {
        std::vector<float> x(size_t(s.n) * s.k), w(size_t(s.m) * s.k), bias(s.m);
        for (float& v : x) v = nd(rng);
        for (float& v : w) v = 0.05f * nd(rng);
        for (float& v : bias) v = nd(rng);
        x[0] = 1e-41f;  // a denormal: zero once rounded to bf16 and read by the tiles
        const RowsOfFloats rows(w.data(), s.k);
        for (const bool acc : {false, true}) {
            std::vector<float> got(size_t(s.n) * s.m, 0.5f), want = got;
            gemm_amx(x.data(), s.n, s.k, s.m, rows, acc ? nullptr : bias.data(), got.data(), acc, 2,
                     amx_tiles_emulated());
            gemm_amx_ref(x.data(), s.n, s.k, s.m, w.data(), acc ? nullptr : bias.data(),
                         want.data(), acc);
            INFO("n=" << s.n << " k=" << s.k << " m=" << s.m << " accumulate=" << acc);
            CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
        }
    }
}

TEST_CASE("amx emulator: a token's gemm_amx bits do not depend on the other tokens of its call",
          "[amx][emulator]") {
    std::mt19937 rng(13);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int n = 77, k = 160, m = 48;
    std::vector<float> x(size_t(n) * k), w(size_t(m) * k);
    for (float& v : x) v = nd(rng);
    for (float& v : w) v = 0.05f * nd(rng);
    const RowsOfFloats rows(w.data(), k);
    std::vector<float> whole(size_t(n) * m);
    gemm_amx(x.data(), n, k, m, rows, nullptr, whole.data(), false, 2, amx_tiles_emulated());
    // Calls of 16..61 tokens starting anywhere: other neighbours in every tile.
    for (const int split : {16, 21, 45, 61}) {
        std::vector<float> part(size_t(n) * m);
        gemm_amx(x.data(), split, k, m, rows, nullptr, part.data(), false, 1, amx_tiles_emulated());
        gemm_amx(x.data() + size_t(split) * k, n - split, k, m, rows, nullptr,
                 part.data() + size_t(split) * m, false, 2, amx_tiles_emulated());
        INFO("split at " << split);
        CHECK(std::memcmp(part.data(), whole.data(), whole.size() * sizeof(float)) == 0);
    }
}
