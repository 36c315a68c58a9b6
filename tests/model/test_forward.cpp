// Forward-pass invariants on tiny random models (docs/design.md §6.6, §6.7): prefill(n) then one
// decode step gives the logits of prefill(n+1), for llama, qwen2 (q/k/v biases) and qwen3 (q/k
// norm, head_dim != n_embd/n_head); the same model saved as GGUF (llama Q/K row order) and as
// safetensors gives the same logits, and skipping the un-permute breaks that.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <random>

#include "runtime/model/generate.h"
#include "runtime/model/model.h"
#include "runtime/model/model_loader.h"
#include "tests/cpu_paths/cpu_paths.h"

using namespace infoflow;

namespace {

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        num = std::max(num, double(std::fabs(a[i] - b[i])));
        den = std::max(den, double(std::fabs(b[i])));
    }
    return num / std::max(den, 1e-30);
}

std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> t(n);
    for (auto& x : t) x = int32_t(rng() % uint32_t(vocab));
    return t;
}

std::vector<int32_t> iota_pos(int n, int start = 0) {
    std::vector<int32_t> p(n);
    std::iota(p.begin(), p.end(), start);
    return p;
}

std::string temp_dir(const std::string& name) {
    auto p = std::filesystem::temp_directory_path() / ("infoflow_test_" + name);
    std::filesystem::remove_all(p);
    std::filesystem::create_directories(p);
    return p.string();
}

}  // namespace

TEST_CASE("prefill(n) then decode(1) equals prefill(n+1) [6.6]", "[forward][invariant]") {
    for (const std::string shape : {"tiny", "tiny-qwen2", "tiny-qwen3"}) {
        const ModelWeights w = load_model_weights("random:" + shape);
        auto be = make_cpu_backend(2);
        Model m(*be, w);
        const int n = 37;
        const auto toks = random_tokens(n + 1, w.config.n_vocab, 11);
        KvCache c1 = m.make_cache(n + 1);
        m.forward(c1, std::vector<int32_t>(toks.begin(), toks.begin() + n), iota_pos(n));
        const std::vector<float> step = decode_step(m, c1, toks[n], n);
        KvCache c2 = m.make_cache(n + 1);
        const std::vector<float> whole = m.forward(c2, toks, iota_pos(n + 1));
        CAPTURE(shape);
        // Another pass (decode) over the same weights: the path's tolerance (tests/cpu_paths).
        CHECK(rel_err(step, whole) <= test::path_tolerance().logits);
        // Teacher-forced rows of one prefill equal the last-row logits of shorter prefills.
        KvCache c3 = m.make_cache(n + 1);
        const std::vector<float> all = m.forward(c3, toks, iota_pos(n + 1), true);
        const size_t V = size_t(w.config.n_vocab);
        const std::vector<float> last(all.end() - long(V), all.end());
        CHECK(rel_err(last, whole) <= 1e-5);
    }
}

TEST_CASE("the same model as GGUF and as safetensors gives the same logits [6.7]",
          "[forward][invariant]") {
    const ModelWeights w = load_model_weights("random:tiny:5");
    const std::string dir = temp_dir("gguf_vs_st");
    save_model_gguf(w, dir + "/tiny.gguf");
    save_model_hf(w, dir + "/hf");
    const ModelWeights wg = load_model_weights(dir + "/tiny.gguf");
    const ModelWeights ws = load_model_weights(dir + "/hf");
    LoadOptions raw;
    raw.unpermute_qk = false;
    const ModelWeights wn = load_model_weights(dir + "/tiny.gguf", raw);

    auto be = make_cpu_backend(2);
    const auto toks = random_tokens(29, w.config.n_vocab, 3);
    auto logits = [&](const ModelWeights& mw, std::vector<float>* k0) {
        Model m(*be, mw);
        KvCache c = m.make_cache(int(toks.size()));
        auto out = m.forward(c, toks, iota_pos(int(toks.size())), true);
        k0->assign(c.k(0), c.k(0) + size_t(c.size()) * c.row());
        return out;
    };
    std::vector<float> kg, ks, kn;
    const auto lg = logits(wg, &kg);
    const auto ls = logits(ws, &ks);
    const auto ln = logits(wn, &kn);
    CHECK(rel_err(lg, ls) <= 1e-5);
    CHECK(rel_err(kg, ks) <= 1e-5);  // one RoPE convention, one K-cache layout
    // Negative control: without the un-permute the rotation pairs are wrong.
    CHECK(rel_err(ln, ls) > 1e-3);
    CHECK(rel_err(kn, ks) > 1e-2);
    std::filesystem::remove_all(dir);
}

TEST_CASE("greedy generation is deterministic and seeded sampling is reproducible", "[forward]") {
    const ModelWeights w = load_model_weights("random:tiny");
    auto be = make_cpu_backend(2);
    Model m(*be, w);
    const auto toks = random_tokens(16, w.config.n_vocab, 9);
    auto run = [&](float temperature, uint64_t seed) {
        KvCache c = m.make_cache(64);
        const auto logits = m.forward(c, toks, iota_pos(16));
        GenerateOptions opt;
        opt.max_new_tokens = 12;
        opt.sampling.temperature = temperature;
        opt.sampling.seed = seed;
        return generate(m, c, logits, 16, opt).tokens;
    };
    CHECK(run(0.0f, 1) == run(0.0f, 2));
    CHECK(run(1.0f, 7) == run(1.0f, 7));
    CHECK(run(5.0f, 7) != run(5.0f, 8));
}
