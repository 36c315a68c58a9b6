// CPU prefill throughput (tokens/s) of the forward pass: one exact causal prefill of n tokens
// at a given thread count, warm-up then the median of N timed runs (nccl-tests style: a human
// table, then one JSON line per measurement).
//
// Usage: bench_prefill [--model PATH|random:smollm2-135m] [--lengths 512,2048,4096]
//                      [--threads 1,2] [--runs 3] [--warmup 1]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "runtime/core/error.h"
#include "runtime/model/model.h"
#include "runtime/model/model_loader.h"

using namespace infoflow;

namespace {

std::vector<int> parse_list(const std::string& s) {
    std::vector<int> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) out.push_back(std::stoi(item));
    return out;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
    std::string model_path = "random:smollm2-135m";
    std::vector<int> lengths = {512, 2048, 4096};
    std::vector<int> threads = {1, 2};
    int runs = 3, warmup = 1;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "error: %s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--model") model_path = next();
        else if (a == "--lengths") lengths = parse_list(next());
        else if (a == "--threads") threads = parse_list(next());
        else if (a == "--runs") runs = std::stoi(next());
        else if (a == "--warmup") warmup = std::stoi(next());
        else {
            std::fprintf(stderr, "usage: bench_prefill [--model PATH] [--lengths a,b] "
                                 "[--threads a,b] [--runs N] [--warmup N]\n");
            return 2;
        }
    }
    try {
        const ModelWeights weights = load_model_weights(model_path);
        const ModelConfig& c = weights.config;
        auto backend = make_cpu_backend(1);
        Model model(*backend, weights);
        std::mt19937 rng(1234);
        struct Row {
            int n, threads;
            double ms, tok_s;
        };
        std::vector<Row> rows;
        for (int n : lengths) {
            IF_CHECK(n <= c.n_ctx_train, "length " << n << " exceeds the model's positions");
            std::vector<int32_t> tokens(n), pos(n);
            for (int i = 0; i < n; ++i) {
                tokens[i] = int32_t(rng() % uint32_t(c.n_vocab));
                pos[i] = i;
            }
            for (int t : threads) {
                backend->set_threads(t);
                std::vector<double> times;
                for (int r = 0; r < warmup + runs; ++r) {
                    KvCache cache = model.make_cache(n);
                    const auto t0 = std::chrono::steady_clock::now();
                    model.forward(cache, tokens, pos);
                    const double ms = std::chrono::duration<double, std::milli>(
                                          std::chrono::steady_clock::now() - t0)
                                          .count();
                    if (r >= warmup) times.push_back(ms);
                }
                const double ms = median(times);
                rows.push_back({n, t, ms, n / (ms / 1000.0)});
                std::fprintf(stderr, "  n=%d threads=%d: %.1f ms\n", n, t, ms);
            }
        }
        std::printf("\nCPU prefill throughput, %s (fp32, exact causal, logits of the last row)\n",
                    model_path.c_str());
        std::printf("%8s %8s %12s %12s\n", "tokens", "threads", "median ms", "tokens/s");
        for (const Row& r : rows) {
            std::printf("%8d %8d %12.1f %12.1f\n", r.n, r.threads, r.ms, r.tok_s);
        }
        for (const Row& r : rows) {
            std::printf("{\"bench\":\"prefill\",\"model\":\"%s\",\"tokens\":%d,\"threads\":%d,"
                        "\"runs\":%d,\"median_ms\":%.3f,\"tokens_per_s\":%.2f}\n",
                        model_path.c_str(), r.n, r.threads, runs, r.ms, r.tok_s);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
