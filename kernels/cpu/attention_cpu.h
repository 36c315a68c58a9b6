// The CPU attention kernel (AttnParams, kernels/backend.h): one pass per key tile with an online
// softmax. For a block of query rows and a tile of keys it computes the scores in registers,
// applies the visibility rule there, takes the tile's row maximum, exponentiates and sums in
// the same registers, and adds P·V into the rows' fp32 output; tiles whose keys all lie after
// every query of the block are skipped before any arithmetic, whatever the order of the keys
// (so a cache of sorted runs, e.g. a shard followed by gathered selected tokens, keeps its
// causal cut-off). K/V may be fp32, f16 or bf16 (widened per tile); accumulation is fp32.
// A tile's K is transposed in registers. Calls with at most 16 query rows (decode) take a
// few-row path instead: scores as dot products over the cache rows, keys split into fixed
// 256-key segments (one task per kv head and segment, merged by maximum and normalizer), so the
// threads share one token and the result does not depend on the thread count.
// On cpu.isa = amx the many-row path runs Q·Kᵀ on bf16 tiles, P·V in fp32 (attention_tiles in
// attention_cpu_impl.h; docs/design.md §10 "AMX").
// Written once over a vector type (attention_cpu_impl.h) and compiled for AVX2
// (attention_cpu.cpp) and AVX-512 (attention_cpu_avx512.cpp); attention() picks the path of
// active_cpu_isa() (kernels/cpu/cpu_features.h). Internal to kernels/cpu and its tests.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/cpu_features.h"

namespace infoflow::cpu {

// The path of active_cpu_isa().
void attention(const AttnParams& p, int n_threads);
// One path explicitly (tests compare each with the reference). The AVX-512 and AMX ones throw
// infoflow::Error on a CPU without AVX-512; the AMX one runs amx_tiles() (the CPU's tiles, or the
// emulator under INFOFLOW_AMX_EMULATE=1).
void attention_isa(CpuIsa isa, const AttnParams& p, int n_threads);
// The AMX path on the given tiles (tests: the emulator or the CPU's, explicitly). Calls with at
// most 16 query rows (n_q * n_head / n_head_kv) take the AVX-512 few-row path.
void attention_amx(const AttnParams& p, int n_threads, const AmxTileOps& tiles);

// dst[i, 0:w] = fp32 of src[i * src_stride + 0:w], for n rows of KV storage type `t`.
void widen_kv_rows(KvDtype t, const void* src /*[n, src_stride]*/, size_t src_stride, int n, int w,
                   float* dst /*[n, w]*/);

namespace detail {
void attention_avx2(const AttnParams& p, int n_threads);
void attention_avx512(const AttnParams& p, int n_threads);  // attention_cpu_avx512.cpp
void attention_amx(const AttnParams& p, int n_threads, const AmxTileOps& tiles);  // same file
void widen_row_avx2(KvDtype t, const void* src, int n, float* dst);
void widen_row_avx512(KvDtype t, const void* src, int n, float* dst);
}  // namespace detail

}  // namespace infoflow::cpu
