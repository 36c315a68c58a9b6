// The CPU's AMX tiles behind AmxTileOps (kernels/cpu/amx_tiles.h). This file alone is compiled
// with -mamx-tile -mamx-bf16 -mamx-int8 (CMakeLists.txt); its functions run only where
// active_cpu_isa() is amx on a CPU with usable AMX. Tile numbers are immediates in the
// instructions, so each operation dispatches on the tile number (a switch). Untested on real AMX
// hardware so far (docs/design.md §10): the emulator (amx_emulator.cpp) runs the same calls on the
// development machines.
#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/cpu_features.h"
#include "runtime/core/error.h"

// GCC names the AMX feature macros __AMX_TILE__ and __AMX_BF16__, clang __AMXTILE__ and __AMXBF16__.
#if (defined(__AMX_TILE__) || defined(__AMXTILE__)) && (defined(__AMX_BF16__) || defined(__AMXBF16__))
#include <immintrin.h>

#include <cstring>

namespace infoflow::cpu {
namespace {

void hw_config(const AmxTileShape& shape) {
    const AmxTileConfig cfg = amx_tile_config(shape);
    _tile_loadconfig(&cfg);
}

void hw_release() { _tile_release(); }

// GCC's tile intrinsics are macros that paste their tile arguments into the instruction text,
// so each tile number must be a literal: one switch case per tile (per triple for dpbf16ps).
#define IF_TILE_CASES(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7)

void hw_load(int tile, const void* src, int64_t stride) {
    switch (tile) {
#define IF_LOAD(t)                   \
    case t:                          \
        _tile_loadd(t, src, stride); \
        return;
        IF_TILE_CASES(IF_LOAD)
#undef IF_LOAD
    }
    IF_FAIL("amx: tile " << tile);
}

void hw_store(int tile, void* dst, int64_t stride) {
    switch (tile) {
#define IF_STORE(t)                   \
    case t:                           \
        _tile_stored(t, dst, stride); \
        return;
        IF_TILE_CASES(IF_STORE)
#undef IF_STORE
    }
    IF_FAIL("amx: tile " << tile);
}

void hw_zero(int tile) {
    switch (tile) {
#define IF_ZERO(t)     \
    case t:            \
        _tile_zero(t); \
        return;
        IF_TILE_CASES(IF_ZERO)
#undef IF_ZERO
    }
    IF_FAIL("amx: tile " << tile);
}

// Accumulators 0..3, sources two distinct tiles of 4..7 (amx_tiles.h): the 48 triples the
// assembler accepts under that rule.
void hw_dpbf16ps(int c, int a, int b) {
    switch (amx_dp_index(c, a, b)) {
#define IF_DP(c_, a_, b_)           \
    case c_ * 64 + a_ * 8 + b_:     \
        _tile_dpbf16ps(c_, a_, b_); \
        return;
#define IF_DP_C(c_)                                                                     \
    IF_DP(c_, 4, 5)                                                                     \
    IF_DP(c_, 4, 6) IF_DP(c_, 4, 7) IF_DP(c_, 5, 4) IF_DP(c_, 5, 6) IF_DP(c_, 5, 7)     \
        IF_DP(c_, 6, 4) IF_DP(c_, 6, 5) IF_DP(c_, 6, 7) IF_DP(c_, 7, 4) IF_DP(c_, 7, 5) \
            IF_DP(c_, 7, 6)
        IF_DP_C(0) IF_DP_C(1) IF_DP_C(2) IF_DP_C(3)
#undef IF_DP_C
#undef IF_DP
    }
}

#undef IF_TILE_CASES

}  // namespace

const AmxTileOps& amx_tiles_hw() {
    // The first tile instruction faults unless the CPU has AMX and Linux granted the tile state,
    // which cpu_has_amx() asks for (once per process): never hand out the ops without it.
    static const bool usable = cpu_has_amx();
    IF_CHECK(usable, "amx tiles: AMX is not usable here: " << cpu_amx_missing());
    static const AmxTileOps ops{"amx",    hw_config, hw_release, hw_load,
                                hw_store, hw_zero,   hw_dpbf16ps};
    return ops;
}

}  // namespace infoflow::cpu

#else  // built without the AMX flags (not an x86-64 build): the path does not exist

namespace infoflow::cpu {
const AmxTileOps& amx_tiles_hw() {
    IF_CHECK(false, "the amx CPU path is not built on this architecture");
    static const AmxTileOps ops{};
    return ops;
}
}  // namespace infoflow::cpu

#endif
