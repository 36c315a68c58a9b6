// The prefix cache (runtime/method/prefix_cache.h) against a fresh prefill: a kept chunk 0 is
// bit for bit what prefill_chunk gives; entries are told apart by their tokens and the KV type;
// the least recently used goes first past the byte bound, and a chunk over the bound is never
// kept. Then whole requests sharing a chunk 0: run_method with the cache (its second request a
// hit) gives the first-token logits, selection and answer of the run without it.
#include <catch2/catch.hpp>
#include <cstring>

#include "runtime/method/pipeline.h"
#include "runtime/method/prefix_cache.h"
#include "tests/method/method_fixture.h"

using namespace infoflow;
using namespace infoflow::test;

namespace {

bool same_bits(const ChunkKv& a, const ChunkKv& b) {
    if (a.tokens != b.tokens || a.local_pos != b.local_pos || a.dtype != b.dtype) return false;
    if (a.k.size() != b.k.size() || a.v.size() != b.v.size()) return false;
    for (size_t l = 0; l < a.k.size(); ++l) {
        for (const auto* p : {&a.k, &a.v}) {
            const Buffer& x = (*p)[l];
            const Buffer& y = (p == &a.k ? b.k : b.v)[l];
            if (x.bytes() != y.bytes() || std::memcmp(x.data(), y.data(), x.bytes()) != 0)
                return false;
        }
    }
    return true;
}

std::vector<int32_t> tokens_from(int32_t first, int n) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back(first + 7 * i % 50);
    return t;
}

}  // namespace

TEST_CASE("prefix cache: a kept chunk 0 is its prefill's bits, bounded, least recent out",
          "[prefix_cache]") {
    TinyModel tm;
    Model& m = *tm.m;
    const auto a = tokens_from(5, 20), b = tokens_from(9, 20), c = tokens_from(13, 20);
    const ChunkKv fresh_a = prefill_chunk(m, a, -1);
    const size_t one = chunk_kv_bytes(fresh_a);
    REQUIRE(one > 0);
    PrefixKvCache cache(2 * one);  // room for two
    CHECK(same_bits(cache.get(m, a), fresh_a));
    CHECK((cache.hits() == 0 && cache.misses() == 1 && cache.entries() == 1));
    CHECK(same_bits(cache.get(m, a), fresh_a));  // the kept copy
    CHECK(cache.hits() == 1);
    CHECK(same_bits(cache.get(m, b), prefill_chunk(m, b, -1)));  // other tokens: its own entry
    CHECK((cache.misses() == 2 && cache.entries() == 2 && cache.bytes() == 2 * one));
    cache.get(m, a);  // a is now the most recently used: c evicts b
    CHECK(same_bits(cache.get(m, c), prefill_chunk(m, c, -1)));
    CHECK((cache.entries() == 2 && cache.bytes() <= cache.max_bytes()));
    const uint64_t hits = cache.hits();
    cache.get(m, a);
    CHECK(cache.hits() == hits + 1);
    cache.get(m, b);
    CHECK(cache.hits() == hits + 1);  // b was evicted: prefilled again
    // Another KV type is another chunk 0.
    m.set_kv_dtype(KvDtype::f16);
    const ChunkKv half = cache.get(m, a);
    CHECK(half.dtype == KvDtype::f16);
    CHECK(same_bits(half, prefill_chunk(m, a, -1)));
    CHECK(cache.hits() == hits + 1);
    // A chunk larger than the bound is prefilled every time and never kept.
    m.set_kv_dtype(KvDtype::f32);
    PrefixKvCache small(one - 1);
    CHECK(same_bits(small.get(m, a), fresh_a));
    CHECK(same_bits(small.get(m, a), fresh_a));
    CHECK((small.hits() == 0 && small.misses() == 2 && small.entries() == 0 && small.bytes() == 0));
}

TEST_CASE("prefix cache: requests sharing chunk 0 give the bits of runs without it",
          "[prefix_cache]") {
    TinyModel tm;
    Model& m = *tm.m;
    PrefixKvCache cache(64 << 20);
    const PreparedRequest r1 = random_request(11, m.config().n_vocab, 12, {40, 30}, 10);
    PreparedRequest r2 = random_request(12, m.config().n_vocab, 12, {25, 50, 20}, 10);
    r2.chunks[0] = r1.chunks[0];  // the same system prompt and instruction
    for (const Config::Method method : {Config::Method::infoflow, Config::Method::cacheblend}) {
        Config cfg = method_config(method, 0.2);
        cfg.decode.max_new_tokens = 5;
        for (const PreparedRequest* req : {&r1, static_cast<const PreparedRequest*>(&r2)}) {
            const MethodResult plain = run_method(m, *req, cfg, {}, {});
            RunHooks hooks;
            hooks.prefix_cache = &cache;
            const MethodResult kept = run_method(m, *req, cfg, {}, hooks);
            INFO(to_string(method));
            REQUIRE(plain.first_logits.size() == kept.first_logits.size());
            CHECK(std::memcmp(plain.first_logits.data(), kept.first_logits.data(),
                              plain.first_logits.size() * sizeof(float)) == 0);
            CHECK(plain.selected_positions == kept.selected_positions);
            CHECK(plain.answer == kept.answer);
        }
    }
    CHECK((cache.misses() == 1 && cache.hits() == 3));  // prefilled once, then copied
}
