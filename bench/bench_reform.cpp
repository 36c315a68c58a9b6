// REFORM phase 1 (compress: recurrent chunked forward with H2O eviction, retrieval embeddings,
// early exit; docs/reform.md) against an exact prefill (`full`), one measurement per process so
// that the peak resident memory is the measurement's own: the peak is reset after the model is
// loaded (/proc/self/clear_refs) and read after the pass (VmHWM). A human line, then one JSON
// line. bench/reform_memory.sh runs the grid.
//
// Usage: bench_reform --mode reform|h2o|full --length N [--model PATH] [--threads 2]
//                     [--weights native|f32] [--set reform.key=value ...]
// --weights: model.weights (default native, the runtime's default: the file's stored matrices;
// f32 dequantizes the model at load, the reference).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "runtime/config/config.h"
#include "runtime/core/error.h"
#include "runtime/core/memory.h"
#include "runtime/method/reform.h"
#include "runtime/model/model.h"
#include "runtime/model/model_loader.h"

using namespace infoflow;

int main(int argc, char** argv) {
    std::string model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf", mode = "reform";
    std::string weights_kind = "native";
    int length = 16384, threads = 2;
    std::vector<std::string> sets;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "error: %s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--model") {
            model_path = next();
        } else if (a == "--mode") {
            mode = next();
        } else if (a == "--length") {
            length = std::stoi(next());
        } else if (a == "--threads") {
            threads = std::stoi(next());
        } else if (a == "--weights") {
            weights_kind = next();
        } else if (a == "--set") {
            sets.push_back(next());
        } else {
            std::fprintf(stderr,
                         "usage: bench_reform --mode reform|h2o|full --length N [--model PATH] "
                         "[--threads N] [--weights native|f32] [--set reform.key=value]\n");
            return 2;
        }
    }
    try {
        IF_CHECK(mode == "reform" || mode == "h2o" || mode == "full",
                 "--mode must be reform, h2o or full, got '" << mode << "'");
        Config cfg;
        cfg.method.name = mode == "h2o" ? Config::Method::h2o : Config::Method::reform;
        apply_overrides(cfg, sets);
        IF_CHECK(weights_kind == "native" || weights_kind == "f32",
                 "--weights must be native or f32, got '" << weights_kind << "'");
        auto backend = make_cpu_backend(threads);
        LoadOptions lo;
        lo.native_weights = weights_kind == "native" && backend->supports_native_weights();
        const ModelWeights weights = load_model_weights(model_path, lo);
        const ModelConfig& c = weights.config;
        Model model(*backend, weights);
        std::mt19937 rng(1234);
        PreparedRequest req;
        req.chunks.emplace_back();
        for (int i = 0; i < length; ++i)
            req.chunks[0].push_back(int32_t(rng() % uint32_t(c.n_vocab)));
        for (int i = 0; i < 16; ++i) req.suffix.push_back(int32_t(rng() % uint32_t(c.n_vocab)));
        req.question_begin = 2;
        req.question_end = 14;

        const double rss_loaded = current_rss_mib();
        const bool reset = reset_peak_rss();
        const auto t0 = std::chrono::steady_clock::now();
        int peak_slots = 0, layers = c.n_layer;
        double emb_mib = 0.0;
        if (mode == "full") {
            IF_CHECK(length <= c.n_ctx_train,
                     "full: " << length << " tokens exceed the " << c.n_ctx_train << " positions");
            KvCache cache = model.make_cache(length);
            std::vector<int32_t> pos(static_cast<size_t>(length));
            for (int i = 0; i < length; ++i) pos[size_t(i)] = i;
            model.forward(cache, req.chunks[0], pos);
            peak_slots = length;
        } else {
            const RecurrentSpec spec = recurrent_spec(cfg, c);
            layers = spec.n_layers;
            if (mode == "reform") {
                Embeddings q;
                const Embeddings e = reform_compress(model, req, spec, 0, length, &q, &peak_slots);
                emb_mib = double(e.data.size()) * sizeof(float) / (1024.0 * 1024.0);
            } else {
                RecurrentForward rf(model, spec);
                rf.feed_context(req.chunks[0], nullptr);
                peak_slots = rf.peak_slots();
            }
        }
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        const double peak = peak_rss_mib();
        std::printf(
            "%-6s tokens %7d  layers %2d  %9.1f ms  %8.1f tok/s  peak RSS %7.1f MiB "
            "(after load %7.1f MiB%s)  cache slots %d  embeddings %.1f MiB\n",
            mode.c_str(), length, layers, ms, length / (ms / 1000.0), peak, rss_loaded,
            reset ? "" : ", peak not reset: includes the load", peak_slots, emb_mib);
        std::printf(
            "{\"bench\": \"reform_phase1\", \"mode\": \"%s\", \"tokens\": %d, \"layers\": %d, "
            "\"ms\": %.1f, \"peak_rss_mib\": %.1f, \"rss_after_load_mib\": %.1f, "
            "\"peak_reset\": %s, \"cache_slots\": %d, \"embeddings_mib\": %.2f, "
            "\"threads\": %d, \"weights\": \"%s\"}\n",
            mode.c_str(), length, layers, ms, peak, rss_loaded, reset ? "true" : "false",
            peak_slots, emb_mib, threads, weights.has_stored() ? "native" : "f32");
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
