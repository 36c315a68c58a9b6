// KvCache row copies: every K/V row that enters or leaves the cache goes through write_rows /
// read_rows / write_range / read_range. Rows written to scattered slots come back unchanged and
// in order, other slots and layers are untouched, and slots outside the cache are refused.
#include <catch2/catch.hpp>
#include <vector>

#include "kernels/backend.h"
#include "runtime/core/error.h"
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
