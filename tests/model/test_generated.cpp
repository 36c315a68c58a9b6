// Generated (random:) weights through the backend: Backend::random_matrix against the host
// generator, and a model whose weights the backend generates against the same model built on
// the host (the CPU backend runs the device path of Model here: every tensor in backend
// storage, separate Q/K/V projections, cache writes by slot runs).
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <vector>

#include "../gpu/gpu_random_pick.h"
#include "../gpu_flashinfer/host/paper_shapes.h"
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

namespace {

// The CPU backend under another name, so Model takes the path of every non-CPU backend (each
// tensor loaded once through load_matrix / upload, separate Q/K/V projections) while the
// arithmetic stays the CPU's: the device path's weight handling checked on any machine.
class CpuUnderAnotherName final : public Backend {
  public:
    std::string name() const override { return "cpu-as-device"; }
    void set_threads(int n) override { cpu_->set_threads(n); }
    Buffer alloc(size_t bytes) override { return cpu_->alloc(bytes); }
    void release(void*) override {}  // buffers are owned by the inner backend
    void upload(void* d, const void* s, size_t n) override { cpu_->upload(d, s, n); }
    void download(void* d, const void* s, size_t n) override { cpu_->download(d, s, n); }
    void copy(void* d, const void* s, size_t n) override { cpu_->copy(d, s, n); }
    void synchronize() override {}
    Buffer load_matrix(const float* h, int r, int c) override {
        ++matrices_loaded;
        return cpu_->load_matrix(h, r, c);
    }
    Buffer random_matrix(int r, int c, const RandomMatrixSpec& s) override {
        return cpu_->random_matrix(r, c, s);
    }
    void embed(const float* t, const int32_t* ids, int n, int e, float* o) override {
        cpu_->embed(t, ids, n, e, o);
    }
    void rms_norm(const float* x, const float* w, int n, int d, float eps, float* o) override {
        cpu_->rms_norm(x, w, n, d, eps, o);
    }
    void matmul(const float* x, const float* w, const float* b, int n, int k, int m, float* o,
                bool acc) override {
        cpu_->matmul(x, w, b, n, k, m, o, acc);
    }
    void rope(float* x, const int32_t* p, int n, int h, int d, const float* f) override {
        cpu_->rope(x, p, n, h, d, f);
    }
    void attention(const AttnParams& p) override { cpu_->attention(p); }
    void attention_scores(const ScoreParams& p) override { cpu_->attention_scores(p); }
    void swiglu(const float* g, const float* u, size_t n, float* o) override {
        cpu_->swiglu(g, u, n, o);
    }
    void add(float* y, const float* x, size_t n) override { cpu_->add(y, x, n); }
    void lse_merge(float* oa, float* la, const float* ob, const float* lb, int r, int d) override {
        cpu_->lse_merge(oa, la, ob, lb, r, d);
    }
    int matrices_loaded = 0;

  private:
    std::unique_ptr<Backend> cpu_ = make_cpu_backend(2);
};

}  // namespace

TEST_CASE("device path of Model: file weights loaded through load_matrix give the CPU logits",
          "[generated]") {
    for (const char* shape : {"tiny-qwen2", "tiny-qwen3"}) {
        ModelConfig c = random_model_config(shape);
        c.tied_embeddings = false;  // both the embedding table and a separate LM head
        const ModelWeights w = make_random_weights(c, 8);
        auto cpu = make_cpu_backend(2);
        CpuUnderAnotherName dev;
        Model mc(*cpu, w);
        Model md(dev, w);
        CHECK(dev.matrices_loaded == 2 + 7 * c.n_layer);
        std::vector<int32_t> tokens(29), pos(29);
        for (int i = 0; i < 29; ++i) tokens[i] = (i * 37 + 1) % c.n_vocab;
        std::iota(pos.begin(), pos.end(), 3);
        KvCache kc = mc.make_cache(32), kd = md.make_cache(32);
        INFO("shape " << shape);
        CHECK(max_rel_diff(md.forward(kd, tokens, pos, true), mc.forward(kc, tokens, pos, true)) <=
              1e-5);
    }
}

TEST_CASE("generated weights: the GPU generator test's tensor count for the paper's shapes",
          "[generated]") {
    // tests/gpu/test_cuda_model.cpp ([gpu_random]) compares layer 1's matrices and the LM head
    // of llama-3.1-8b and qwen3-14b on the device; its expected count must match what the
    // shapes generate (both have untied LM heads, as the released models do).
    int total = 0;
    for (const char* shape : {"llama-3.1-8b", "qwen3-14b"}) {
        CAPTURE(shape);
        const ModelConfig c = random_model_config(shape);
        CHECK_FALSE(c.tied_embeddings);
        const ModelWeights g = make_generated_weights(c, 1);
        int picked = 0;
        for (const WeightTensor& t : weight_tensors(g)) picked += gpu_test::gpu_random_pick(t);
        CHECK(picked == gpu_test::gpu_random_expected(c));
        total += picked;
    }
    CHECK(total == 16);
}

TEST_CASE("generated weights: the launch-plan tests' paper shapes are the model shapes",
          "[generated]") {
    // tests/gpu_flashinfer/host/paper_shapes.h restates them for tests that do not link models.
    for (const test::PaperShape& p : test::kPaperShapes) {
        CAPTURE(p.name);
        const ModelConfig c = random_model_config(p.name);
        CHECK(c.n_head == p.n_head);
        CHECK(c.n_head_kv == p.n_head_kv);
        CHECK(c.head_dim == p.head_dim);
        CHECK(c.n_embd == p.n_embd);
        CHECK(c.n_ff == p.n_ff);
        CHECK(c.n_vocab == p.n_vocab);
    }
}
