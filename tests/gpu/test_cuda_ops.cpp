// Every op of the CUDA backend against the CPU backend (the reference) on seeded random inputs,
// odd sizes included. Tolerances (gpu_util.h): fp32 ops 1e-4, ops through bf16 2e-2 relative;
// a failing case prints its sizes and seed.
#include <cmath>
#include <numeric>
#include <vector>

#include "gpu_util.h"
#include "runtime/core/half.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_loader.h"

using namespace infoflow;
using namespace infoflow::gpu_test;

namespace {

std::vector<float> round_bf16(std::vector<float> v) {
    for (float& x : v) x = bf16_to_fp32(fp32_to_bf16(x));
    return v;
}

struct AttnCase {
    int n_q, n_kv, n_head, n_head_kv, head_dim, pad;
    bool groups, sorted;
    float scale;
    uint32_t seed;
};

// Host inputs of one attention case: positions (sorted or not), groups, a few queries with no
// visible key (positions before every key).
struct AttnInputs {
    std::vector<float> q, k, v;
    std::vector<int32_t> q_pos, k_pos, q_group, k_group;
    int stride = 0;
};

AttnInputs make_attn(const AttnCase& c) {
    AttnInputs in;
    in.stride = c.n_head_kv * c.head_dim + c.pad;
    in.q = randn(size_t(c.n_q) * c.n_head * c.head_dim, c.seed);
    in.k = randn(size_t(c.n_kv) * in.stride, c.seed + 1);
    in.v = randn(size_t(c.n_kv) * in.stride, c.seed + 2);
    std::mt19937 rng(c.seed + 3);
    for (int j = 0; j < c.n_kv; ++j)
        in.k_pos.push_back(c.sorted ? j : int32_t(rng() % (c.n_kv + 5)));
    for (int i = 0; i < c.n_q; ++i) {
        // Every fifth query sees no key at all (position -1 < every key position).
        in.q_pos.push_back(i % 5 == 4 ? -1 : int32_t(rng() % (c.n_kv + 5)));
    }
    if (c.groups) {
        for (int j = 0; j < c.n_kv; ++j) in.k_group.push_back(int32_t(rng() % 4) - 1);  // -1..2
        for (int i = 0; i < c.n_q; ++i) in.q_group.push_back(int32_t(rng() % 3));
    }
    return in;
}

struct AttnOut {
    std::vector<float> out, lse;
};

AttnOut run_attn(Backend& be, const AttnCase& c, const AttnInputs& in) {
    Buffer q = to_backend(be, in.q), k = to_backend(be, in.k), v = to_backend(be, in.v);
    Buffer out = be.alloc_floats(std::max<size_t>(1, in.q.size()));
    Buffer lse = be.alloc_floats(std::max(1, c.n_q * c.n_head));
    AttnParams p;
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
    p.q_pos = in.q_pos.data();
    p.k_pos = in.k_pos.data();
    p.q_group = c.groups ? in.q_group.data() : nullptr;
    p.k_group = c.groups ? in.k_group.data() : nullptr;
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

std::vector<float> run_scores(Backend& be, const AttnCase& c, const AttnInputs& in,
                              const std::vector<float>& lse_h, int n_cols, bool sum, float init) {
    Buffer q = to_backend(be, in.q), k = to_backend(be, in.k), lse = to_backend(be, lse_h);
    std::vector<float> col0(size_t(n_cols), init);  // accumulated into
    Buffer col = to_backend(be, col0);
    ScoreParams p;
    p.q = q.data();
    p.k = k.data();
    p.lse = lse.data();
    p.q_pos = in.q_pos.data();
    p.k_pos = in.k_pos.data();
    p.q_group = c.groups ? in.q_group.data() : nullptr;
    p.k_group = c.groups ? in.k_group.data() : nullptr;
    p.n_q = c.n_q;
    p.n_cols = n_cols;
    p.n_head = c.n_head;
    p.n_head_kv = c.n_head_kv;
    p.head_dim = c.head_dim;
    p.kv_stride = in.stride;
    p.scale = c.scale;
    p.aggregate_sum = sum;
    p.col = col.data();
    be.attention_scores(p);
    return to_host(be, col, size_t(n_cols));
}

}  // namespace

TEST_CASE("cuda ops: memory round trip, device and host copies", "[gpu_ops]") {
    Pair b;
    CHECK(b.gpu->name() == "cuda");
    CHECK(b.gpu->stream() != nullptr);
    INFO("device: " << b.gpu->device());
    const std::vector<float> h = randn(1000003, 1);
    Buffer d = to_backend(*b.gpu, h);
    CHECK(to_host(*b.gpu, d, h.size()) == h);
    Buffer e = b.gpu->alloc_floats(h.size());
    b.gpu->copy(e.data(), d.data(), h.size() * sizeof(float));  // device to device
    CHECK(to_host(*b.gpu, e, h.size()) == h);
    std::vector<float> back(h.size());
    b.gpu->copy(back.data(), e.data(), h.size() * sizeof(float));  // device to host via copy
    CHECK(back == h);
    const std::vector<float> h2 = randn(77, 2);
    b.gpu->copy(e.data(), h2.data(), h2.size() * sizeof(float));  // host to device via copy
    CHECK(to_host(*b.gpu, e, h2.size()) == h2);
}

TEST_CASE("cuda ops: embed gathers bf16 rows exactly", "[gpu_ops]") {
    Pair b;
    for (const auto& s : std::vector<std::pair<int, int>>{{1, 1}, {50, 7}, {1000, 576}}) {
        const int V = s.first, E = s.second;
        const std::vector<float> table = randn(size_t(V) * E, 3);
        std::vector<int32_t> ids = {0, V - 1, V / 2, 0, V / 3};
        const int n = int(ids.size());
        const std::vector<float> rounded = round_bf16(table);
        Buffer tc = b.cpu->load_matrix(rounded.data(), V, E);
        Buffer tg = b.gpu->load_matrix(table.data(), V, E);
        Buffer oc = b.cpu->alloc_floats(size_t(n) * E), og = b.gpu->alloc_floats(size_t(n) * E);
        b.cpu->embed(tc.data(), ids.data(), n, E, oc.data());
        b.gpu->embed(tg.data(), ids.data(), n, E, og.data());
        INFO("V " << V << " E " << E);
        CHECK(to_host(*b.gpu, og, size_t(n) * E) == to_host(*b.cpu, oc, size_t(n) * E));
    }
}

TEST_CASE("cuda ops: rms_norm, separate and in place", "[gpu_ops]") {
    Pair b;
    for (const auto& s : std::vector<std::pair<int, int>>{{1, 1}, {3, 7}, {33, 576}, {5, 4097}}) {
        const int n = s.first, d = s.second;
        const std::vector<float> x = randn(size_t(n) * d, 4, 3.0f), w = randn(size_t(d), 5);
        for (bool in_place : {false, true}) {
            std::vector<float> r[2];
            Backend* bes[2] = {b.cpu.get(), b.gpu.get()};
            for (int i = 0; i < 2; ++i) {
                Buffer xb = to_backend(*bes[i], x), wb = to_backend(*bes[i], w);
                Buffer ob = bes[i]->alloc_floats(x.size());
                float* out = in_place ? xb.data() : ob.data();
                bes[i]->rms_norm(xb.data(), wb.data(), n, d, 1e-5f, out);
                r[i] = to_host(*bes[i], in_place ? xb : ob, x.size());
            }
            INFO("n " << n << " d " << d << " in_place " << in_place);
            CHECK(rel_err(r[1], r[0]) <= kTolFp32);
        }
    }
}

TEST_CASE("cuda ops: matmul with bias and accumulate, odd and large sizes", "[gpu_ops]") {
    Pair b;
    for (const auto& s : std::vector<std::vector<int>>{
             {1, 1, 1}, {3, 7, 5}, {1, 576, 1536}, {17, 576, 49}, {129, 1024, 333}}) {
        const int n = s[0], k = s[1], m = s[2];
        const uint32_t seed = uint32_t(n * 7 + k * 3 + m);
        const std::vector<float> x = randn(size_t(n) * k, seed), w = randn(size_t(m) * k, seed + 1);
        const std::vector<float> bias = randn(size_t(m), seed + 2),
                                 acc0 = randn(size_t(n) * m, seed + 3);
        const std::vector<float> xr = round_bf16(x), wr = round_bf16(w);
        for (int mode = 0; mode < 4; ++mode) {
            const bool with_bias = mode & 1, accumulate = mode & 2;
            auto run = [&](Backend& be, const std::vector<float>& xs,
                           const std::vector<float>& ws) {
                Buffer xb = to_backend(be, xs), wb = be.load_matrix(ws.data(), m, k);
                Buffer bb = to_backend(be, bias), ob = to_backend(be, acc0);
                be.matmul(xb.data(), wb.data(), with_bias ? bb.data() : nullptr, n, k, m, ob.data(),
                          accumulate);
                return to_host(be, ob, size_t(n) * m);
            };
            const std::vector<float> g = run(*b.gpu, x, w);
            INFO("n " << n << " k " << k << " m " << m << " bias " << with_bias << " accumulate "
                      << accumulate << " seed " << seed);
            // Against the CPU on the same bf16-rounded inputs: only accumulation order differs.
            CHECK(rel_err(g, run(*b.cpu, xr, wr)) <= kTolFp32);
            // Against the fp32 CPU result: the bf16 tolerance.
            CHECK(rel_err(g, run(*b.cpu, x, w)) <= kTolBf16);
        }
    }
}

TEST_CASE("cuda ops: rope at per-token positions, negative and large, llama3 frequencies",
          "[gpu_ops]") {
    Pair b;
    for (const char* shape : {"tiny", "llama-3.1-8b", "qwen3-14b"}) {
        const ModelConfig c = random_model_config(shape);
        const std::vector<float> inv = rope_inv_freq(c);
        const int D = c.head_dim, H = 3, n = 9;
        const std::vector<int32_t> pos = {0, 1, -1, 7, -4096, 131071, 65536, -131000, 12345};
        const std::vector<float> x = randn(size_t(n) * H * D, 6);
        std::vector<float> r[2];
        Backend* bes[2] = {b.cpu.get(), b.gpu.get()};
        for (int i = 0; i < 2; ++i) {
            Buffer xb = to_backend(*bes[i], x), fb = to_backend(*bes[i], inv);
            bes[i]->rope(xb.data(), pos.data(), n, H, D, fb.data());
            r[i] = to_host(*bes[i], xb, x.size());
        }
        INFO("shape " << shape);
        CHECK(rel_err(r[1], r[0]) <= kTolFp32);
    }
}

TEST_CASE("cuda ops: swiglu and add", "[gpu_ops]") {
    Pair b;
    for (size_t n : {size_t(1), size_t(1000), size_t(1000003)}) {
        const std::vector<float> g = randn(n, 7, 4.0f), u = randn(n, 8);
        std::vector<float> r[2], a[2];
        Backend* bes[2] = {b.cpu.get(), b.gpu.get()};
        for (int i = 0; i < 2; ++i) {
            Buffer gb = to_backend(*bes[i], g), ub = to_backend(*bes[i], u);
            Buffer ob = bes[i]->alloc_floats(n);
            bes[i]->swiglu(gb.data(), ub.data(), n, ob.data());
            r[i] = to_host(*bes[i], ob, n);
            bes[i]->add(gb.data(), ub.data(), n);
            a[i] = to_host(*bes[i], gb, n);
        }
        INFO("n " << n);
        CHECK(rel_err(r[1], r[0]) <= kTolFp32);
        CHECK(a[1] == a[0]);  // one fp32 add: exact
    }
}

TEST_CASE("cuda ops: lse_merge, random and edge cases", "[gpu_ops]") {
    Pair b;
    const int rows = 9, D = 64;
    std::vector<float> oa = randn(size_t(rows) * D, 9), ob = randn(size_t(rows) * D, 10);
    // Empty on either side, both empty, equal, large gaps, overflow-prone magnitudes.
    std::vector<float> la = {0.5f, -INFINITY, 3.0f, -INFINITY, 2.0f, 1e4f, -1e4f, 88.0f, 1.0f};
    std::vector<float> lb = {1.5f, 2.0f, -INFINITY, -INFINITY, 2.0f, -1e4f, 1e4f, 89.0f, -3.0f};
    for (int r = 0; r < rows; ++r) {
        if (la[r] == -INFINITY) std::fill(oa.begin() + r * D, oa.begin() + (r + 1) * D, 0.0f);
        if (lb[r] == -INFINITY) std::fill(ob.begin() + r * D, ob.begin() + (r + 1) * D, 0.0f);
    }
    std::vector<float> ro[2], rl[2];
    Backend* bes[2] = {b.cpu.get(), b.gpu.get()};
    for (int i = 0; i < 2; ++i) {
        Buffer a = to_backend(*bes[i], oa), bb = to_backend(*bes[i], ob);
        Buffer l1 = to_backend(*bes[i], la), l2 = to_backend(*bes[i], lb);
        bes[i]->lse_merge(a.data(), l1.data(), bb.data(), l2.data(), rows, D);
        ro[i] = to_host(*bes[i], a, oa.size());
        rl[i] = to_host(*bes[i], l1, size_t(rows));
    }
    CHECK(rel_err(ro[1], ro[0]) <= kTolFp32);
    CHECK(rel_err(rl[1], rl[0]) <= kTolFp32);
    CHECK(rl[1][3] == -INFINITY);  // both empty stays empty, no NaN
    for (float v : ro[1]) CHECK_FALSE(std::isnan(v));
}

TEST_CASE("cuda ops: attention under the full visibility rule", "[gpu_ops]") {
    Pair b;
    // n_q, n_kv, heads, kv heads, head_dim, stride pad, groups, sorted keys, scale, seed.
    const std::vector<AttnCase> cases = {
        {1, 1, 1, 1, 16, 0, false, true, 0.0f, 11},
        {37, 37, 4, 2, 64, 0, false, true, 0.0f, 12},
        {5, 300, 8, 2, 128, 16, true, false, 0.0f, 13},
        {64, 129, 6, 3, 80, 3, true, true, 0.3f, 14},
        {3, 1000, 32, 8, 128, 0, false, true, 0.0f, 15},
        {7, 0, 4, 4, 32, 0, false, true, 0.0f, 16},
        {20, 513, 2, 1, 256, 0, true, false, 0.0f, 17},
    };
    for (const AttnCase& c : cases) {
        const AttnInputs in = make_attn(c);
        const AttnOut rc = run_attn(*b.cpu, c, in), rg = run_attn(*b.gpu, c, in);
        INFO("n_q " << c.n_q << " n_kv " << c.n_kv << " H " << c.n_head << " Hkv " << c.n_head_kv
                    << " D " << c.head_dim << " pad " << c.pad << " groups " << c.groups
                    << " sorted " << c.sorted << " seed " << c.seed);
        CHECK(rel_err(rg.out, rc.out) <= kTolFp32);
        CHECK(rel_err(rg.lse, rc.lse) <= kTolFp32);  // -inf rows must agree exactly
        // Queries with no visible key: out 0, lse -inf.
        for (int i = 4; i < c.n_q; i += 5) {
            for (int h = 0; h < c.n_head; ++h) CHECK(rg.lse[size_t(i) * c.n_head + h] == -INFINITY);
            for (int e = 0; e < c.n_head * c.head_dim; ++e)
                CHECK(rg.out[size_t(i) * c.n_head * c.head_dim + e] == 0.0f);
        }
    }
}

TEST_CASE("cuda ops: attention_scores, norm and sum over a column prefix", "[gpu_ops]") {
    Pair b;
    const std::vector<AttnCase> cases = {
        {3, 50, 4, 2, 64, 0, false, true, 0.0f, 21},
        {9, 300, 8, 2, 128, 8, true, false, 0.0f, 22},
        {16, 700, 32, 8, 128, 0, true, true, 0.0f, 23},
    };
    for (const AttnCase& c : cases) {
        const AttnInputs in = make_attn(c);
        const AttnOut full = run_attn(*b.cpu, c, in);  // the rows' true normalizers
        for (bool sum : {false, true}) {
            for (int n_cols : {c.n_kv, c.n_kv / 3 + 1}) {
                // Scores from zero (the precision check) and into a prefilled vector.
                const float init = n_cols == c.n_kv ? 0.0f : 0.25f;
                const auto sc = run_scores(*b.cpu, c, in, full.lse, n_cols, sum, init);
                const auto sg = run_scores(*b.gpu, c, in, full.lse, n_cols, sum, init);
                INFO("n_q " << c.n_q << " n_kv " << c.n_kv << " cols " << n_cols << " sum " << sum
                            << " groups " << c.groups << " seed " << c.seed);
                CHECK(rel_err(sg, sc) <= kTolFp32);
            }
        }
    }
}
