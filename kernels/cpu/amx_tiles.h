// The AMX tile layer (docs/design.md §10, "AMX"): the few tile operations the AMX kernels use,
// behind plain C++ so that only kernels/cpu/amx_tiles_hw.cpp is compiled with the AMX flags, and
// a software emulator of exactly the same operations so the AMX algorithms run and are tested on
// a CPU without AMX. The emulator is chosen only by the test hook INFOFLOW_AMX_EMULATE=1
// (amx_emulated(), kernels/cpu/cpu_features.h), never by default.
//
// Tiles follow palette 1: 8 tiles (numbered 0..7), each up to 16 rows of up to 64 bytes. Tile
// state is per thread: a thread calls config() before its first tile operation and release()
// after its last (on real AMX, release returns the tile state to its init state).
//
// dpbf16ps(c, a, b) is TDPBF16PS with Intel's documented semantics: a holds M rows of K/2 bf16
// pairs (colsb = 2 K bytes), b holds K/2 rows of N bf16 pairs (the VNNI pair layout: element
// [p][n][e] of b is B[2p + e][n]), c holds M rows of N fp32. For each m, n and pair p in order,
//   c[m][n] = c[m][n] + fp32(a[m][2p]) * fp32(b[p][n][0])   (rounded to nearest even)
//   c[m][n] = c[m][n] + fp32(a[m][2p+1]) * fp32(b[p][n][1]) (rounded to nearest even)
// (each bf16 product is exact in fp32, so each step is one FMA rounding), bf16 denormal inputs
// read as zero, denormal results flushed to zero, MXCSR neither read nor written.
#pragma once

#include <cstdint>

namespace infoflow::cpu {

constexpr int kAmxTiles = 8;
constexpr int kAmxTileRows = 16;   // rows of a tile
constexpr int kAmxTileBytes = 64;  // bytes of a tile row: 16 fp32, 32 bf16

// The shape of each tile for config(): rows (0 = unused) and bytes per row.
struct AmxTileShape {
    int rows[kAmxTiles] = {};
    int colsb[kAmxTiles] = {};
};

// LDTILECFG's 64-byte memory operand (palette 1) for `shape`; throws infoflow::Error naming the
// tile when a shape is out of range (more than 16 rows or 64 bytes).
struct alignas(64) AmxTileConfig {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};
static_assert(sizeof(AmxTileConfig) == 64, "LDTILECFG takes 64 bytes");
AmxTileConfig amx_tile_config(const AmxTileShape& shape);

// Every tile 16 rows x 64 bytes: the shape the kernels use (partial blocks are zero-padded in
// memory, so each tile op's shape is fixed).
AmxTileShape amx_full_tiles();

struct AmxTileOps {
    const char* name;  // "amx" (the CPU's tiles) or "emulated"
    void (*config)(const AmxTileShape& shape);
    void (*release)();
    // Tile `tile` from/to rows `stride` bytes apart (rows x colsb of its shape).
    void (*load)(int tile, const void* src, int64_t stride);
    void (*store)(int tile, void* dst, int64_t stride);
    void (*zero)(int tile);
    // c: an accumulator tile 0..3; a, b: two distinct source tiles of 4..7 (the kernels'
    // convention, which keeps the CPU path to the 48 instruction forms it needs).
    void (*dpbf16ps)(int c, int a, int b);
};

// c * 64 + a * 8 + b for a triple that follows the dpbf16ps convention; throws infoflow::Error
// naming the tiles otherwise.
int amx_dp_index(int c, int a, int b);

// The CPU's tiles. Throws infoflow::Error when the build has no AMX path (not x86-64) or AMX is
// not usable here (!cpu_has_amx(), naming why).
const AmxTileOps& amx_tiles_hw();
// The software emulator (plain C++, any CPU). Checks shapes as the CPU would (#UD there) and
// throws infoflow::Error on a misuse.
const AmxTileOps& amx_tiles_emulated();
// The one the AMX path uses: the emulator when amx_emulated() (test hook), else the CPU's.
const AmxTileOps& amx_tiles();

// fp32 -> bf16, round to nearest even (NaN stays NaN): how the AMX kernels feed the tiles.
void fp32_to_bf16_rows(const float* src, int n, uint16_t* dst);
// The same for pairs, each packed into one 32-bit word as a VNNI row wants it:
// dst[i] = bf16(src[2i]) | bf16(src[2i + 1]) << 16.
void fp32_to_bf16_pairs(const float* src, int n_pairs, uint32_t* dst);

}  // namespace infoflow::cpu
