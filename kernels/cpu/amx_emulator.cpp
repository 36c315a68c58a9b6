// The software emulator of the AMX tile layer (kernels/cpu/amx_tiles.h), plus the choice between
// it and the CPU's tiles: how the AMX kernels run and are tested on machines without AMX
// (INFOFLOW_AMX_EMULATE=1, a test hook), not a fast path. Each thread has its own 8 tiles and
// configuration, as on the CPU; the shape checks are those under which the instructions raise
// #UD, reported as infoflow::Error. TDPBF16PS is the plain loop below on any CPU, and its AVX-512
// version (amx_emulator_avx512.cpp, the same bits, ~10x faster) where the CPU has AVX-512.
#include "kernels/cpu/amx_emulator.h"

#include <cmath>
#include <cstring>

#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/cpu_features.h"
#include "runtime/core/error.h"
#include "runtime/core/half.h"

namespace infoflow::cpu {
namespace {

struct EmuState {
    bool configured = false;
    AmxTileShape shape;
    alignas(64) uint8_t data[kAmxTiles][kAmxTileRows][kAmxTileBytes];
};

thread_local EmuState g_emu;

EmuState& configured_state(int tile) {
    IF_CHECK(g_emu.configured, "amx emulator: tile operation before config()");
    IF_CHECK(tile >= 0 && tile < kAmxTiles, "amx emulator: tile " << tile);
    IF_CHECK(g_emu.shape.rows[tile] > 0, "amx emulator: tile " << tile << " is not configured");
    return g_emu;
}

void emu_config(const AmxTileShape& shape) {
    for (int t = 0; t < kAmxTiles; ++t) {
        IF_CHECK(shape.rows[t] >= 0 && shape.rows[t] <= kAmxTileRows && shape.colsb[t] >= 0 &&
                     shape.colsb[t] <= kAmxTileBytes &&
                     (shape.rows[t] == 0) == (shape.colsb[t] == 0),
                 "amx emulator: tile " << t << " shape " << shape.rows[t] << " rows x "
                                       << shape.colsb[t] << " bytes");
    }
    g_emu.shape = shape;
    g_emu.configured = true;
    std::memset(g_emu.data, 0, sizeof(g_emu.data));  // LDTILECFG zeroes every tile
}

void emu_release() {
    g_emu.configured = false;
    g_emu.shape = AmxTileShape{};
}

// TILELOADD: rows x colsb bytes; the rest of the tile is zeroed.
void emu_load(int tile, const void* src, int64_t stride) {
    EmuState& s = configured_state(tile);
    std::memset(s.data[tile], 0, sizeof(s.data[tile]));
    const auto* p = static_cast<const uint8_t*>(src);
    for (int r = 0; r < s.shape.rows[tile]; ++r)
        std::memcpy(s.data[tile][r], p + r * stride, size_t(s.shape.colsb[tile]));
}

void emu_store(int tile, void* dst, int64_t stride) {
    EmuState& s = configured_state(tile);
    auto* p = static_cast<uint8_t*>(dst);
    for (int r = 0; r < s.shape.rows[tile]; ++r)
        std::memcpy(p + r * stride, s.data[tile][r], size_t(s.shape.colsb[tile]));
}

void emu_zero(int tile) {
    EmuState& s = configured_state(tile);
    std::memset(s.data[tile], 0, sizeof(s.data[tile]));
}

// bf16 -> fp32 with denormals (exponent 0) read as signed zero.
inline float bf16_daz(uint16_t h) {
    return (h & 0x7F80u) == 0 ? bf16_to_fp32(h & 0x8000u) : bf16_to_fp32(h);
}

// A denormal fp32 result flushed to a zero of its sign.
inline float ftz(float x) { return std::fabs(x) < 1.17549435e-38f ? std::copysign(0.0f, x) : x; }

void emu_dpbf16ps(int c, int a, int b) {
    EmuState& s = configured_state(c);
    configured_state(a);
    configured_state(b);
    amx_dp_index(c, a, b);
    const int M = s.shape.rows[c], N = s.shape.colsb[c] / 4, pairs = s.shape.colsb[a] / 4;
    IF_CHECK(s.shape.colsb[c] % 4 == 0 && s.shape.colsb[a] % 4 == 0 && s.shape.rows[a] == M &&
                 s.shape.rows[b] == pairs && s.shape.colsb[b] == s.shape.colsb[c],
             "amx emulator: tdpbf16ps shapes c "
                 << M << "x" << s.shape.colsb[c] << ", a " << s.shape.rows[a] << "x"
                 << s.shape.colsb[a] << ", b " << s.shape.rows[b] << "x" << s.shape.colsb[b]);
    if (cpu_has_avx512()) {
        amx_emulated_dpbf16ps_avx512(s.data[c], s.data[a], s.data[b], M, N, pairs);
    } else {
        amx_emulated_dpbf16ps_plain(s.data[c], s.data[a], s.data[b], M, N, pairs);
    }
    // Bytes of each row past colsb are zeroed (write_row_and_zero).
    for (int m = 0; m < M; ++m)
        std::memset(s.data[c][m] + sizeof(float) * N, 0, kAmxTileBytes - sizeof(float) * N);
}

}  // namespace

void amx_emulated_dpbf16ps_plain(uint8_t (*c)[kAmxTileBytes], const uint8_t (*a)[kAmxTileBytes],
                                 const uint8_t (*b)[kAmxTileBytes], int M, int N, int pairs) {
    // b widened once: the even and odd elements of each pair, denormals read as zero.
    float b0[kAmxTileRows][kAmxTileBytes / 4], b1[kAmxTileRows][kAmxTileBytes / 4];
    for (int p = 0; p < pairs; ++p) {
        uint16_t brow[kAmxTileBytes / 2];
        std::memcpy(brow, b[p], sizeof(uint16_t) * 2 * N);
        for (int n = 0; n < N; ++n) {
            b0[p][n] = bf16_daz(brow[2 * n]);
            b1[p][n] = bf16_daz(brow[2 * n + 1]);
        }
    }
    for (int m = 0; m < M; ++m) {
        float acc[kAmxTileBytes / 4];
        std::memcpy(acc, c[m], sizeof(float) * N);
        uint16_t arow[kAmxTileBytes / 2];
        std::memcpy(arow, a[m], sizeof(uint16_t) * 2 * pairs);
        for (int p = 0; p < pairs; ++p) {
            const float a0 = bf16_daz(arow[2 * p]), a1 = bf16_daz(arow[2 * p + 1]);
            // Each product of two bf16 values is exact in fp32, so each FMA rounds once: the
            // accumulation's round to nearest even. The lanes are independent (n).
            for (int n = 0; n < N; ++n) {
                const float t = ftz(std::fma(a0, b0[p][n], acc[n]));
                acc[n] = ftz(std::fma(a1, b1[p][n], t));
            }
        }
        std::memcpy(c[m], acc, sizeof(float) * N);
    }
}

int amx_dp_index(int c, int a, int b) {
    IF_CHECK(c >= 0 && c < 4 && a >= 4 && a < kAmxTiles && b >= 4 && b < kAmxTiles && a != b,
             "amx: tdpbf16ps on tiles " << c << ", " << a << ", " << b
                                        << " (accumulator 0..3, two distinct sources of 4..7)");
    return c * 64 + a * 8 + b;
}

AmxTileShape amx_full_tiles() {
    AmxTileShape s;
    for (int t = 0; t < kAmxTiles; ++t) {
        s.rows[t] = kAmxTileRows;
        s.colsb[t] = kAmxTileBytes;
    }
    return s;
}

AmxTileConfig amx_tile_config(const AmxTileShape& shape) {
    AmxTileConfig cfg;
    std::memset(&cfg, 0, sizeof(cfg));
    cfg.palette_id = 1;
    for (int t = 0; t < kAmxTiles; ++t) {
        IF_CHECK(
            shape.rows[t] >= 0 && shape.rows[t] <= kAmxTileRows && shape.colsb[t] >= 0 &&
                shape.colsb[t] <= kAmxTileBytes,
            "amx tile " << t << ": " << shape.rows[t] << " rows x " << shape.colsb[t] << " bytes");
        cfg.rows[t] = uint8_t(shape.rows[t]);
        cfg.colsb[t] = uint16_t(shape.colsb[t]);
    }
    return cfg;
}

const AmxTileOps& amx_tiles_emulated() {
    static const AmxTileOps ops{"emulated", emu_config, emu_release, emu_load,
                                emu_store,  emu_zero,   emu_dpbf16ps};
    return ops;
}

const AmxTileOps& amx_tiles() { return amx_emulated() ? amx_tiles_emulated() : amx_tiles_hw(); }

namespace {
// fp32_to_bf16 (runtime/core/half.h) without branches, so the loops below vectorize: the same
// bits (round to nearest even; a NaN keeps its sign and high payload and is made quiet).
inline uint32_t bf16_bits(uint32_t u) {
    return (u & 0x7FFFFFFFu) > 0x7F800000u ? (u >> 16) | 64u
                                           : (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}
}  // namespace

void fp32_to_bf16_rows(const float* src, int n, uint16_t* dst) {
#pragma omp simd
    for (int i = 0; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, src + i, 4);
        dst[i] = uint16_t(bf16_bits(u));
    }
}

void fp32_to_bf16_pairs(const float* src, int n_pairs, uint32_t* dst) {
#pragma omp simd
    for (int i = 0; i < n_pairs; ++i) {
        uint32_t a, b;
        std::memcpy(&a, src + 2 * i, 4);
        std::memcpy(&b, src + 2 * i + 1, 4);
        dst[i] = bf16_bits(a) | (bf16_bits(b) << 16);
    }
}

}  // namespace infoflow::cpu
