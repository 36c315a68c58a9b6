// Compact codes for K/V rows: what the `compact-*` exchanges send of the context tokens no one
// recomputes (docs/design.md §5.2). Those rows never change after the shard prefill, so each
// travels once, as codes; every rank decodes them into its cache. The single-rank oracle
// (parallel.emulate_ranks) sends every such row through the same encode and decode, so it sees
// the same bits as the ranks. Plain host code, deterministic: the same input gives the same codes
// on every rank.
//   int8: groups of 64 values (the last may be shorter): an fp16 step s = max|x| / 127, then one
//         signed byte per value, round(x / s) in [-127, 127]; 66 bytes per 64 values.
//   int4: groups of 32: fp16 minimum m and step s = (max x - m) / 15, then round((x - m) / s) in
//         [0, 15], two values per byte (the first in the low nibble); 20 bytes per 32 values.
//   int4h: int4 of each head's vector of D values turned by the Hadamard matrix H_D first (the
//         fast Walsh-Hadamard transform, D a power of two), turned back after decoding
//         (H_D H_D = D I: x = H_D y / D). The turn spreads a few large channels (the outliers of
//         K) over all D, so each group's step is set by the vector's size, not by its largest
//         channel; the same bytes as int4.
// A group of zeros decodes to zeros; with int4 a group of equal values that fit fp16 decodes
// to them exactly (s = 0).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/config/config.h"
#include "runtime/model/kv_cache.h"

namespace infoflow {

enum class KvCodec { int8, int4, int4h };

// Values per group.
int kv_codec_group(KvCodec c);
// Bytes of the codes of `n` values (n > 0: whole groups, then the last, shorter one).
size_t kv_codec_bytes(KvCodec c, size_t n);
// out[0, kv_codec_bytes(c, n)) = the codes of x[0, n), a row of heads of `head_dim` values
// (int4h turns each head; the others ignore it).
void kv_encode(KvCodec c, const float* x /*[n]*/, size_t n, int head_dim, uint8_t* out);
// x[0, n) = the values the codes stand for.
void kv_decode(KvCodec c, const uint8_t* in, size_t n, int head_dim, float* x /*[n]*/);
// int4h's turn needs a power-of-two head_dim: throws "not implemented yet" otherwise.
void check_kv_codec(KvCodec c, int head_dim);

// Cache rows through the codes. Bytes of one slot of one layer: its K row's codes, then its V
// row's.
size_t kv_codec_slot_bytes(KvCodec c, const KvCache& cache);
// out = the codes of slots `slots` of `layer`, slot after slot ([n, kv_codec_slot_bytes]).
void encode_cache_rows(KvCodec c, const KvCache& cache, int layer,
                       const std::vector<int32_t>& slots, uint8_t* out);
// Slots `slots` of `layer` = the rows the codes `in` stand for (as encode_cache_rows laid them
// out).
void decode_cache_rows(KvCodec c, const uint8_t* in, int layer, const std::vector<int32_t>& slots,
                       KvCache& cache);
// Every layer's rows of `slots` replaced by what their codes stand for: what a rank that
// receives them holds (the single-rank oracle of the compact exchanges).
void round_trip_cache_rows(KvCodec c, KvCache& cache, const std::vector<int32_t>& slots);

// The codes of a `compact-*` exchange (throws for the others).
KvCodec exchange_kv_codec(Config::Exchange ex);

}  // namespace infoflow
