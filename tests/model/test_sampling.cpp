// Token selection (runtime/model/sampling.h) and the generation loop's token callback
// (runtime/model/generate.h): top-p keeps the smallest most-likely set reaching the mass, the
// logit bias moves greedy and sampled choices, and a callback that returns false ends the
// generation after that token.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <vector>

#include "kernels/backend.h"
#include "runtime/model/generate.h"
#include "runtime/model/model.h"
#include "runtime/model/model_loader.h"
#include "runtime/model/sampling.h"

using namespace infoflow;

namespace {

// Logits whose softmax at temperature 1 is exactly `p`.
std::vector<float> logits_of(const std::vector<double>& p) {
    std::vector<float> l;
    for (double x : p) l.push_back(float(std::log(x)));
    return l;
}

std::map<int32_t, int> histogram(const SamplingParams& sp, const std::vector<float>& l, int n) {
    Sampler s(sp);
    std::map<int32_t, int> h;
    for (int i = 0; i < n; ++i) ++h[s.sample(l.data(), int(l.size()))];
    return h;
}

}  // namespace

TEST_CASE("top-p keeps the most likely tokens until their mass reaches p", "[sampling]") {
    const std::vector<float> l = logits_of({0.05, 0.5, 0.15, 0.3});
    SamplingParams sp;
    sp.temperature = 1.0f;
    sp.seed = 11;
    sp.top_p = 0.6;  // 0.5 + 0.3 reach it: ids 1 and 3, renormalized 0.625 / 0.375
    const auto h = histogram(sp, l, 4000);
    CHECK(h.count(0) == 0);
    CHECK(h.count(2) == 0);
    const double f1 = h.at(1) / 4000.0;
    CHECK(std::fabs(f1 - 0.625) < 0.04);  // 5 sigma of a binomial proportion at n = 4000
    sp.top_p = 0.5;                       // the first token alone reaches it
    CHECK(histogram(sp, l, 500).size() == 1);
    sp.top_p = 1.0;  // no cut: every token appears
    CHECK(histogram(sp, l, 4000).size() == 4);
    sp.top_p = 0.0;
    CHECK_THROWS_WITH(Sampler(sp), Catch::Contains("top_p must be in (0, 1]"));
}

TEST_CASE("the logit bias moves greedy and sampled choices", "[sampling]") {
    const std::vector<float> l = logits_of({0.05, 0.5, 0.15, 0.3});
    SamplingParams sp;
    CHECK(Sampler(sp).sample(l.data(), 4) == 1);
    sp.logit_bias = {{1, -100.0f}};
    CHECK(Sampler(sp).sample(l.data(), 4) == 3);  // the next most likely
    sp.logit_bias = {{0, 10.0f}};
    CHECK(Sampler(sp).sample(l.data(), 4) == 0);
    sp.temperature = 1.0f;
    sp.logit_bias = {{1, -100.0f}, {3, -100.0f}};
    const auto h = histogram(sp, l, 1000);
    CHECK(h.count(1) == 0);
    CHECK(h.count(3) == 0);
    sp.logit_bias = {{4, 1.0f}};
    CHECK_THROWS_WITH(Sampler(sp).sample(l.data(), 4), Catch::Contains("token id 4"));
}

TEST_CASE("a token callback that returns false ends the generation after that token",
          "[sampling]") {
    const ModelWeights w = load_model_weights("random:tiny");
    auto be = make_cpu_backend(2);
    Model m(*be, w);
    std::vector<int32_t> toks(8), pos(8);
    for (int i = 0; i < 8; ++i) toks[i] = 3 + i, pos[i] = i;
    auto run = [&](const TokenCallback& cb) {
        KvCache c = m.make_cache(64);
        const auto logits = m.forward(c, toks, pos);
        GenerateOptions opt;
        opt.max_new_tokens = 10;
        opt.on_token = cb;
        return generate(m, c, logits, 8, opt);
    };
    const GenerateResult all = run({});
    REQUIRE(all.tokens.size() == 10);
    std::vector<int32_t> seen;
    const GenerateResult cut = run([&](int32_t t) {
        seen.push_back(t);
        return seen.size() < 4;
    });
    CHECK(cut.cancelled);
    CHECK(cut.tokens.size() == 4);  // the token the callback refused is still part of it
    CHECK(seen == cut.tokens);
    CHECK(std::vector<int32_t>(all.tokens.begin(), all.tokens.begin() + 4) == cut.tokens);
    CHECK_FALSE(all.cancelled);
}
