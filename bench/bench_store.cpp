// The document KV store's benchmark (docs/design.md §8, §10): TTFT of InfoFlow with every document
// cached vs prefilled, store bytes per token, load throughput, and Q questions over the same
// documents with and without the store (the store's build time counted in). Runs on 1 rank, or
// on P ranks under mpirun (each rank loads its own shard). Requests are synthetic token ids
// (speed does not depend on them) in the layout of bench-ttft: a 32-token prefix, fixed chunks,
// a 24-token suffix. Warm-up, then the median (and min..max) of N runs; a human table, then one
// JSON line per measurement (nccl-tests style).
//
// Usage: [mpirun -np 2] bench_store [--model random:smollm2-135m] [--lengths 2048,4096,8192]
//          [--chunk 1024] [--threads 1] [--runs 3] [--warmup 1] [--dtype f16|bf16|f32]
//          [--questions 10] [--questions-length 4096] [--write PREFIX]
// --write PREFIX (rank 0): also writes PREFIX.md (the table) and PREFIX.jsonl (the JSON lines);
// without it nothing is written outside a temp folder.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/method/chunk_store.h"
#include "runtime/model/model_loader.h"
#include "runtime/parallel/run.h"
#include "runtime/store/kv_store.h"

using namespace infoflow;

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::vector<int> parse_list(const std::string& s) {
    std::vector<int> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) out.push_back(std::stoi(item));
    return out;
}

struct Spread {
    double median = 0, min = 0, max = 0;
};
Spread spread(std::vector<double> v) {
    Spread s;
    if (v.empty()) return s;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    s.min = v.front();
    s.max = v.back();
    return s;
}

// `tokens` = the whole prompt (prefix + context + suffix), as bench-ttft counts it. The context
// (the documents) depends on `doc_seed` only, the suffix (the question) on `question_seed`.
PreparedRequest synthetic_request(int tokens, int n_vocab, int chunk, uint64_t doc_seed,
                                  uint64_t question_seed) {
    std::mt19937_64 rng(doc_seed);
    auto tok = [&]() { return int32_t(16 + rng() % uint64_t(n_vocab - 16)); };
    const int prefix = 32, suffix = 24;
    PreparedRequest r;
    r.chunks.emplace_back();
    for (int i = 0; i < prefix; ++i) r.chunks[0].push_back(tok());
    const int ctx = std::max(1, tokens - prefix - suffix);
    for (int at = 0; at < ctx; at += chunk) {
        r.chunks.emplace_back();
        for (int i = at; i < std::min(ctx, at + chunk); ++i) r.chunks.back().push_back(tok());
    }
    rng.seed(question_seed);
    for (int i = 0; i < suffix; ++i) r.suffix.push_back(tok());
    r.question_begin = 4;
    r.question_end = suffix - 6;
    r.sink_id = 1;
    return r;
}

// A folder chosen by rank 0, the same path on every rank.
std::string shared_temp_dir(Communicator& comm) {
    char buf[256] = {0};
    if (comm.rank() == 0) {
        std::string t = std::filesystem::temp_directory_path().string() + "/bench_store_XXXXXX";
        IF_CHECK(mkdtemp(&t[0]) != nullptr, "cannot create a temp folder");
        std::strncpy(buf, t.c_str(), sizeof(buf) - 1);
    }
    comm.broadcast(buf, sizeof(buf), 0);
    return buf;
}

// cache-build's split: chunk i by rank (i - 1) mod P. Returns the wall time (ms, max over ranks).
double build_store(Model& m, const PreparedRequest& req, const Config& cfg, Communicator& comm) {
    comm.barrier();
    const auto t0 = Clock::now();
    auto store = open_store_for(m, req.tokenizer_hash, cfg, true);
    const std::string label = chunking_label(cfg);
    for (int ci = 1; ci < req.n_chunks(); ++ci) {
        if ((ci - 1) % comm.size() != comm.rank()) continue;
        const ChunkKv kv = prefill_chunk(m, req.chunks[ci], req.sink_id);
        const StoredChunk s =
            to_stored(m, kv, req.sink_id, document_key(req.chunks[ci], req.sink_id, label), label);
        store->add({&s});
    }
    comm.barrier();
    double t = ms_since(t0);
    comm.all_reduce(&t, 1, DType::f64, ReduceOp::max);
    return t;
}

double phase_ms(const MethodResult& r, const std::string& name) {
    double ms = 0.0;  // the slowest rank's time in the phase
    for (size_t i = 0; i < r.phases.size(); ++i) {
        if (r.phases[i].name != name) continue;
        if (i < r.phases_per_rank.size()) {
            for (const PhaseTime& p : r.phases_per_rank[i]) ms = std::max(ms, p.ms);
        } else {
            ms = std::max(ms, r.phases[i].ms);
        }
    }
    return ms;
}

struct Timed {
    Spread ttft, load;
    double bytes_loaded = 0;
    int tokens_loaded = 0;
};

Timed time_runs(Model& m, const PreparedRequest& req, const Config& cfg, Communicator& comm,
                int warmup, int runs) {
    Timed out;
    std::vector<double> ttft, load;
    for (int run = 0; run < warmup + runs; ++run) {
        comm.barrier();
        const MethodResult r = run_request(m, req, cfg, comm, {});
        double t[2] = {r.ttft_ms, phase_ms(r, "store_load")};
        comm.broadcast(t, sizeof(t), 0);
        if (run < warmup) continue;
        ttft.push_back(t[0]);
        load.push_back(t[1]);
        out.bytes_loaded = double(r.store_bytes);
        out.tokens_loaded = r.store_tokens;
    }
    out.ttft = spread(ttft);
    out.load = spread(load);
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    std::unique_ptr<CommEnv> env;
    try {
        env = init_comm(&argc, &argv, "auto");
        std::unique_ptr<Communicator> comm = make_communicator("auto");
        const int P = comm->size();
        const bool root = comm->rank() == 0;
        std::string model_path = "random:smollm2-135m", dtype = "f16", write_prefix;
        std::vector<int> lengths = {2048, 4096, 8192};
        int chunk = 1024, threads = 1, runs = 3, warmup = 1, questions = 10, q_length = 4096;
        for (int i = 1; i < argc; ++i) {
            const std::string a = argv[i];
            auto next = [&]() -> std::string {
                IF_CHECK(i + 1 < argc, a << " needs a value");
                return argv[++i];
            };
            if (a == "--model")
                model_path = next();
            else if (a == "--lengths")
                lengths = parse_list(next());
            else if (a == "--chunk")
                chunk = std::stoi(next());
            else if (a == "--threads")
                threads = std::stoi(next());
            else if (a == "--runs")
                runs = std::stoi(next());
            else if (a == "--warmup")
                warmup = std::stoi(next());
            else if (a == "--dtype")
                dtype = next();
            else if (a == "--questions")
                questions = std::stoi(next());
            else if (a == "--questions-length")
                q_length = std::stoi(next());
            else if (a == "--write")
                write_prefix = next();
            else
                IF_FAIL("unknown argument " << a);
        }
        const ModelWeights w = load_model_weights(model_path);
        auto be = make_cpu_backend(threads);
        Model m(*be, w);
        const std::string dir = shared_temp_dir(*comm);

        Config base;
        base.method.name = Config::Method::infoflow;
        base.method.ratio = 0.15;
        base.decode.max_new_tokens = 1;
        base.chunking.mode = Config::ChunkMode::fixed;
        base.chunking.size = chunk;
        base.store.dtype = dtype == "f32"    ? Config::StoreDType::f32
                           : dtype == "bf16" ? Config::StoreDType::bf16
                                             : Config::StoreDType::f16;
        base.store.mode = Config::StoreMode::read;

        std::vector<std::string> table, json;
        char line[512];
        std::snprintf(line, sizeof(line),
                      "KV store: TTFT of infoflow, every document cached vs prefilled (%s, %d "
                      "rank%s x %d thread%s, %s store, %d-token chunks, median of %d, min..max)",
                      model_path.c_str(), P, P > 1 ? "s" : "", threads, threads > 1 ? "s" : "",
                      dtype.c_str(), chunk, runs);
        table.push_back(line);
        std::snprintf(line, sizeof(line), "%7s %5s %22s %22s %7s %9s %11s %10s %8s", "tokens",
                      "ranks", "uncached TTFT ms", "cached TTFT ms", "ratio", "load ms",
                      "load MB/s", "bytes/tok", "build s");
        table.push_back(line);
        for (int tokens : lengths) {
            const PreparedRequest req =
                synthetic_request(tokens, w.config.n_vocab, chunk, 1000 + tokens, 7);
            Config cfg = base;
            cfg.store.path = dir + "/docs" + std::to_string(tokens) + ".h5";
            const double build_ms = build_store(m, req, cfg, *comm);
            Config plain = base;
            const Timed un = time_runs(m, req, plain, *comm, warmup, runs);
            const Timed ca = time_runs(m, req, cfg, *comm, warmup, runs);
            const double ratio = ca.ttft.median / un.ttft.median;
            const double per_tok = ca.tokens_loaded ? ca.bytes_loaded / ca.tokens_loaded : 0.0;
            const double mbps =
                ca.load.median > 0 ? ca.bytes_loaded / 1e6 / (ca.load.median / 1e3) : 0.0;
            char un_s[64], ca_s[64];
            std::snprintf(un_s, sizeof(un_s), "%.0f (%.0f..%.0f)", un.ttft.median, un.ttft.min,
                          un.ttft.max);
            std::snprintf(ca_s, sizeof(ca_s), "%.0f (%.0f..%.0f)", ca.ttft.median, ca.ttft.min,
                          ca.ttft.max);
            std::snprintf(line, sizeof(line), "%7d %5d %22s %22s %6.3fx %9.1f %11.1f %10.0f %8.1f",
                          tokens, P, un_s, ca_s, ratio, ca.load.median, mbps, per_tok,
                          build_ms / 1e3);
            table.push_back(line);
            std::snprintf(
                line, sizeof(line),
                "{\"bench\":\"store_ttft\",\"model\":\"%s\",\"tokens\":%d,\"ranks\":%d,"
                "\"threads\":%d,\"dtype\":\"%s\",\"chunk\":%d,\"runs\":%d,"
                "\"uncached_ttft_ms\":{\"median\":%.1f,\"min\":%.1f,\"max\":%.1f},"
                "\"cached_ttft_ms\":{\"median\":%.1f,\"min\":%.1f,\"max\":%.1f},\"ratio\":%.4f,"
                "\"store_load_ms\":%.1f,\"tokens_from_store\":%d,\"bytes_loaded\":%.0f,"
                "\"bytes_per_token\":%.1f,\"load_mb_per_s\":%.1f,\"build_ms\":%.1f}",
                model_path.c_str(), tokens, P, threads, dtype.c_str(), chunk, runs, un.ttft.median,
                un.ttft.min, un.ttft.max, ca.ttft.median, ca.ttft.min, ca.ttft.max, ratio,
                ca.load.median, ca.tokens_loaded, ca.bytes_loaded, per_tok, mbps, build_ms);
            json.push_back(line);
            if (root) {
                std::printf("%s\n", table.back().c_str());
                std::fflush(stdout);
            }
        }

        // Q questions over the same documents: without the store every question prefills them;
        // with it they are prefilled once (the build, counted in) and loaded Q times.
        if (questions > 0) {
            Config cfg = base;
            cfg.store.path = dir + "/questions.h5";
            const PreparedRequest docs =
                synthetic_request(q_length, w.config.n_vocab, chunk, 99, 0);
            const double build_ms = build_store(m, docs, cfg, *comm);
            double without = 0.0, with = 0.0;
            std::vector<double> per_un, per_ca;
            for (int q = 0; q < questions; ++q) {
                const PreparedRequest req =
                    synthetic_request(q_length, w.config.n_vocab, chunk, 99, 500 + q);
                for (int use = 0; use < 2; ++use) {
                    Config c = use ? cfg : base;
                    comm->barrier();
                    const auto t0 = Clock::now();
                    run_request(m, req, c, *comm, {});
                    comm->barrier();
                    double t = ms_since(t0);
                    comm->all_reduce(&t, 1, DType::f64, ReduceOp::max);
                    (use ? with : without) += t;
                    (use ? per_ca : per_un).push_back(t);
                }
            }
            const Spread su = spread(per_un), sc = spread(per_ca);
            const double ratio = (with + build_ms) / without;
            table.push_back("");
            std::snprintf(line, sizeof(line),
                          "%d questions over the same %d-token documents, %d rank%s: without the "
                          "store %.1f s (per question %.0f ms, %.0f..%.0f); with it %.1f s = build "
                          "%.1f s + %.1f s (per question %.0f ms, %.0f..%.0f); ratio %.3fx",
                          questions, q_length, P, P > 1 ? "s" : "", without / 1e3, su.median,
                          su.min, su.max, (with + build_ms) / 1e3, build_ms / 1e3, with / 1e3,
                          sc.median, sc.min, sc.max, ratio);
            table.push_back(line);
            if (root) std::printf("\n%s\n", line);
            std::snprintf(line, sizeof(line),
                          "{\"bench\":\"store_questions\",\"model\":\"%s\",\"tokens\":%d,"
                          "\"ranks\":%d,\"threads\":%d,\"dtype\":\"%s\",\"questions\":%d,"
                          "\"without_ms\":%.1f,\"with_ms\":%.1f,\"build_ms\":%.1f,"
                          "\"per_question_without_ms\":%.1f,\"per_question_with_ms\":%.1f,"
                          "\"ratio\":%.4f}",
                          model_path.c_str(), q_length, P, threads, dtype.c_str(), questions,
                          without, with + build_ms, build_ms, su.median, sc.median, ratio);
            json.push_back(line);
        }
        if (root) {
            for (const auto& j : json) std::printf("%s\n", j.c_str());
            if (!write_prefix.empty()) {
                std::ofstream md(write_prefix + ".md"), jl(write_prefix + ".jsonl");
                md << "```\n";
                for (const auto& t : table) md << t << "\n";
                md << "```\n";
                for (const auto& j : json) jl << j << "\n";
                IF_CHECK(md.good() && jl.good(), "cannot write " << write_prefix << ".md/.jsonl");
                std::printf("results    : %s.md, %s.jsonl\n", write_prefix.c_str(),
                            write_prefix.c_str());
            }
        }
        comm->barrier();
        if (root) std::filesystem::remove_all(dir);
    } catch (const std::exception& e) {
        abort_job(e.what());
    }
    return 0;
}
