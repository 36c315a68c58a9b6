// The CUDA backend on whole models: device-generated random weights equal the host generator
// (up to the bf16 rounding, exactly), a generated model on the GPU against the same model on
// the CPU, and the real SmolLM2 file: the greedy answer to the France question and the
// first-token logits, cuda against cpu.
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "gpu_random_pick.h"
#include "gpu_util.h"
#include "runtime/core/fs.h"
#include "runtime/core/half.h"
#include "runtime/formats/chat_template.h"
#include "runtime/formats/gguf.h"
#include "runtime/formats/tokenizer.h"
#include "runtime/model/generate.h"
#include "runtime/model/model.h"
#include "runtime/model/model_loader.h"

using namespace infoflow;
using namespace infoflow::gpu_test;

TEST_CASE("cuda random weights: device generator equals the host generator", "[gpu_random]") {
    Pair b;
    // Tensors of the paper-scale shapes, by name, as the model generates them.
    const ModelWeights g8 = make_generated_weights(random_model_config("llama-3.1-8b"), 1234);
    const ModelWeights g14 = make_generated_weights(random_model_config("qwen3-14b"), 42);
    int checked = 0;
    for (const ModelWeights* g : {&g8, &g14}) {
        for (const WeightTensor& t : weight_tensors(*g)) {
            // Layer 1's matrices and the LM head (untied models): every element compared.
            if (!gpu_random_pick(t)) continue;
            RandomMatrixSpec spec;
            spec.key = random_tensor_key(g->seed, t.name);
            spec.scale = random_weight_scale();
            const size_t n = size_t(t.rows * t.cols);
            Buffer d = b.gpu->random_matrix(int(t.rows), int(t.cols), spec);
            std::vector<uint16_t> got(n);
            b.gpu->download(got.data(), d.data(), n * sizeof(uint16_t));
            const std::vector<float> want = random_host_tensor(g->seed, t.name, n);
            size_t bad = 0;
            for (size_t i = 0; i < n; ++i) bad += got[i] != fp32_to_bf16(want[i]);
            INFO(g->source << " " << t.name);
            CHECK(bad == 0);
            ++checked;
        }
    }
    // Both paper models have their own LM head (model_loader.cpp's shape table): 2 * (7 + 1).
    CHECK(checked == gpu_random_expected(g8.config) + gpu_random_expected(g14.config));
}

TEST_CASE("cuda random weights: generated models on the GPU match the host models on the CPU",
          "[gpu_random]") {
    Pair b;
    for (const char* shape : {"tiny", "tiny-qwen2", "tiny-qwen3", "smollm2-135m"}) {
        const ModelConfig c = random_model_config(shape);
        const ModelWeights host = make_random_weights(c, 3);
        const ModelWeights gen = make_generated_weights(c, 3);
        Model mc(*b.cpu, host);
        Model mg(*b.gpu, gen);
        const int n = 300;
        std::vector<int32_t> tokens(n), pos(n);
        for (int i = 0; i < n; ++i) tokens[i] = (i * 977 + 5) % c.n_vocab;
        std::iota(pos.begin(), pos.end(), 0);
        KvCache kc = mc.make_cache(n + 2), kg = mg.make_cache(n + 2);
        INFO("shape " << shape);
        CHECK(rel_err(mg.forward(kg, tokens, pos), mc.forward(kc, tokens, pos)) <= kTolBf16);
        const std::vector<int32_t> t1 = {17}, p1 = {n};
        CHECK(rel_err(mg.forward(kg, t1, p1), mc.forward(kc, t1, p1)) <= kTolBf16);
    }
    // The paper shape builds on the device without touching host memory, and runs.
    const ModelWeights g8 = make_generated_weights(random_model_config("llama-3.1-8b"), 1234);
    Model m8(*b.gpu, g8);
    KvCache k8 = m8.make_cache(64);
    std::vector<int32_t> tokens(64), pos(64);
    std::iota(tokens.begin(), tokens.end(), 100);
    std::iota(pos.begin(), pos.end(), 0);
    const std::vector<float> logits = m8.forward(k8, tokens, pos);
    size_t finite = 0;
    for (float v : logits) finite += std::isfinite(v);
    CHECK(finite == logits.size());
}

TEST_CASE("cuda model: SmolLM2 answers the France question as the CPU does", "[gpu_model]") {
    const std::string path = INFOFLOW_MODEL_PATH;
    REQUIRE(file_exists(path));
    Pair b;
    const ModelWeights w = load_model_weights(path);
    GgufFile gguf(path);
    const Tokenizer tok = Tokenizer::from_gguf(gguf);
    const ChatTemplate chat(tok, "auto");
    std::vector<int32_t> prompt = chat.prefix("");
    for (int32_t t : chat.text("What is the capital of France?")) prompt.push_back(t);
    for (int32_t t : chat.suffix_close()) prompt.push_back(t);
    const int n = int(prompt.size());
    std::vector<int32_t> pos(n);
    std::iota(pos.begin(), pos.end(), 0);

    GenerateOptions opt;
    opt.max_new_tokens = 16;
    opt.stop_ids = tok.stop_ids();
    std::vector<int32_t> answer[2];
    std::vector<float> first[2];
    Backend* bes[2] = {b.cpu.get(), b.gpu.get()};
    for (int i = 0; i < 2; ++i) {
        Model m(*bes[i], w);
        KvCache cache = m.make_cache(n + opt.max_new_tokens + 1);
        first[i] = m.forward(cache, prompt, pos);
        answer[i] = generate(m, cache, first[i], n, opt).tokens;
    }
    const std::string text_cpu = tok.decode(answer[0]), text_gpu = tok.decode(answer[1]);
    std::printf("cpu answer: %s\ncuda answer: %s\nfirst-token logits rel err: %.3g\n",
                text_cpu.c_str(), text_gpu.c_str(), rel_err(first[1], first[0]));
    CHECK(text_cpu.find("Paris") != std::string::npos);
    CHECK(answer[1] == answer[0]);
    CHECK(rel_err(first[1], first[0]) <= kTolBf16);
    CHECK(argmax(first[1].data(), int(first[1].size())) ==
          argmax(first[0].data(), int(first[0].size())));
}
