// The bit-packed custom mask (kernels/cuda/attn_mask.h) against hand-computed bytes, and against
// the visibility rule written out independently here on random unsorted positions and groups.
#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "kernels/cuda/attn_mask.h"
#include "runtime/core/error.h"

using namespace infoflow;

namespace {

struct Built {
    std::vector<uint8_t> bits;
    std::vector<int32_t> n_visible;
};

Built build(const std::vector<int32_t>& q_pos, const std::vector<int32_t>& k_pos,
            const std::vector<int32_t>& q_group = {}, const std::vector<int32_t>& k_group = {}) {
    MaskSpec s;
    s.q_pos = q_pos.data();
    s.k_pos = k_pos.data();
    s.q_group = q_group.empty() ? nullptr : q_group.data();
    s.k_group = k_group.empty() ? nullptr : k_group.data();
    s.n_q = int(q_pos.size());
    s.n_kv = int(k_pos.size());
    Built b;
    b.bits.assign(attn_mask_bytes(s.n_q, s.n_kv), 0xFF);
    b.n_visible.assign(q_pos.size(), -1);
    attn_mask_build(s, b.bits.data(), b.n_visible.data());
    return b;
}

}  // namespace

TEST_CASE("attn_mask: sizes are ceil(n_q*n_kv/8) bytes, rows not padded", "[attn_mask]") {
    CHECK(attn_mask_bytes(0, 5) == 0);
    CHECK(attn_mask_bytes(1, 1) == 1);
    CHECK(attn_mask_bytes(2, 4) == 1);
    CHECK(attn_mask_bytes(3, 3) == 2);
    CHECK(attn_mask_bytes(5000, 32768) == size_t(5000) * 32768 / 8);
}

TEST_CASE("attn_mask: key_pos <= query_pos, hand-computed bytes", "[attn_mask]") {
    // q0 (pos 1) sees keys 0, 1 -> bits 0, 1; q1 (pos 0) sees key 0 -> bit 3.
    const Built a = build({1, 0}, {0, 1, 2});
    REQUIRE(a.bits.size() == 1);
    CHECK(a.bits[0] == 0x0B);
    CHECK(a.n_visible == std::vector<int32_t>{2, 1});
}

TEST_CASE("attn_mask: unsorted positions, a row crossing a byte", "[attn_mask]") {
    // k_pos {7, 2, 5, 0, 9}: q0 (5) sees j 1,2,3 -> bits 1,2,3; q1 (2) sees j 1,3 -> bits 6, 8;
    // q2 (9) sees all -> bits 10..14. Byte 0 = 0b01001110, byte 1 = 0b01111101.
    const Built a = build({5, 2, 9}, {7, 2, 5, 0, 9});
    REQUIRE(a.bits.size() == 2);
    CHECK(a.bits[0] == 0x4E);
    CHECK(a.bits[1] == 0x7D);
    CHECK(a.n_visible == std::vector<int32_t>{3, 2, 5});
}

TEST_CASE("attn_mask: groups fold shard visibility into the mask", "[attn_mask]") {
    // Both queries at pos 3; key groups {-1 (all), 0, 1, 0}. q0 (group 0): j 0,1,3 -> bits
    // 0,1,3; q1 (group 1): j 0,2 -> bits 4,6. Byte = 0b01011011.
    const Built a = build({3, 3}, {0, 1, 2, 3}, {0, 1}, {-1, 0, 1, 0});
    REQUIRE(a.bits.size() == 1);
    CHECK(a.bits[0] == 0x5B);
    CHECK(a.n_visible == std::vector<int32_t>{3, 2});
}

TEST_CASE("attn_mask: a query that sees no key is an all-zero row", "[attn_mask]") {
    const Built a = build({0, 4}, {1, 2, 3});
    REQUIRE(a.bits.size() == 1);
    // q0 sees nothing (bits 0..2 clear); q1 sees all (bits 3..5).
    CHECK(a.bits[0] == 0x38);
    CHECK(a.n_visible == std::vector<int32_t>{0, 3});
    // The padding bits of the last byte stay 0.
    const Built b = build({9}, {0, 1, 2});
    CHECK(b.bits[0] == 0x07);
}

TEST_CASE("attn_mask: random unsorted positions and groups match the rule", "[attn_mask]") {
    std::mt19937 rng(7);
    for (int trial = 0; trial < 50; ++trial) {
        const int n_q = 1 + int(rng() % 37), n_kv = 1 + int(rng() % 53);
        std::vector<int32_t> qp(n_q), kp(n_kv), qg(n_q), kg(n_kv);
        for (auto& x : qp) x = int32_t(rng() % 64);
        for (auto& x : kp) x = int32_t(rng() % 64);
        for (auto& x : qg) x = int32_t(rng() % 3);
        for (auto& x : kg) x = int32_t(rng() % 4) - 1;
        const bool groups = trial % 2 == 1;
        const Built a = groups ? build(qp, kp, qg, kg) : build(qp, kp);
        for (int i = 0; i < n_q; ++i) {
            int count = 0;
            for (int j = 0; j < n_kv; ++j) {
                const bool vis = kp[j] <= qp[i] && (!groups || kg[j] < 0 || kg[j] == qg[i]);
                INFO("trial " << trial << " n_q " << n_q << " n_kv " << n_kv << " i " << i << " j "
                              << j);
                REQUIRE(attn_mask_get(a.bits.data(), n_kv, i, j) == vis);
                count += vis ? 1 : 0;
            }
            REQUIRE(a.n_visible[i] == count);
        }
    }
}

TEST_CASE("attn_mask: key groups without query groups are rejected", "[attn_mask]") {
    std::vector<int32_t> qp{1}, kp{0}, kg{0};
    MaskSpec s;
    s.q_pos = qp.data();
    s.k_pos = kp.data();
    s.k_group = kg.data();
    s.n_q = 1;
    s.n_kv = 1;
    uint8_t bits = 0;
    CHECK_THROWS_WITH(attn_mask_build(s, &bits, nullptr),
                      Catch::Contains("key groups given without query groups"));
}
