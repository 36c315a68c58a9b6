// Generated (random:) weights through the backend: Backend::random_matrix against the host
// generator, and a model whose weights the backend generates against the same model built on
// the host (the CPU backend runs the device path of Model here: every tensor in backend
// storage, separate Q/K/V projections, cache writes by slot runs).
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/backend.h"
#include "runtime/model/model.h"
#include "runtime/model/model_loader.h"

using namespace infoflow;

namespace {

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double max_abs = 0.0, max_ref = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        max_abs = std::max(max_abs, std::fabs(double(a[i]) - b[i]));
        max_ref = std::max(max_ref, std::fabs(double(b[i])));
    }
    return max_abs / std::max(max_ref, 1e-30);
}

ModelConfig shape_config(const std::string& shape, bool untie) {
    ModelConfig c = random_model_config(shape);
    if (untie) {
        c.tied_embeddings = false;
        c.name += "-untied";
    }
    return c;
}

}  // namespace

TEST_CASE("generated weights: CPU random_matrix equals the host generator exactly", "[generated]") {
    auto be = make_cpu_backend(2);
    const ModelConfig c = shape_config("tiny-qwen2", true);
    const uint64_t seed = 77;
    const ModelWeights host = make_random_weights(c, seed);
    int n_matrices = 0;
    for (const WeightTensor& t : weight_tensors(host)) {
        if (t.cols == 0) {
            CHECK(random_host_tensor(seed, t.name, size_t(t.rows)) == *t.data);
            continue;
        }
        RandomMatrixSpec spec;
        spec.key = random_tensor_key(seed, t.name);
        spec.scale = random_weight_scale();
        Buffer b = be->random_matrix(int(t.rows), int(t.cols), spec);
        std::vector<float> got(size_t(t.rows * t.cols));
        be->download(got.data(), b.data(), got.size() * sizeof(float));
        INFO(t.name);
        CHECK(got == *t.data);
        ++n_matrices;
    }
    CHECK(n_matrices == 2 + 7 * c.n_layer);  // embedding, LM head, 7 per layer
}

TEST_CASE("generated weights: no host data, config and seed kept, stable fingerprint",
          "[generated]") {
    LoadOptions opt;
    opt.generate_on_backend = true;
    const ModelWeights g = load_model_weights("random:llama-3.1-8b:9", opt);  // 32 GB in fp32
    CHECK(g.generated);
    CHECK(g.seed == 9);
    CHECK(g.tok_embd.empty());
    CHECK(g.output.empty());
    REQUIRE(g.layers.size() == 32);
    CHECK(g.layers[0].wq.empty());
    CHECK(g.config.n_embd == 4096);
    CHECK(g.fingerprint == load_model_weights("random:llama-3.1-8b:9", opt).fingerprint);
    CHECK(g.fingerprint != load_model_weights("random:llama-3.1-8b:10", opt).fingerprint);
    const std::vector<WeightTensor> ts = weight_tensors(g);
    CHECK(ts.front().name == "model.embed_tokens.weight");
    CHECK(ts.front().rows == g.config.n_vocab);
    CHECK(ts.back().name == "lm_head.weight");  // llama-3.1-8b is untied
    // A file model ignores the option.
    CHECK_FALSE(load_model_weights("random:tiny", {}).generated);
}

TEST_CASE("generated weights: a backend-generated model gives the host model's logits",
          "[generated]") {
    struct Case {
        const char* shape;
        bool untie;
    };
    for (const Case& k : {Case{"tiny", false}, Case{"tiny", true}, Case{"tiny-qwen2", false},
                          Case{"tiny-qwen3", false}}) {
        const ModelConfig c = shape_config(k.shape, k.untie);
        const ModelWeights host = make_random_weights(c, 5);
        const ModelWeights gen = make_generated_weights(c, 5);
        auto be = make_cpu_backend(2);
        Model mh(*be, host);
        Model mg(*be, gen);
        // Prefill of 37 tokens, then two decode steps, with groups on the decode rows.
        std::vector<int32_t> tokens(37), pos(37);
        for (int i = 0; i < 37; ++i) tokens[i] = (i * 131 + 7) % c.n_vocab;
        std::iota(pos.begin(), pos.end(), 0);
        KvCache ch = mh.make_cache(64), cg = mg.make_cache(64);
        const std::vector<float> lh = mh.forward(ch, tokens, pos, true);
        const std::vector<float> lg = mg.forward(cg, tokens, pos, true);
        INFO("shape " << k.shape << (k.untie ? " untied" : ""));
        CHECK(max_rel_diff(lg, lh) <= 1e-5);
        for (int step = 0; step < 2; ++step) {
            const std::vector<int32_t> t = {int32_t(11 + step)}, p = {int32_t(37 + step)};
            CHECK(max_rel_diff(mg.forward(cg, t, p), mh.forward(ch, t, p)) <= 1e-5);
        }
    }
}

TEST_CASE("slot_runs: consecutive rows to consecutive slots form one run", "[generated]") {
    auto runs = [](std::vector<int32_t> s) {
        std::vector<std::vector<int>> out;
        for (const SlotRun& r : slot_runs(s.data(), int(s.size())))
            out.push_back({r.row, r.slot, r.n});
        return out;
    };
    using V = std::vector<std::vector<int>>;
    CHECK(runs({}) == V{});
    CHECK(runs({4}) == V{{0, 4, 1}});
    CHECK(runs({4, 5, 6}) == V{{0, 4, 3}});
    CHECK(runs({4, 5, 9, 10, 2}) == V{{0, 4, 2}, {2, 9, 2}, {4, 2, 1}});
    CHECK(runs({3, 3}) == V{{0, 3, 1}, {1, 3, 1}});
    CHECK(runs({7, 6, 5}) == V{{0, 7, 1}, {1, 6, 1}, {2, 5, 1}});
}
