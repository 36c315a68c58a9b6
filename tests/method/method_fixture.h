// Shared fixture of the method tests: a tiny random llama model with sharpened attention (so a
// wrong mask or position changes the logits measurably) and random requests.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "runtime/config/config.h"
#include "runtime/method/pipeline.h"
#include "runtime/method/request.h"
#include "runtime/model/model.h"
#include "runtime/model/model_loader.h"

namespace infoflow::test {

struct TinyModel {
    ModelWeights w;
    std::unique_ptr<Backend> be;
    std::unique_ptr<Model> m;

    explicit TinyModel(const std::string& shape = "tiny", int n_layer = 4, bool llama3 = false) {
        ModelConfig c = random_model_config(shape);
        c.n_layer = n_layer;
        if (llama3) {
            c.rope_theta = 500000.0f;
            c.rope_scaling.type = "llama3";
            c.rope_scaling.factor = 8.0f;
            c.rope_scaling.low_freq_factor = 1.0f;
            c.rope_scaling.high_freq_factor = 4.0f;
            c.rope_scaling.original_context = 64;
        }
        w = make_random_weights(c, 77);
        // Sharpen attention and the residual stream so positions and masks matter.
        for (auto& l : w.layers) {
            for (float& x : l.wq) x *= 6.0f;
            for (float& x : l.wk) x *= 6.0f;
            for (float& x : l.wv) x *= 4.0f;
            for (float& x : l.wo) x *= 4.0f;
        }
        for (float& x : w.tok_embd) x *= 20.0f;
        be = make_cpu_backend(2);
        m = std::make_unique<Model>(*be, w);
    }
};

// chunk 0 of `prefix` tokens, then chunks of the given sizes, then a suffix of `suffix` tokens
// whose question is suffix[1, suffix-2).
inline PreparedRequest random_request(uint32_t seed, int n_vocab, int prefix,
                                      const std::vector<int>& sizes, int suffix, int32_t sink = 1) {
    std::mt19937 rng(seed);
    auto tok = [&]() { return int32_t(3 + rng() % uint32_t(n_vocab - 3)); };
    PreparedRequest r;
    r.chunks.emplace_back();
    for (int i = 0; i < prefix; ++i) r.chunks[0].push_back(tok());
    for (int s : sizes) {
        r.chunks.emplace_back();
        for (int i = 0; i < s; ++i) r.chunks.back().push_back(tok());
    }
    for (int i = 0; i < suffix; ++i) r.suffix.push_back(tok());
    r.question_begin = 1;
    r.question_end = suffix - 2;
    r.sink_id = sink;
    return r;
}

inline Config method_config(Config::Method m, double ratio = 0.15) {
    Config c;
    c.method.name = m;
    c.method.ratio = ratio;
    c.scoring.layers = {1, 2};
    c.decode.max_new_tokens = 4;
    // The cases built on this name the exchange they test (kv unless they set another); the
    // default, "auto", has its own cases (tests/mpi/test_sp.cpp).
    c.parallel.exchange = Config::Exchange::kv;
    return c;
}

// Near-tie text on the real model (docs/design.md §6.4): six passages that each repeat one
// sentence four times (~600 context tokens), so many tokens score almost alike and a rounding
// difference moves tokens across the selection's cut.
inline Config courier_config(const std::string& model_path) {
    Config cfg;
    cfg.model.path = model_path;
    cfg.model.threads = 1;
    cfg.request.system = "You are a helpful assistant. Answer using only the documents.";
    const char* depots[] = {"river", "market", "harbour", "station", "mill", "bridge"};
    for (int i = 1; i <= 6; ++i) {
        const std::string s = "Passage " + std::to_string(i) + ": the courier from district " +
                              std::to_string(i) + " delivered " + std::to_string(40 + 7 * i) +
                              " parcels to the " + depots[i - 1] + " depot on Monday.";
        std::string doc = s;
        for (int r = 1; r < 4; ++r) doc += " " + s;
        cfg.request.documents.push_back(doc);
    }
    cfg.request.question = "How many parcels did the courier from district 5 deliver?";
    cfg.decode.max_new_tokens = 4;
    return cfg;
}

// max |a - b| / max |b|
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
        num = std::max(num, double(std::fabs(a[i] - b[i])));
        den = std::max(den, double(std::fabs(b[i])));
    }
    return a.size() == b.size() ? num / std::max(den, 1e-30) : INFINITY;
}

}  // namespace infoflow::test
