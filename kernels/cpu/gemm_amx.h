// The AMX path's matrix product for the many-row passes (prefill, scoring, recompute, suffix;
// docs/design.md §10 "AMX"): out[t, j] = (out[t, j] if accumulating, else 0) + s[t, j] + bias[j],
// where s[t, j] is the dot product of x[t, :] and w[j, :], both rounded to bf16 (nearest even),
// accumulated in fp32 by TDPBF16PS over k in steps of 32 columns from 0, in order (k zero-padded
// to a multiple of 32). Every s[t, j] depends on row t of x and row j of w alone: the same bits
// whatever the number of tokens in the call, which tokens share a tile, the thread split or the
// tiles' backend (the CPU's or the emulator, amx_tiles.h). It is not the bits of gemm_exact (bf16
// inputs): relative error against the fp32 product ~2^-8 * sum|x||w| / |s| (tests/amx).
//
// The weights are taken 32 rows at a time (a panel), dequantized by GemmRows::fetch and packed
// into the VNNI pair layout [k/2][32][2] bf16 once per call; the panel then passes over every
// 32-token block of x (converted to bf16 once per call), 2 x 2 accumulator tiles at a time.
// Packing per call rather than a cached bf16 copy of every matrix: 0.3 ns per weight measured,
// ~7 % of the tile work of a 2048-token call at 1 TFLOP/s per core (docs/design.md §10 "AMX").
#pragma once

#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/gemm_exact.h"

namespace infoflow::cpu {

// out (+)= x W^T (+ bias) as defined above; W is [m, k], supplied by `w`.
void gemm_amx(const float* x /*[n, k]*/, int n, int k, int m, const GemmRows& w,
              const float* bias /*[m] or nullptr*/, float* out /*[n, m]*/, bool accumulate,
              int n_threads, const AmxTileOps& tiles);

// The same numbers in plain loops (bf16 rounding, then the FMA chains of TDPBF16PS with its
// denormal rules): the oracle of the tile kernel's tests. W given as fp32 rows.
void gemm_amx_ref(const float* x /*[n, k]*/, int n, int k, int m, const float* w /*[m, k]*/,
                  const float* bias /*[m] or nullptr*/, float* out /*[n, m]*/, bool accumulate);

}  // namespace infoflow::cpu
