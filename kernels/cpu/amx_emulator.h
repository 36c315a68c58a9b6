// The tile emulator's TDPBF16PS on raw tile rows (kernels/cpu/amx_tiles.h gives its semantics):
// the plain loop, which is the definition, and the AVX-512 version the emulator runs wherever the
// CPU has AVX-512 (kernels/cpu/amx_emulator_avx512.cpp). Both give the same bits; the emulator's
// tests check them against each other. c: m rows of n fp32 accumulators, updated in place (bytes
// past n untouched); a: m rows of `pairs` bf16 pair words; b: `pairs` rows of n pair words.
#pragma once

#include <cstdint>

#include "kernels/cpu/amx_tiles.h"

namespace infoflow::cpu {

void amx_emulated_dpbf16ps_plain(uint8_t (*c)[kAmxTileBytes], const uint8_t (*a)[kAmxTileBytes],
                                 const uint8_t (*b)[kAmxTileBytes], int m, int n, int pairs);
void amx_emulated_dpbf16ps_avx512(uint8_t (*c)[kAmxTileBytes], const uint8_t (*a)[kAmxTileBytes],
                                  const uint8_t (*b)[kAmxTileBytes], int m, int n, int pairs);

}  // namespace infoflow::cpu
