// The two attention paths of the CUDA backend through the Backend interface, on the same
// AttnParams: FlashInfer (INFOFLOW_CUDA_ATTENTION=flashinfer, which errors rather than fall
// back, so these cases provably ran FlashInfer) against the backend's own fp32 kernel
// (INFOFLOW_CUDA_ATTENTION=own) and the CPU backend. FlashInfer reads bf16 q/k/v, so it is held
// to the bf16 tolerance; the default ("auto") must give FlashInfer's result bit for bit where
// FlashInfer can compute the call and the own kernel's where it cannot. Built without
// FlashInfer, the default must equal the own kernel everywhere and "flashinfer" must refuse.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gpu_util.h"
#include "kernels/cuda/flashinfer_attention.h"

using namespace infoflow;
using namespace infoflow::gpu_test;

namespace {

enum class Layout {
    kCausal,    // queries are the last n_q of n_kv position-sorted keys (prefill, chunk append)
    kDecode,    // one query that sees every key, keys in any order
    kUnsorted,  // unsorted key positions, some queries see no key
    kGroups,    // sorted positions plus shard/selection groups
};

struct Case {
    const char* what;
    Layout layout;
    int n_q, n_kv, n_head, n_head_kv, head_dim, pad;
    float scale;
    uint32_t seed;
};

struct Inputs {
    std::vector<float> q, k, v;
    std::vector<int32_t> q_pos, k_pos, q_group, k_group;
    int stride = 0;
    bool groups = false;
};

Inputs make_inputs(const Case& c) {
    Inputs in;
    in.stride = c.n_head_kv * c.head_dim + c.pad;
    in.q = randn(size_t(c.n_q) * c.n_head * c.head_dim, c.seed);
    in.k = randn(size_t(c.n_kv) * in.stride, c.seed + 1);
    in.v = randn(size_t(c.n_kv) * in.stride, c.seed + 2);
    std::mt19937 rng(c.seed + 3);
    switch (c.layout) {
        case Layout::kCausal:
            for (int j = 0; j < c.n_kv; ++j) in.k_pos.push_back(j);
            for (int i = 0; i < c.n_q; ++i) in.q_pos.push_back(c.n_kv - c.n_q + i);
            break;
        case Layout::kDecode:
            for (int j = 0; j < c.n_kv; ++j) in.k_pos.push_back(int32_t(rng() % c.n_kv));
            in.q_pos.push_back(c.n_kv);
            break;
        case Layout::kUnsorted:
            for (int j = 0; j < c.n_kv; ++j) in.k_pos.push_back(int32_t(rng() % (c.n_kv + 5)));
            for (int i = 0; i < c.n_q; ++i)
                in.q_pos.push_back(i % 5 == 4 ? -1 : int32_t(rng() % (c.n_kv + 5)));
            break;
        case Layout::kGroups:
            in.groups = true;
            for (int j = 0; j < c.n_kv; ++j) {
                in.k_pos.push_back(j);
                in.k_group.push_back(int32_t(rng() % 4) - 1);  // -1 (seen by all) .. 2
            }
            for (int i = 0; i < c.n_q; ++i) {
                in.q_pos.push_back(c.n_kv - c.n_q + i);
                in.q_group.push_back(int32_t(rng() % 3));
            }
            break;
    }
    return in;
}

struct Out {
    std::vector<float> out, lse;
};

Out run(Backend& be, const Case& c, const Inputs& in) {
    Buffer q = to_backend(be, in.q), k = to_backend(be, in.k), v = to_backend(be, in.v);
    Buffer out = be.alloc_floats(in.q.size());
    Buffer lse = be.alloc_floats(size_t(c.n_q) * c.n_head);
    AttnParams p;
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
    p.q_pos = in.q_pos.data();
    p.k_pos = in.k_pos.data();
    p.q_group = in.groups ? in.q_group.data() : nullptr;
    p.k_group = in.groups ? in.k_group.data() : nullptr;
    p.n_q = c.n_q;
    p.n_kv = c.n_kv;
    p.n_head = c.n_head;
    p.n_head_kv = c.n_head_kv;
    p.head_dim = c.head_dim;
    p.kv_stride = in.stride;
    p.scale = c.scale;
    p.out = out.data();
    p.lse = lse.data();
    be.attention(p);
    return {to_host(be, out, in.q.size()), to_host(be, lse, size_t(c.n_q) * c.n_head)};
}

// Shapes of SmolLM2 (9/3 heads, head dim 64) and of the llama/qwen targets (head dim 128, GQA
// 4), each rule FlashInfer serves: causal prefill and chunk append, decode (long enough for the
// split-KV path), custom mask for unsorted positions and for groups; strided KV rows.
const std::vector<Case> kFlashCases = {
    {"prefill smollm2", Layout::kCausal, 200, 200, 9, 3, 64, 0, 0.0f, 31},
    {"chunk append smollm2", Layout::kCausal, 37, 300, 9, 3, 64, 16, 0.0f, 32},
    {"prefill llama", Layout::kCausal, 300, 300, 32, 8, 128, 0, 0.0f, 33},
    {"decode llama", Layout::kDecode, 1, 4000, 32, 8, 128, 0, 0.0f, 34},
    {"decode smollm2", Layout::kDecode, 1, 777, 9, 3, 64, 8, 0.0f, 35},
    {"unsorted mask", Layout::kUnsorted, 45, 260, 8, 2, 128, 0, 0.3f, 36},
    {"group mask", Layout::kGroups, 64, 500, 9, 3, 64, 0, 0.0f, 37},
};

}  // namespace

TEST_CASE("cuda attention: FlashInfer path against the own kernel on the same AttnParams",
          "[gpu_attn]") {
    std::unique_ptr<Backend> cpu = make_cpu_backend(2);
    std::unique_ptr<Backend> own = cuda_with("own");
    std::unique_ptr<Backend> deflt = cuda_with("auto");
    if (!flashinfer_built()) {
        // Without FlashInfer the backend has one path: the default is the own kernel.
        CHECK_THROWS_WITH(cuda_with("flashinfer"), Catch::Contains("was not built"));
        for (const Case& c : kFlashCases) {
            INFO(c.what);
            const Inputs in = make_inputs(c);
            const Out ro = run(*own, c, in), rd = run(*deflt, c, in);
            CHECK(ro.out == rd.out);
            CHECK(ro.lse == rd.lse);
        }
        return;
    }
    std::unique_ptr<Backend> flash = cuda_with("flashinfer");
    for (const Case& c : kFlashCases) {
        INFO(c.what << ": n_q " << c.n_q << " n_kv " << c.n_kv << " H " << c.n_head << "/"
                    << c.n_head_kv << " D " << c.head_dim << " pad " << c.pad << " seed "
                    << c.seed);
        const Inputs in = make_inputs(c);
        const Out rc = run(*cpu, c, in), ro = run(*own, c, in), rf = run(*flash, c, in);
        const Out rd = run(*deflt, c, in);
        CHECK(rel_err(ro.out, rc.out) <= kTolFp32);  // the oracle itself, fp32
        CHECK(rel_err(ro.lse, rc.lse) <= kTolFp32);
        CHECK(rel_err(rf.out, ro.out) <= kTolBf16);  // FlashInfer through bf16 q/k/v
        CHECK(rel_err(rf.lse, ro.lse) <= kTolBf16);  // -inf rows must agree exactly
        CHECK(rel_err(rf.out, rc.out) <= kTolBf16);
        CHECK(rd.out == rf.out);  // the default took FlashInfer
        CHECK(rd.lse == rf.lse);
    }
}

TEST_CASE("cuda attention: calls FlashInfer cannot compute fall back to the own kernel",
          "[gpu_attn]") {
    std::unique_ptr<Backend> own = cuda_with("own");
    std::unique_ptr<Backend> deflt = cuda_with("auto");
    // Head dim 80 is not instantiated; 256 neither.
    const std::vector<Case> cases = {
        {"head dim 80", Layout::kCausal, 40, 90, 6, 3, 80, 3, 0.0f, 41},
        {"head dim 256", Layout::kUnsorted, 20, 513, 2, 1, 256, 0, 0.0f, 42},
    };
    for (const Case& c : cases) {
        INFO(c.what);
        const Inputs in = make_inputs(c);
        const Out ro = run(*own, c, in), rd = run(*deflt, c, in);
        CHECK(ro.out == rd.out);
        CHECK(ro.lse == rd.lse);
        if (flashinfer_built()) {
            std::unique_ptr<Backend> flash = cuda_with("flashinfer");
            CHECK_THROWS_WITH(run(*flash, c, in), Catch::Contains("FlashInfer cannot compute"));
        }
    }
    CHECK_THROWS_WITH(cuda_with("fast"), Catch::Contains("not one of auto, own, flashinfer"));
}
