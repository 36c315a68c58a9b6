// Tile and split-KV arithmetic of the FlashInfer launcher (kernels/cuda/flashinfer_attention.h)
// against hand-computed cases for H100/H200 shared memory (228 KB per SM, 227 KB per block) and
// smaller parts.
#include <catch2/catch.hpp>

#include "kernels/cuda/flashinfer_attention.h"

using namespace infoflow;

namespace {
constexpr int kH100Sm = 233472, kH100Optin = 232448;
}

TEST_CASE("flashinfer_tile: H100/H200 shapes", "[flashinfer]") {
    // hd128 prefill: CTA 128; Q tile 32 KB, 8 KB of K+V per NUM_MMA_KV; two blocks of 114 KB
    // allow 10, registers allow 4.
    FlashTile t = flashinfer_tile(8192 * 4, 128, kH100Sm, kH100Optin);
    CHECK(t.cta_tile_q == 128);
    CHECK(t.num_mma_kv == 4);
    // hd128 decode (4 packed rows): CTA 16, 4 KV warps: 32 KB per NUM_MMA_KV, (114 K - 4 K) / 32 K
    // = 3 -> 2.
    t = flashinfer_tile(4, 128, kH100Sm, kH100Optin);
    CHECK(t.cta_tile_q == 16);
    CHECK(t.num_mma_kv == 2);
    // hd64 decode: 16 KB per NUM_MMA_KV -> 7 -> 4.
    t = flashinfer_tile(3, 64, kH100Sm, kH100Optin);
    CHECK(t.cta_tile_q == 16);
    CHECK(t.num_mma_kv == 4);
    // 64 packed rows still CTA 16; 65 goes to 128.
    CHECK(flashinfer_tile(64, 64, kH100Sm, kH100Optin).cta_tile_q == 16);
    CHECK(flashinfer_tile(65, 64, kH100Sm, kH100Optin).cta_tile_q == 128);
}

TEST_CASE("flashinfer_tile: smaller shared memory", "[flashinfer]") {
    // 99 KB per SM: two blocks of 49.5 KB: (50688 - 32768) / 8192 = 2.
    CHECK(flashinfer_tile(1000, 128, 101376, 101376).num_mma_kv == 2);
    // 48 KB: one block; (49152 - 32768) / 8192 = 2.
    CHECK(flashinfer_tile(1000, 128, 49152, 49152).num_mma_kv == 2);
    // Under one NUM_MMA_KV pair: unsupported (0).
    CHECK(flashinfer_tile(1000, 128, 40000, 40000).num_mma_kv == 0);
}

TEST_CASE("flashinfer_split_chunks: FlashInfer's chunk count", "[flashinfer]") {
    // 8 blocks (decode, 8 KV heads) on 264 resident: 33 chunks of ceil(32768/33) = 993 keys.
    CHECK(flashinfer_split_chunks(8, 32768, 264) == 33);
    // Chunks are at least 256 keys: 1000 keys -> 4 chunks.
    CHECK(flashinfer_split_chunks(8, 1000, 264) == 4);
    CHECK(flashinfer_split_chunks(8, 256, 264) == 1);
    // A grid that already fills the device: no split.
    CHECK(flashinfer_split_chunks(200, 32768, 264) == 1);
    CHECK(flashinfer_split_chunks(512, 32768, 264) == 1);
    CHECK(flashinfer_split_chunks(0, 32768, 264) == 1);
}

TEST_CASE("flashinfer: build flag and head dims", "[flashinfer]") {
    // Head dims other than 64/128 are never claimed, built or not.
    CHECK_FALSE(flashinfer_supports_head_dim(96));
    CHECK(flashinfer_supports_head_dim(128) == flashinfer_built());
    CHECK(flashinfer_supports_head_dim(64) == flashinfer_built());
}
