// CPU attention kernel throughput (kernels/cpu/attention_cpu.h) per ISA path and KV storage type,
// on the SmolLM2-135M head shape (9 query heads, 3 KV heads, head_dim 64): warm-up, then the
// median (and min/max) of N runs, the paths interleaved run by run so that a loaded machine
// slows them alike. Besides wall time, the process CPU time of each call is reported: on a
// machine shared with other jobs it moves far less than the wall time. A human table, then one
// JSON line per measurement.
//
// Usage: bench_attention [--threads N] [--runs N] [--warmup N]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/attention_cpu.h"
#include "kernels/cpu/cpu_features.h"
#include "runtime/core/half.h"

using namespace infoflow;
using infoflow::cpu::CpuIsa;

namespace {

struct Shape {
    const char* name;
    int n_q, n_kv;
    bool runs;  // keys: a sorted shard, then sorted appended keys (a recompute cache)
};

struct Inputs {
    std::vector<float> q, k, v, out, lse;
    std::vector<uint16_t> k16, v16, kb16, vb16;
    std::vector<int32_t> q_pos, k_pos;
    double visible_pairs = 0;  // (query, key) pairs under the mask
};

constexpr int kHead = 9, kHeadKv = 3, kDim = 64;

Inputs make(const Shape& s) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    Inputs in;
    const size_t row = size_t(kHeadKv) * kDim;
    in.q.resize(size_t(s.n_q) * kHead * kDim);
    for (float& x : in.q) x = u(rng);
    in.k.resize(size_t(s.n_kv) * row);
    in.v.resize(in.k.size());
    for (float& x : in.k) x = u(rng);
    for (float& x : in.v) x = u(rng);
    for (size_t i = 0; i < in.k.size(); ++i) {
        in.k16.push_back(fp32_to_fp16(in.k[i]));
        in.v16.push_back(fp32_to_fp16(in.v[i]));
        in.kb16.push_back(fp32_to_bf16(in.k[i]));
        in.vb16.push_back(fp32_to_bf16(in.v[i]));
    }
    in.out.resize(in.q.size());
    in.lse.resize(size_t(s.n_q) * kHead);
    in.k_pos.resize(s.n_kv);
    in.q_pos.resize(s.n_q);
    if (s.runs) {  // shard [n_kv/2 .. n_kv), then every other earlier position; queries: shard
        const int half = s.n_kv / 2;
        for (int j = 0; j < half; ++j) in.k_pos[j] = s.n_kv + j;
        for (int j = half; j < s.n_kv; ++j) in.k_pos[j] = 2 * (j - half);
        for (int i = 0; i < s.n_q; ++i) in.q_pos[i] = s.n_kv + int(int64_t(i) * half / s.n_q);
    } else {  // causal: the queries are the last n_q keys
        for (int j = 0; j < s.n_kv; ++j) in.k_pos[j] = j;
        for (int i = 0; i < s.n_q; ++i) in.q_pos[i] = s.n_kv - s.n_q + i;
    }
    for (int i = 0; i < s.n_q; ++i)
        for (int j = 0; j < s.n_kv; ++j) in.visible_pairs += in.k_pos[j] <= in.q_pos[i];
    return in;
}

AttnParams params(Inputs& in, const Shape& s, KvDtype t) {
    AttnParams p;
    p.q = in.q.data();
    p.q_pos = in.q_pos.data();
    p.k_pos = in.k_pos.data();
    p.n_q = s.n_q;
    p.n_kv = s.n_kv;
    p.n_head = kHead;
    p.n_head_kv = kHeadKv;
    p.head_dim = kDim;
    p.out = in.out.data();
    p.lse = in.lse.data();
    p.kv_dtype = t;
    if (t == KvDtype::f32) {
        p.k = in.k.data();
        p.v = in.v.data();
    } else {
        p.k16 = t == KvDtype::f16 ? in.k16.data() : in.kb16.data();
        p.v16 = t == KvDtype::f16 ? in.v16.data() : in.vb16.data();
    }
    return p;
}

double cpu_ms() {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) * 1e3 + double(t.tv_nsec) / 1e6;
}

double median_of(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
    int threads = 2, runs = 5, warmup = 1;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (i + 1 >= argc) {
            std::fprintf(stderr, "usage: bench_attention [--threads N] [--runs N] [--warmup N]\n");
            return 2;
        }
        if (a == "--threads") {
            threads = std::atoi(argv[++i]);
        } else if (a == "--runs") {
            runs = std::atoi(argv[++i]);
        } else if (a == "--warmup") {
            warmup = std::atoi(argv[++i]);
        } else {
            std::fprintf(stderr, "unknown option %s\n", a.c_str());
            return 2;
        }
    }
    const Shape shapes[] = {
        {"prefill", 4096, 4096, false}, {"recompute", 600, 8192, true}, {"decode", 1, 8192, false}};
    std::vector<CpuIsa> isas = {CpuIsa::avx2};
    if (cpu::cpu_has_avx512()) isas.push_back(CpuIsa::avx512);
    const KvDtype kvs[] = {KvDtype::f32, KvDtype::f16, KvDtype::bf16};
    struct Row {
        std::string shape, isa, kv;
        double median, lo, hi, cpu, gflops;
    };
    std::vector<Row> rows;
    for (const Shape& s : shapes) {
        Inputs in = make(s);
        struct Variant {
            CpuIsa isa;
            KvDtype kv;
            std::vector<double> ms, cpu;
        };
        std::vector<Variant> vs;
        for (CpuIsa isa : isas)
            for (KvDtype kv : kvs) vs.push_back({isa, kv, {}, {}});
        for (int r = 0; r < warmup + runs; ++r) {
            for (Variant& v : vs) {  // interleaved: every path once per round
                const AttnParams p = params(in, s, v.kv);
                const double c0 = cpu_ms();
                const auto t0 = std::chrono::steady_clock::now();
                cpu::attention_isa(v.isa, p, threads);
                const double ms =
                    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                        .count();
                if (r >= warmup) {
                    v.ms.push_back(ms);
                    v.cpu.push_back(cpu_ms() - c0);
                }
            }
        }
        for (Variant& v : vs) {
            std::sort(v.ms.begin(), v.ms.end());
            const double med = median_of(v.ms), cpu = median_of(v.cpu);
            const double flop = 4.0 * kHead * kDim * in.visible_pairs;
            rows.push_back({s.name, cpu::cpu_isa_name(v.isa), kv_dtype_name(v.kv), med,
                            v.ms.front(), v.ms.back(), cpu, flop / (med * 1e6)});
        }
    }
    std::printf("CPU attention, 9/3 heads, head_dim 64, %d threads, median of %d (cpu: %s)\n",
                threads, runs, cpu::cpu_isa_summary().c_str());
    std::printf("  %-10s %-7s %-5s %10s %10s %10s %10s %8s\n", "shape", "isa", "kv", "median ms",
                "min ms", "max ms", "cpu ms", "GFLOP/s");
    for (const Row& r : rows) {
        std::printf("  %-10s %-7s %-5s %10.2f %10.2f %10.2f %10.2f %8.1f\n", r.shape.c_str(),
                    r.isa.c_str(), r.kv.c_str(), r.median, r.lo, r.hi, r.cpu, r.gflops);
    }
    for (const Row& r : rows) {
        std::printf(
            "{\"bench\":\"attention\",\"shape\":\"%s\",\"isa\":\"%s\",\"kv_dtype\":\"%s\","
            "\"threads\":%d,\"runs\":%d,\"median_ms\":%.3f,\"min_ms\":%.3f,\"max_ms\":%.3f,"
            "\"cpu_ms\":%.3f,\"gflops\":%.2f}\n",
            r.shape.c_str(), r.isa.c_str(), r.kv.c_str(), threads, runs, r.median, r.lo, r.hi,
            r.cpu, r.gflops);
    }
    return 0;
}
