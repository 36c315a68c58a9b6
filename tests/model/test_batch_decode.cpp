// Batched decode (runtime/model/batch_decode.h) against each request decoded alone: requests of
// different prompt lengths, one cache each, some joining the batch after others have decoded for
// a while and some ending early (continuous batching, job serve), give every step's logits and
// every token bit for bit as `decode_step` / `generate` give them on their own caches; seeded
// sampling too. On the real SmolLM2 file with its stored weights (one product for all rows) and
// on random models with fp32 weights (not held to row independence, so each row
// runs its own pass); with fp32 and f16 KV caches. Negative control: two rows given each
// other's caches get other logits, so a row attending the wrong cache cannot pass.
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "runtime/core/fs.h"
#include "runtime/model/batch_decode.h"
#include "runtime/model/generate.h"
#include "runtime/model/model.h"
#include "runtime/model/model_loader.h"

using namespace infoflow;

namespace {

struct Prompt {
    std::vector<int32_t> tokens;
    int max_new = 0;
    int join_step = 0;  // the batched run starts this request after this many batch steps
    SamplingParams sampling;
};

std::vector<Prompt> make_prompts(int vocab, uint32_t seed) {
    std::mt19937 rng(seed);
    const int lengths[] = {5, 41, 17, 70, 33};
    const int max_new[] = {12, 7, 16, 3, 10};
    const int join[] = {0, 0, 3, 5, 9};
    std::vector<Prompt> ps;
    for (int i = 0; i < 5; ++i) {
        Prompt p;
        for (int t = 0; t < lengths[i]; ++t) p.tokens.push_back(int32_t(rng() % uint32_t(vocab)));
        p.max_new = max_new[i];
        p.join_step = join[i];
        if (i == 2) {  // one seeded sampler among the greedy ones
            p.sampling.temperature = 0.9f;
            p.sampling.seed = 77;
        }
        ps.push_back(std::move(p));
    }
    return ps;
}

// Every step's logits of one request: row 0 the prefill's, then one row per decode step.
struct Trace {
    std::vector<int32_t> tokens;
    std::vector<std::vector<float>> logits;
};

std::vector<float> prefill(Model& m, KvCache& cache, const Prompt& p) {
    std::vector<int32_t> pos(p.tokens.size());
    std::iota(pos.begin(), pos.end(), 0);
    return m.forward(cache, p.tokens, pos);
}

GenerateOptions options(const Prompt& p) {
    GenerateOptions o;
    o.max_new_tokens = p.max_new;
    o.sampling = p.sampling;
    return o;
}

// Alone: decode_step after decode_step, as `generate` runs them.
Trace run_alone(Model& m, const Prompt& p) {
    KvCache cache = m.make_cache(int(p.tokens.size()) + p.max_new);
    Trace t;
    t.logits.push_back(prefill(m, cache, p));
    Generator g(m, t.logits[0], int32_t(p.tokens.size()), options(p));
    while (g.sample()) {
        t.logits.push_back(decode_step(m, cache, g.token(), g.pos()));
        g.set_logits(t.logits.back().data());
    }
    t.tokens = g.result().tokens;
    // `generate` itself gives the same tokens.
    KvCache c2 = m.make_cache(int(p.tokens.size()) + p.max_new);
    const std::vector<float> first = prefill(m, c2, p);
    CHECK(generate(m, c2, first, int32_t(p.tokens.size()), options(p)).tokens == t.tokens);
    return t;
}

// Batched: every running request advances by one decode_batch per step; a request joins after
// its join_step batch steps (its prefill then) and leaves when its generation ends.
std::vector<Trace> run_batched(Model& m, const std::vector<Prompt>& ps, int* max_rows) {
    const size_t n = ps.size();
    std::vector<std::unique_ptr<KvCache>> caches(n);
    std::vector<std::unique_ptr<Generator>> gens(n);
    std::vector<Trace> traces(n);
    *max_rows = 0;
    for (int step = 0;; ++step) {
        std::vector<DecodeRow> rows;
        std::vector<size_t> who;
        bool pending = false;
        for (size_t i = 0; i < n; ++i) {
            if (!gens[i] && ps[i].join_step <= step) {
                caches[i] = std::make_unique<KvCache>(
                    m.make_cache(int(ps[i].tokens.size()) + ps[i].max_new));
                traces[i].logits.push_back(prefill(m, *caches[i], ps[i]));
                gens[i] = std::make_unique<Generator>(m, traces[i].logits[0],
                                                      int32_t(ps[i].tokens.size()), options(ps[i]));
            }
            if (!gens[i]) {
                pending = true;
                continue;
            }
            if (gens[i]->done() || !gens[i]->sample()) continue;
            rows.push_back({caches[i].get(), gens[i]->token(), gens[i]->pos(), -1});
            who.push_back(i);
        }
        if (rows.empty() && !pending) break;
        *max_rows = std::max(*max_rows, int(rows.size()));
        const std::vector<float> out = decode_batch(m, rows);
        const size_t V = size_t(m.config().n_vocab);
        for (size_t r = 0; r < who.size(); ++r) {
            const float* row = out.data() + r * V;
            traces[who[r]].logits.emplace_back(row, row + V);
            gens[who[r]]->set_logits(row);
        }
    }
    for (size_t i = 0; i < n; ++i) traces[i].tokens = gens[i]->result().tokens;
    return traces;
}

void check_batched_equals_alone(Model& m, const std::string& label) {
    const std::vector<Prompt> ps = make_prompts(m.config().n_vocab, 5);
    int max_rows = 0;
    const std::vector<Trace> batched = run_batched(m, ps, &max_rows);
    CHECK(max_rows >= 4);  // the batch really held several requests at once
    for (size_t i = 0; i < ps.size(); ++i) {
        const Trace alone = run_alone(m, ps[i]);
        INFO(label << ": request " << i << " (prompt " << ps[i].tokens.size()
                   << " tokens, joins at " << ps[i].join_step << ")");
        CHECK(batched[i].tokens == alone.tokens);
        REQUIRE(batched[i].logits.size() == alone.logits.size());
        for (size_t s = 0; s < alone.logits.size(); ++s) {
            INFO("step " << s);
            CHECK(std::memcmp(batched[i].logits[s].data(), alone.logits[s].data(),
                              alone.logits[s].size() * sizeof(float)) == 0);
        }
    }
}

}  // namespace

TEST_CASE("decode_batch: every request's logits and tokens are bit-identical to its run alone",
          "[batch][real]") {
    REQUIRE(file_exists(INFOFLOW_MODEL_PATH));
    LoadOptions o;
    o.native_weights = true;
    const ModelWeights w = load_model_weights(INFOFLOW_MODEL_PATH, o);
    for (const auto& [kv, threads] : {std::pair{KvDtype::f16, 2}, std::pair{KvDtype::f32, 1}}) {
        auto be = make_cpu_backend(threads);
        Model m(*be, w);
        m.set_kv_dtype(kv);
        check_batched_equals_alone(m, std::string("SmolLM2 native, kv ") + kv_dtype_name(kv) +
                                          ", " + std::to_string(threads) + " thread(s)");
    }
}

TEST_CASE("decode_batch: fp32 weights (a row per pass) are bit-identical too",
          "[batch]") {
    for (const std::string shape : {"tiny", "tiny-qwen2", "tiny-qwen3"}) {
        const ModelWeights w = load_model_weights("random:" + shape);
        auto be = make_cpu_backend(2);
        Model m(*be, w);
        check_batched_equals_alone(m, "random:" + shape);
    }
}

TEST_CASE("decode_batch: rows attend over their own caches (negative control)", "[batch]") {
    const ModelWeights w = load_model_weights("random:tiny");
    auto be = make_cpu_backend(2);
    Model m(*be, w);
    const std::vector<Prompt> ps = make_prompts(m.config().n_vocab, 9);
    std::vector<KvCache> caches;
    for (int i = 0; i < 2; ++i) caches.push_back(m.make_cache(200));
    std::vector<std::vector<float>> firsts;
    for (int i = 0; i < 2; ++i) firsts.push_back(prefill(m, caches[size_t(i)], ps[size_t(i)]));
    const int32_t p0 = int32_t(ps[0].tokens.size()), p1 = int32_t(ps[1].tokens.size());
    // Row 0 carries request 0's token and position but request 1's cache, and the reverse.
    const std::vector<float> swapped =
        decode_batch(m, {{&caches[1], 3, p0, -1}, {&caches[0], 4, p1, -1}});
    for (KvCache& c : caches) c.truncate(c.size() - 1);
    const std::vector<float> right =
        decode_batch(m, {{&caches[0], 3, p0, -1}, {&caches[1], 4, p1, -1}});
    const size_t V = size_t(m.config().n_vocab);
    CHECK(std::memcmp(swapped.data(), right.data(), V * sizeof(float)) != 0);
    CHECK(std::memcmp(swapped.data() + V, right.data() + V, V * sizeof(float)) != 0);
    // A cache twice in one step is refused (its two new slots would see each other).
    CHECK_THROWS_WITH(decode_batch(m, {{&caches[0], 3, 90, -1}, {&caches[0], 4, 91, -1}}),
                      Catch::Contains("share a cache"));
}
