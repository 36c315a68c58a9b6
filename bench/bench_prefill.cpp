// CPU prefill throughput (tokens/s) of the forward pass: one exact causal prefill of n tokens
// at a given thread count, warm-up then the median of N timed runs (nccl-tests style: a human
// table, then one JSON line per measurement). With --decode CTX: decode throughput instead, the
// median over runs of `--gen` single-token steps after a prefill of CTX tokens (each step: all
// layers over the cache and the LM head, as a decoding user sees it). With --batch B1,B2 as well:
// batched decode steps (decode_batch, job serve's step) of B rows, each over its own copy of
// the CTX-token cache, reported per step and per row beside the KV bytes a step reads, the
// floor that memory bandwidth sets on a step of many long contexts.
//
// Usage: bench_prefill [--model PATH|random:smollm2-135m] [--lengths 512,2048,4096]
//                      [--threads 1,2] [--runs 3] [--warmup 1] [--weights native|f32]
//                      [--decode CTX [--gen 64] [--batch 1,4,16]] [--kv-dtype f32|f16|bf16]
//                      [--no-ops]
// --kv-dtype: the KV cache's storage type (model.kv_dtype; f32 default, llama.cpp's default is
// f16).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_features.h"
#include "runtime/core/error.h"
#include "runtime/model/batch_decode.h"
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

int32_t argmax_of(const std::vector<float>& v) {
    return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// B caches, each a copy of one prefill of ctx random tokens (capacity ctx + gen).
std::vector<KvCache> copies_of_prefill(Model& model, int ctx, int gen, int B,
                                       std::vector<float>* logits) {
    const ModelConfig& c = model.config();
    std::mt19937 rng(1234);
    std::vector<int32_t> tokens(ctx), pos(ctx);
    for (int i = 0; i < ctx; ++i) {
        tokens[i] = int32_t(rng() % uint32_t(c.n_vocab));
        pos[i] = i;
    }
    std::vector<KvCache> caches;
    caches.reserve(size_t(B));  // `first` stays where it is
    caches.push_back(model.make_cache(ctx + gen));
    *logits = model.forward(caches[0], tokens, pos);
    const KvCache& first = caches[0];
    std::vector<char> k(size_t(ctx) * first.row_bytes()), v(k.size());
    for (int b = 1; b < B; ++b) {
        caches.push_back(model.make_cache(ctx + gen));
        caches.back().append(ctx, pos.data(), nullptr);
        for (int l = 0; l < c.n_layer; ++l) {
            first.read_range_raw(l, 0, ctx, k.data(), v.data());
            caches.back().write_range_raw(l, 0, ctx, k.data(), v.data());
        }
    }
    return caches;
}

// --decode CTX --batch ...: batched decode steps of B rows over their own CTX-token caches.
int decode_batches(Model& model, int ctx, int gen, const std::vector<int>& batches,
                   const std::vector<int>& threads, int warmup, int runs,
                   const std::string& what) {
    const ModelConfig& c = model.config();
    IF_CHECK(ctx + gen <= c.n_ctx_train, "--decode + --gen exceed the positions");
    const int b_max = *std::max_element(batches.begin(), batches.end());
    std::vector<float> first_logits;
    std::vector<KvCache> caches = copies_of_prefill(model, ctx, gen, b_max, &first_logits);
    const double kv_bytes_row = double(c.n_layer) * 2.0 * caches[0].row_bytes();  // per token
    struct Row {
        int threads, batch;
        double step_ms, lo, hi;
    };
    std::vector<Row> rows;
    for (int t : threads) {
        model.backend().set_threads(t);
        for (int B : batches) {
            std::vector<double> ms;
            for (int r = 0; r < warmup + runs; ++r) {
                for (int b = 0; b < B; ++b) caches[size_t(b)].truncate(ctx);
                std::vector<DecodeRow> drows(static_cast<size_t>(B));
                int32_t tok = argmax_of(first_logits);
                const auto t0 = std::chrono::steady_clock::now();
                for (int g = 0; g < gen; ++g) {
                    for (int b = 0; b < B; ++b) {
                        drows[size_t(b)] = {&caches[size_t(b)], tok, ctx + g, -1};
                    }
                    const std::vector<float> out = decode_batch(model, drows);
                    tok = int32_t(std::max_element(out.begin(), out.begin() + c.n_vocab) -
                                  out.begin());
                }
                const double s =
                    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                              t0)
                        .count();
                if (r >= warmup) ms.push_back(s / gen);
            }
            rows.push_back({t, B, median(ms), *std::min_element(ms.begin(), ms.end()),
                            *std::max_element(ms.begin(), ms.end())});
            std::fprintf(stderr, "  batch=%d threads=%d: %.2f ms/step\n", B, t, rows.back().step_ms);
        }
    }
    std::printf("CPU batched decode steps, %s, %d steps over caches of %d tokens\n", what.c_str(),
                gen, ctx);
    std::printf("%8s %6s %12s %10s %10s %12s %14s\n", "threads", "batch", "ms/step", "min", "max",
                "ms/row", "KV GB/s read");
    for (const Row& r : rows) {
        const double gbs = r.batch * kv_bytes_row * (ctx + gen / 2.0) / (r.step_ms * 1e6);
        std::printf("%8d %6d %12.2f %10.2f %10.2f %12.2f %14.1f\n", r.threads, r.batch, r.step_ms,
                    r.lo, r.hi, r.step_ms / r.batch, gbs);
    }
    for (const Row& r : rows) {
        std::printf(
            "{\"bench\":\"decode_batch\",\"context\":%d,\"gen\":%d,\"threads\":%d,"
            "\"batch\":%d,\"runs\":%d,\"step_ms\":%.3f,\"min\":%.3f,\"max\":%.3f,"
            "\"kv_bytes_per_step\":%.0f}\n",
            ctx, gen, r.threads, r.batch, runs, r.step_ms, r.lo, r.hi,
            r.batch * kv_bytes_row * (ctx + gen / 2.0));
    }
    return 0;
}

// --decode CTX (no --batch): single-token decode steps after a prefill of CTX tokens.
int decode_single(Model& model, int decode_ctx, int gen, const std::vector<int>& threads,
                  int warmup, int runs, const std::string& model_path, const std::string& wlabel,
                  const std::string& kv_name, const std::string& isa) {
    const ModelConfig& c = model.config();
    std::mt19937 rng(1234);
    IF_CHECK(decode_ctx + gen <= c.n_ctx_train, "--decode + --gen exceed the positions");
    std::vector<int32_t> tokens(decode_ctx), pos(decode_ctx);
    for (int i = 0; i < decode_ctx; ++i) {
        tokens[i] = int32_t(rng() % uint32_t(c.n_vocab));
        pos[i] = i;
    }
    struct DRow {
        int threads;
        double med, lo, hi;
    };
    std::vector<DRow> drows;
    for (int t : threads) {
        model.backend().set_threads(t);
        std::vector<double> rates;
        for (int r = 0; r < warmup + runs; ++r) {
            KvCache cache = model.make_cache(decode_ctx + gen);
            std::vector<float> logits = model.forward(cache, tokens, pos);
            const auto t0 = std::chrono::steady_clock::now();
            const Model::DecodeScope decoding(model);  // the runtime's decode kernels
            for (int g = 0; g < gen; ++g) {
                const int32_t next_tok = argmax_of(logits);
                logits = model.forward(cache, {next_tok}, {decode_ctx + g});
            }
            const double s =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                    .count();
            if (r >= warmup) rates.push_back(gen / s);
        }
        drows.push_back({t, median(rates), *std::min_element(rates.begin(), rates.end()),
                         *std::max_element(rates.begin(), rates.end())});
        std::fprintf(stderr, "  decode threads=%d: %.1f tokens/s\n", t, drows.back().med);
    }
    std::printf(
        "CPU decode throughput, %s (%s weights, %s KV cache, cpu %s), %d steps after %d "
        "context tokens\n",
        model_path.c_str(), wlabel.c_str(), kv_name.c_str(), isa.c_str(), gen, decode_ctx);
    std::printf("%8s %12s %12s %12s\n", "threads", "tokens/s", "min", "max");
    for (const DRow& r : drows)
        std::printf("%8d %12.1f %12.1f %12.1f\n", r.threads, r.med, r.lo, r.hi);
    for (const DRow& r : drows) {
        std::printf(
            "{\"bench\":\"decode\",\"model\":\"%s\",\"weights\":\"%s\",\"kv_dtype\":\"%s\","
            "\"isa\":\"%s\",\"context\":%d,\"gen\":%d,\"threads\":%d,\"runs\":%d,"
            "\"tokens_per_s\":%.2f,\"min\":%.2f,\"max\":%.2f}\n",
            model_path.c_str(), wlabel.c_str(), kv_name.c_str(), isa.c_str(), decode_ctx,
            gen, r.threads, runs, r.med, r.lo, r.hi);
    }
    return 0;
}
}  // namespace

int main(int argc, char** argv) {
    std::string model_path = "random:smollm2-135m";
    std::vector<int> lengths = {512, 2048, 4096};
    std::vector<int> threads = {1, 2};
    int runs = 3, warmup = 1;
    std::string weights_mode = "native";
    int decode_ctx = 0, gen = 64;
    std::vector<int> batches;
    std::string kv_name = "f32";
    bool ops = true;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "error: %s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--model")
            model_path = next();
        else if (a == "--lengths")
            lengths = parse_list(next());
        else if (a == "--threads")
            threads = parse_list(next());
        else if (a == "--runs")
            runs = std::stoi(next());
        else if (a == "--warmup")
            warmup = std::stoi(next());
        else if (a == "--weights")
            weights_mode = next();
        else if (a == "--decode")
            decode_ctx = std::stoi(next());
        else if (a == "--gen")
            gen = std::stoi(next());
        else if (a == "--batch")
            batches = parse_list(next());
        else if (a == "--kv-dtype")
            kv_name = next();
        else if (a == "--no-ops")
            ops = false;
        else {
            std::fprintf(stderr,
                         "usage: bench_prefill [--model PATH] [--lengths a,b] "
                         "[--threads a,b] [--runs N] [--warmup N] [--weights native|f32] "
                         "[--decode CTX [--gen N] [--batch a,b]] [--kv-dtype f32|f16|bf16] [--no-ops]\n");
            return 2;
        }
    }
    try {
        IF_CHECK(weights_mode == "native" || weights_mode == "f32",
                 "--weights must be native or f32, not '" << weights_mode << "'");
        IF_CHECK(kv_name == "f32" || kv_name == "f16" || kv_name == "bf16",
                 "--kv-dtype must be f32, f16 or bf16, not '" << kv_name << "'");
        const KvDtype kv = kv_name == "f16"    ? KvDtype::f16
                           : kv_name == "bf16" ? KvDtype::bf16
                                               : KvDtype::f32;
        LoadOptions lo;
        lo.native_weights = weights_mode == "native";
        const ModelWeights weights = load_model_weights(model_path, lo);
        const std::string wlabel = weights.has_stored() ? "native" : "f32";
        const std::string isa = cpu::cpu_isa_summary();
        const ModelConfig& c = weights.config;
        auto backend = make_cpu_backend(1);
        Model model(*backend, weights);
        model.set_kv_dtype(kv);
        std::mt19937 rng(1234);
        if (decode_ctx > 0 && !batches.empty()) {
            return decode_batches(model, decode_ctx, gen, batches, threads, warmup, runs,
                                  model_path + " (" + wlabel + " weights, " + kv_name +
                                      " KV cache, cpu " + isa + ")");
        }
        if (decode_ctx > 0) {
            return decode_single(model, decode_ctx, gen, threads, warmup, runs, model_path, wlabel,
                                 kv_name, isa);
        }
        struct Row {
            int n, threads;
            double ms, tok_s, lo, hi;  // median ms, tokens/s, tokens/s of the slowest/fastest
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
                const double slow = *std::max_element(times.begin(), times.end());
                const double fast = *std::min_element(times.begin(), times.end());
                rows.push_back(
                    {n, t, ms, n / (ms / 1000.0), n / (slow / 1000.0), n / (fast / 1000.0)});
                std::fprintf(stderr, "  n=%d threads=%d: %.1f ms\n", n, t, ms);
            }
        }
        // Where the time goes: the layer's ops timed alone at the largest length, scaled to all
        // layers (matmuls = the seven projections; attention = causal over n keys).
        const int n_big = *std::max_element(lengths.begin(), lengths.end());
        const int t_big = *std::max_element(threads.begin(), threads.end());
        backend->set_threads(t_big);
        if (ops) {
            const int E = c.n_embd, F = c.n_ff, qd = c.n_head * c.head_dim;
            const int kd = c.n_head_kv * c.head_dim;
            std::vector<float> x(size_t(n_big) * std::max(F, E), 0.01f);
            std::vector<float> w(size_t(F) * E, 0.01f), o(size_t(n_big) * F);
            auto time_ms = [&](auto&& fn) {
                fn();
                const auto t0 = std::chrono::steady_clock::now();
                fn();
                return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                                 t0)
                    .count();
            };
            const double mm = time_ms([&] {
                backend->matmul(x.data(), w.data(), nullptr, n_big, E, qd, o.data(), false);
                backend->matmul(x.data(), w.data(), nullptr, n_big, E, kd, o.data(), false);
                backend->matmul(x.data(), w.data(), nullptr, n_big, E, kd, o.data(), false);
                backend->matmul(x.data(), w.data(), nullptr, n_big, qd, E, o.data(), false);
                backend->matmul(x.data(), w.data(), nullptr, n_big, E, F, o.data(), false);
                backend->matmul(x.data(), w.data(), nullptr, n_big, E, F, o.data(), false);
                backend->matmul(x.data(), w.data(), nullptr, n_big, F, E, o.data(), false);
            });
            std::vector<float> q(size_t(n_big) * qd, 0.01f), k(size_t(n_big) * kd, 0.01f);
            std::vector<float> ao(size_t(n_big) * qd);
            std::vector<int32_t> pos(n_big);
            for (int i = 0; i < n_big; ++i) pos[i] = i;
            AttnParams ap;
            ap.q = q.data();
            ap.k = k.data();
            ap.v = k.data();
            ap.q_pos = pos.data();
            ap.k_pos = pos.data();
            ap.n_q = n_big;
            ap.n_kv = n_big;
            ap.n_head = c.n_head;
            ap.n_head_kv = c.n_head_kv;
            ap.head_dim = c.head_dim;
            ap.out = ao.data();
            const double at = time_ms([&] { backend->attention(ap); });
            const double lin_flop =
                2.0 * n_big * (double(E) * (qd + 2 * kd) + double(qd) * E + 3.0 * E * F);
            const double att_flop = 4.0 * c.n_head * c.head_dim * double(n_big) * n_big / 2;
            std::printf("\nwhere the time goes at %d tokens, %d threads (one layer's ops alone):\n",
                        n_big, t_big);
            std::printf("  matmuls   %8.1f ms/layer  %6.1f GFLOP/s  x%d layers = %8.1f ms\n", mm,
                        lin_flop / mm / 1e6, c.n_layer, mm * c.n_layer);
            std::printf("  attention %8.1f ms/layer  %6.1f GFLOP/s  x%d layers = %8.1f ms\n", at,
                        att_flop / at / 1e6, c.n_layer, at * c.n_layer);
            std::printf(
                "{\"bench\":\"prefill_ops\",\"tokens\":%d,\"threads\":%d,"
                "\"matmul_ms_per_layer\":%.3f,\"matmul_gflops\":%.2f,"
                "\"attention_ms_per_layer\":%.3f,\"attention_gflops\":%.2f}\n",
                n_big, t_big, mm, lin_flop / mm / 1e6, at, att_flop / at / 1e6);
        }
        std::printf(
            "\nCPU prefill throughput, %s (%s weights, cpu %s, fp32 activations, exact "
            "causal, logits of the last row)\n",
            model_path.c_str(), wlabel.c_str(), isa.c_str());
        std::printf("%8s %8s %12s %12s %10s %10s\n", "tokens", "threads", "median ms", "tokens/s",
                    "min", "max");
        for (const Row& r : rows) {
            std::printf("%8d %8d %12.1f %12.1f %10.1f %10.1f\n", r.n, r.threads, r.ms, r.tok_s,
                        r.lo, r.hi);
        }
        for (const Row& r : rows) {
            std::printf(
                "{\"bench\":\"prefill\",\"model\":\"%s\",\"weights\":\"%s\",\"isa\":\"%s\","
                "\"tokens\":%d,\"threads\":%d,\"runs\":%d,\"median_ms\":%.3f,"
                "\"tokens_per_s\":%.2f,\"min\":%.2f,\"max\":%.2f}\n",
                model_path.c_str(), wlabel.c_str(), isa.c_str(), r.n, r.threads, runs, r.ms,
                r.tok_s, r.lo, r.hi);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
