// What each CPU kernel path does to a request's numbers (docs/design.md §6, "Numerics per CPU
// path"): the same requests run through cfg's method on the fp32 reference (the avx512 exact pass)
// and on each candidate numerics for the amx path, compared on the first-token distribution (KL
// of the reference to the candidate, in nats; top-1 agreement), the greedy answer and the
// recomputed set (Jaccard). Candidates:
//   amx            bf16 tiles for every exact-pass product and for Q·Kᵀ (cpu.isa = amx)
//   amx-gemm       bf16 tiles for the products only, attention in fp32
//   amx-attention  bf16 tiles for Q·Kᵀ only, the products in the fp32 exact pass
//   int8           every product with 8-bit activations (per 32-element block scales) and the
//                  stored weight codes, as int8 tiles (and llama.cpp's quantized path) compute
//                  them: the fused dot products of decode steps, used for every pass
// On a CPU without AMX the tile candidates run on the emulator (INFOFLOW_AMX_EMULATE=1, set
// here): the same numbers, so the comparison holds, but their times are no measure of speed.
// Requests (run from the repository root): the demo's documents and question (configs/demo.toml),
// "What is the capital of France?" (no documents), then
// --cases cases of the config's [sweep] generator (case indices --first-case onwards, every case
// kept).
//
// Usage: bench_cpu_paths --config FILE [--set key=value ...] [--cases 100] [--first-case 0]
//                        [--candidates amx,amx-gemm,amx-attention,int8] [--out FILE.jsonl]
// Prints a table (mean and max KL, top-1 and answer agreement, mean and min Jaccard, ms per
// request) and one JSON line per candidate; --out writes one JSON line per request and
// candidate.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "runtime/config/config.h"
#include "runtime/core/error.h"
#include "runtime/jobs/cases.h"
#include "runtime/jobs/jobs.h"
#include "runtime/jobs/session.h"
#include "runtime/method/request.h"

using namespace infoflow;
using Clock = std::chrono::steady_clock;

namespace {

struct Request {
    std::string name;
    PreparedRequest req;
};

struct Outcome {
    std::vector<float> first;
    std::vector<int32_t> answer;
    std::vector<int32_t> selected;
    double ms = 0.0;
};

double kl_nats(const std::vector<float>& p_logits, const std::vector<float>& q_logits) {
    auto log_softmax = [](const std::vector<float>& z) {
        const double m = *std::max_element(z.begin(), z.end());
        double s = 0.0;
        for (float v : z) s += std::exp(double(v) - m);
        const double lse = m + std::log(s);
        std::vector<double> out(z.size());
        for (size_t i = 0; i < z.size(); ++i) out[i] = double(z[i]) - lse;
        return out;
    };
    const std::vector<double> lp = log_softmax(p_logits), lq = log_softmax(q_logits);
    double kl = 0.0;
    for (size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
    return std::max(0.0, kl);
}

double jaccard(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    const std::set<int32_t> sa(a.begin(), a.end()), sb(b.begin(), b.end());
    if (sa.empty() && sb.empty()) return 1.0;
    size_t inter = 0;
    for (int32_t x : sa) inter += sb.count(x);
    return double(inter) / double(sa.size() + sb.size() - inter);
}

int argmax(const std::vector<float>& v) {
    return int(std::max_element(v.begin(), v.end()) - v.begin());
}

// One run of the request on a candidate's numerics.
Outcome run_on(Session& s, const Config& cfg, const PreparedRequest& req, const std::string& c) {
    if (c == "fp32" || c == "int8") {
        cpu::set_cpu_isa_override("avx512");
    } else {
        cpu::set_cpu_isa_override("amx");
        cpu::set_amx_tiles(c == "amx" ? "" : c == "amx-gemm" ? "gemm" : "attention");
    }
    const auto t0 = Clock::now();
    MethodResult r;
    if (c == "int8") {
        const Model::DecodeScope every_pass_as_decode(*s.model);
        r = run_method(*s.model, req, cfg, s.tok().stop_ids());
    } else {
        r = run_method(*s.model, req, cfg, s.tok().stop_ids());
    }
    Outcome o;
    o.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    o.first = r.first_logits;
    o.answer = r.answer;
    o.selected = r.selected_positions;
    return o;
}

std::vector<Request> requests(Session& s, const Config& cfg, int n_cases, int first_case) {
    const Tokenizer& tok = s.tok();
    const ChatTemplate& chat = s.chat_template();
    std::vector<Request> out;
    // The demo's documents and question (configs/demo.toml), under cfg's method.
    const Config demo = load_config("configs/demo.toml");
    out.push_back({"demo", prepare_request(tok, chat, load_request_text(demo.request), cfg)});
    out.push_back(
        {"france",
         prepare_request(tok, chat, RequestText{"", {}, "What is the capital of France?"}, cfg)});
    if (n_cases > 0) {
        const CaseSpec spec =
            sweep_case_spec(cfg, instruction_text(cfg.request.prompt_template).doc_separator);
        const TokenCounter count = [&](const std::string& t) { return int(chat.text(t).size()); };
        for (int i = first_case; i < first_case + n_cases; ++i) {
            const QualityCase qc = make_case(spec, i, count);
            out.push_back(
                {"case " + std::to_string(i),
                 prepare_request(tok, chat,
                                 RequestText{cfg.request.system, qc.documents, qc.question}, cfg)});
        }
    }
    return out;
}

struct Tally {
    std::vector<double> kl, jac, ms;
    int top1 = 0, answer = 0, n = 0;
};

// The table (mean, p95 and max KL, agreement, Jaccard, ms per request) and one JSON line per
// candidate.
void print_summary(const std::vector<std::string>& candidates,
                   std::map<std::string, Tally>& tally) {
    std::printf("%-14s %5s %10s %10s %10s %7s %7s %8s %8s %9s\n", "candidate", "n", "mean KL",
                "p95 KL", "max KL", "top-1", "answer", "mean J", "min J", "ms/req");
    for (const std::string& c : candidates) {
        Tally& t = tally[c];
        std::vector<double> kl = t.kl;
        std::sort(kl.begin(), kl.end());
        double mean = 0.0, jm = 0.0, ms = 0.0;
        for (double v : t.kl) mean += v / t.n;
        for (double v : t.jac) jm += v / t.n;
        for (double v : t.ms) ms += v / t.n;
        const double p95 = kl[std::min(kl.size() - 1, size_t(std::ceil(0.95 * kl.size())) - 1)];
        const double jmin = *std::min_element(t.jac.begin(), t.jac.end());
        std::printf("%-14s %5d %10.6f %10.6f %10.6f %7.3f %7.3f %8.4f %8.4f %9.1f\n", c.c_str(),
                    t.n, mean, p95, kl.back(), double(t.top1) / t.n, double(t.answer) / t.n, jm,
                    jmin, ms);
    }
    for (const std::string& c : candidates) {
        Tally& t = tally[c];
        double mean = 0.0;
        for (double v : t.kl) mean += v / t.n;
        std::printf(
            "{\"bench\":\"cpu_paths\",\"candidate\":\"%s\",\"requests\":%d,\"mean_first_kl\":%.8f,"
            "\"max_first_kl\":%.8f,\"top1_agree\":%.4f,\"answer_agree\":%.4f,\"tiles\":\"%s\"}\n",
            c.c_str(), t.n, mean, *std::max_element(t.kl.begin(), t.kl.end()), double(t.top1) / t.n,
            double(t.answer) / t.n, cpu::cpu_has_amx() ? "amx" : "emulated");
    }
}

}  // namespace

int run(int argc, char** argv);

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_cpu_paths: error: %s\n", e.what());
        return 1;
    }
}

int run(int argc, char** argv) {
    std::string config_path, out_path;
    std::vector<std::string> sets;
    std::vector<std::string> candidates = {"amx", "amx-gemm", "amx-attention", "int8"};
    int n_cases = 100, first_case = 0;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) throw Error(a + " needs a value");
            return argv[++i];
        };
        if (a == "--config") {
            config_path = next();
        } else if (a == "--set") {
            sets.push_back(next());
        } else if (a == "--cases") {
            n_cases = std::stoi(next());
        } else if (a == "--first-case") {
            first_case = std::stoi(next());
        } else if (a == "--candidates") {
            candidates.clear();
            std::stringstream ss(next());
            for (std::string c; std::getline(ss, c, ',');) candidates.push_back(c);
        } else if (a == "--out") {
            out_path = next();
        } else {
            std::fprintf(stderr,
                         "usage: bench_cpu_paths --config FILE [--set key=value ...] [--cases N] "
                         "[--first-case I] [--candidates amx,amx-gemm,amx-attention,int8] "
                         "[--out FILE.jsonl]\n");
            return 2;
        }
    }
    for (const std::string& c : candidates) {
        IF_CHECK(c == "amx" || c == "amx-gemm" || c == "amx-attention" || c == "int8",
                 "unknown candidate '" << c << "' (amx, amx-gemm, amx-attention, int8)");
    }
    IF_CHECK(!config_path.empty(), "--config FILE is required");
    IF_CHECK(cpu::cpu_has_avx512(), "the reference and the amx candidates need AVX-512");
    if (!cpu::cpu_has_amx()) setenv("INFOFLOW_AMX_EMULATE", "1", 1);
    const Config cfg = load_config(config_path, sets);
    const std::unique_ptr<Session> s = open_session(cfg);
    const std::vector<Request> reqs = requests(*s, cfg, n_cases, first_case);
    std::ofstream out;
    if (!out_path.empty()) out.open(out_path);
    std::printf(
        "CPU paths on %s, method %s, %zu requests; reference: the fp32 exact pass "
        "(avx512); tiles: %s\n",
        s->weights->source.c_str(), to_string(cfg.method.name), reqs.size(),
        cpu::cpu_has_amx() ? "the CPU's" : "emulated (times are no measure of speed)");
    std::map<std::string, Tally> tally;
    for (const Request& r : reqs) {
        const Outcome ref = run_on(*s, cfg, r.req, "fp32");
        for (const std::string& c : candidates) {
            const Outcome o = run_on(*s, cfg, r.req, c);
            Tally& t = tally[c];
            const double kl = kl_nats(ref.first, o.first);
            const bool top1 = argmax(ref.first) == argmax(o.first);
            const bool same = ref.answer == o.answer;
            const double jac = jaccard(ref.selected, o.selected);
            t.kl.push_back(kl);
            t.jac.push_back(jac);
            t.ms.push_back(o.ms);
            t.top1 += top1;
            t.answer += same;
            ++t.n;
            if (out.is_open()) {
                out << "{\"request\":\"" << r.name << "\",\"candidate\":\"" << c
                    << "\",\"context_tokens\":" << r.req.context_tokens() << ",\"first_kl\":" << kl
                    << ",\"top1_agree\":" << (top1 ? "true" : "false")
                    << ",\"answer_agree\":" << (same ? "true" : "false") << ",\"jaccard\":" << jac
                    << ",\"ms\":" << o.ms << ",\"ref_ms\":" << ref.ms << "}\n";
                out.flush();
            }
        }
        std::fprintf(stderr, "[bench_cpu_paths] %s (%d tokens) done\n", r.name.c_str(),
                     r.req.context_tokens());
    }
    cpu::set_amx_tiles("");
    print_summary(candidates, tally);
    return 0;
}
