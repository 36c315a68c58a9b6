// KvCache row copies: every K/V row that enters or leaves the cache goes through write_rows /
// read_rows / write_range / read_range. Rows written to scattered slots come back unchanged and
// in order, other slots and layers are untouched, and slots outside the cache are refused.
#include <catch2/catch.hpp>
#include <vector>

#include "kernels/backend.h"
#include "runtime/core/error.h"
#include "runtime/core/half.h"
#include "runtime/model/kv_cache.h"
#include "runtime/model/model_loader.h"

using namespace infoflow;

namespace {

// Host rows uploaded into a backend buffer: row i holds base + i*row + j at column j.
Buffer rows_buffer(Backend& be, int n, int row, float base) {
    std::vector<float> h(size_t(n) * row);
    for (size_t i = 0; i < h.size(); ++i) h[i] = base + float(i);
    Buffer b = be.alloc_floats(std::max<size_t>(1, h.size()));
    be.upload(b.data(), h.data(), h.size() * sizeof(float));
    return b;
}

std::vector<float> host(Backend& be, const float* p, size_t n) {
    std::vector<float> h(n);
    be.download(h.data(), p, n * sizeof(float));
    return h;
}

}  // namespace

TEST_CASE("KvCache: rows written to scattered slots read back unchanged", "[kv_cache]") {
    auto be = make_cpu_backend(1);
    const ModelConfig c = random_model_config("tiny");
    const int row = c.n_head_kv * c.head_dim;
    KvCache cache(*be, c, 16);
    std::vector<int32_t> pos(10);
    for (int i = 0; i < 10; ++i) pos[i] = i;
    cache.append(10, pos.data(), nullptr);
    REQUIRE(cache.row() == row);

    // Zeros everywhere first, so untouched slots can be checked.
    const std::vector<float> z(size_t(10) * row, 0.0f);
    Buffer zero = be->alloc_floats(z.size());
    be->upload(zero.data(), z.data(), z.size() * sizeof(float));
    for (int l = 0; l < c.n_layer; ++l) cache.write_range(l, 0, 10, zero.data(), zero.data());

    // Slots with a run (3, 4, 5), a gap and a reversal: 3 4 5 8 1.
    const std::vector<int32_t> slots = {3, 4, 5, 8, 1};
    const int n = int(slots.size());
    const Buffer k = rows_buffer(*be, n, row, 1000.0f);
    const Buffer v = rows_buffer(*be, n, row, 5000.0f);
    cache.write_rows(1, slots.data(), k.data(), v.data(), n);

    Buffer k_back = be->alloc_floats(size_t(n) * row), v_back = be->alloc_floats(size_t(n) * row);
    cache.read_rows(1, slots.data(), k_back.data(), v_back.data(), n);
    CHECK(host(*be, k_back.data(), size_t(n) * row) == host(*be, k.data(), size_t(n) * row));
    CHECK(host(*be, v_back.data(), size_t(n) * row) == host(*be, v.data(), size_t(n) * row));

    // Slot-wise: slot slots[i] holds row i; the other slots and layer 0 stay zero.
    const std::vector<float> k_all = host(*be, cache.k(1), size_t(10) * row);
    const std::vector<float> k0 = host(*be, cache.k(0), size_t(10) * row);
    for (int s = 0; s < 10; ++s) {
        int i = -1;
        for (int t = 0; t < n; ++t) i = slots[t] == s ? t : i;
        for (int j = 0; j < row; ++j) {
            const float want = i >= 0 ? 1000.0f + float(i * row + j) : 0.0f;
            CHECK(k_all[size_t(s) * row + j] == want);
            CHECK(k0[size_t(s) * row + j] == 0.0f);
        }
    }

    // read_range of a contiguous run equals the rows written there; one side may be skipped.
    Buffer v_run = be->alloc_floats(size_t(3) * row);
    cache.read_range(1, 3, 3, nullptr, v_run.data());
    const std::vector<float> v_host = host(*be, v.data(), size_t(3) * row);
    CHECK(host(*be, v_run.data(), size_t(3) * row) == v_host);
}

TEST_CASE("KvCache: row copies outside the used slots are refused", "[kv_cache]") {
    auto be = make_cpu_backend(1);
    const ModelConfig c = random_model_config("tiny");
    KvCache cache(*be, c, 8);
    std::vector<int32_t> pos = {0, 1, 2, 3};
    cache.append(4, pos.data(), nullptr);
    const Buffer k = rows_buffer(*be, 2, cache.row(), 0.0f);
    const std::vector<int32_t> past_end = {3, 4};  // slot 4 is within capacity, not in use
    CHECK_THROWS_AS(cache.write_rows(0, past_end.data(), k.data(), k.data(), 2), Error);
    const std::vector<int32_t> negative = {-1};
    CHECK_THROWS_AS(cache.write_rows(0, negative.data(), k.data(), k.data(), 1), Error);
    CHECK_THROWS_AS(cache.write_range(0, 3, 2, k.data(), k.data()), Error);
    Buffer out = be->alloc_floats(size_t(2) * cache.row());
    CHECK_THROWS_AS(cache.read_range(0, 3, 2, out.data(), out.data()), Error);
    CHECK_NOTHROW(cache.write_range(0, 2, 2, k.data(), k.data()));
}

TEST_CASE("KvCache: f16/bf16 storage rounds each element once, raw rows travel unchanged",
          "[kv_cache]") {
    auto be = make_cpu_backend(1);
    const ModelConfig c = random_model_config("tiny");
    const int row = c.n_head_kv * c.head_dim;
    const int layer = c.n_layer - 1;
    for (KvDtype t : {KvDtype::f16, KvDtype::bf16}) {
        INFO("kv dtype " << kv_dtype_name(t));
        KvCache cache(*be, c, 8, t);
        CHECK(cache.dtype() == t);
        CHECK(cache.row_bytes() == size_t(row) * 2);
        std::vector<int32_t> pos = {0, 1, 2, 3, 4, 5};
        cache.append(6, pos.data(), nullptr);
        // Values that are not representable in 16 bits: each comes back as its nearest-even
        // rounding (half.h), computed here independently of the cache's vector path.
        std::vector<float> k(size_t(3) * row), v(k.size());
        for (size_t i = 0; i < k.size(); ++i) {
            k[i] = 0.1f + 0.37f * float(i) - 3.0f;
            v[i] = 1.0f / (1.0f + float(i)) - 0.01f * float(i);
        }
        auto round = [&](float x) {
            return t == KvDtype::f16 ? fp16_to_fp32(fp32_to_fp16(x))
                                     : bf16_to_fp32(fp32_to_bf16(x));
        };
        const std::vector<int32_t> slots = {4, 1, 2};
        cache.write_rows(layer, slots.data(), k.data(), v.data(), 3);
        std::vector<float> kb(k.size()), vb(v.size());
        cache.read_rows(layer, slots.data(), kb.data(), vb.data(), 3);
        size_t changed = 0;
        for (size_t i = 0; i < k.size(); ++i) {
            CHECK(kb[i] == round(k[i]));
            CHECK(vb[i] == round(v[i]));
            changed += kb[i] != k[i];
        }
        CHECK(changed > 0);  // the storage really is narrower

        // Raw rows (as another rank receives them) land bit-identical in another cache.
        std::vector<uint16_t> rk(size_t(3) * row), rv(rk.size());
        cache.read_rows_raw(layer, slots.data(), rk.data(), rv.data(), 3);
        KvCache other(*be, c, 8, t);
        other.append(3, pos.data(), nullptr);
        other.write_range_raw(layer, 0, 3, rk.data(), rv.data());
        std::vector<float> ko(k.size());
        other.read_range(layer, 0, 3, ko.data(), nullptr);
        CHECK(ko == kb);

        // Attention is pointed at the 16-bit storage; fp32 access is refused.
        AttnParams ap;
        cache.attn_kv(layer, 1, ap);
        CHECK(ap.kv_dtype == t);
        CHECK(ap.k == nullptr);
        REQUIRE(ap.k16 != nullptr);
        uint16_t want16 = 0;
        const float k_slot1 = k[size_t(1) * row];  // row 1 went to slot 1
        want16 = t == KvDtype::f16 ? fp32_to_fp16(k_slot1) : fp32_to_bf16(k_slot1);
        CHECK(ap.k16[0] == want16);
        CHECK_THROWS_WITH(cache.k(0), Catch::Contains("fp32 access"));
    }
}
