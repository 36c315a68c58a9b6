// The CUDA backend with a 16-bit KV cache (model.kv_dtype f16 / bf16) against the CPU backend's
// typed cache: the conversions bit for bit, a KvCache's rows bit for bit, attention and column
// scores on the same 16-bit K/V (own kernel: fp32 tolerance; FlashInfer reading bf16 in place or
// staged from f16: bf16 tolerance), and a generated model's logits. Reported as skipped where no
// device is visible (gpu_main.cpp).
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "gpu_util.h"
#include "kernels/cuda/flashinfer_attention.h"
#include "runtime/core/half.h"
#include "runtime/model/kv_cache.h"
#include "runtime/model/model.h"
#include "runtime/model/model_loader.h"

using namespace infoflow;
using namespace infoflow::gpu_test;

namespace {

constexpr KvDtype kTypes[] = {KvDtype::f16, KvDtype::bf16};

std::vector<uint16_t> narrow_host(KvDtype t, const std::vector<float>& x) {
    std::vector<uint16_t> h(x.size());
    kv_narrow(t, x.data(), x.size(), h.data());
    return h;
}

// One attention case on 16-bit K/V: both backends get the same 16-bit rows.
struct TypedCase {
    int n_q, n_kv, n_head, n_head_kv, head_dim, pad;
    bool causal;  // queries are the last n_q of n_kv sorted keys (else every fourth key hidden)
    uint32_t seed;
};

struct TypedOut {
    std::vector<float> out, lse;
};

TypedOut run_typed(Backend& be, KvDtype t, const TypedCase& c, const std::vector<float>& q,
                   const std::vector<uint16_t>& k16, const std::vector<uint16_t>& v16,
                   const std::vector<int32_t>& q_pos, const std::vector<int32_t>& k_pos) {
    const int stride = c.n_head_kv * c.head_dim + c.pad;
    Buffer qb = to_backend(be, q);
    Buffer kb = be.alloc(k16.size() * sizeof(uint16_t)), vb = be.alloc(v16.size() * 2);
    be.upload(kb.data(), k16.data(), k16.size() * sizeof(uint16_t));
    be.upload(vb.data(), v16.data(), v16.size() * sizeof(uint16_t));
    Buffer out = be.alloc_floats(q.size()), lse = be.alloc_floats(size_t(c.n_q) * c.n_head);
    AttnParams p;
    p.q = qb.data();
    p.kv_dtype = t;
    p.k16 = reinterpret_cast<const uint16_t*>(kb.data());
    p.v16 = reinterpret_cast<const uint16_t*>(vb.data());
    p.q_pos = q_pos.data();
    p.k_pos = k_pos.data();
    p.n_q = c.n_q;
    p.n_kv = c.n_kv;
    p.n_head = c.n_head;
    p.n_head_kv = c.n_head_kv;
    p.head_dim = c.head_dim;
    p.kv_stride = stride;
    p.out = out.data();
    p.lse = lse.data();
    be.attention(p);
    return {to_host(be, out, q.size()), to_host(be, lse, size_t(c.n_q) * c.n_head)};
}

}  // namespace

TEST_CASE("cuda kv dtype: narrow_kv / widen_kv equal the host conversions bit for bit",
          "[gpu_ops]") {
    Pair b;
    std::vector<float> x = randn(100003, 31, 50.0f);
    // Edges: zeros, the f16 range's ends and overflow, subnormals, ties, infinities.
    const float edges[] = {0.0f,          -0.0f,   65504.0f, 65520.0f, -70000.0f, 6e-8f,    3e-5f,
                           1.0009765625f, 3.0e38f, -3.4e38f, 1e-40f,   INFINITY,  -INFINITY};
    for (float e : edges) x.push_back(e);
    for (KvDtype t : kTypes) {
        CAPTURE(kv_dtype_name(t));
        Buffer d32 = to_backend(*b.gpu, x);
        Buffer d16 = b.gpu->alloc(x.size() * sizeof(uint16_t));
        b.gpu->narrow_kv(t, d32.data(), x.size(), d16.data());
        std::vector<uint16_t> got(x.size());
        b.gpu->download(got.data(), d16.data(), got.size() * sizeof(uint16_t));
        CHECK(got == narrow_host(t, x));
        Buffer back = b.gpu->alloc_floats(x.size());
        b.gpu->widen_kv(t, d16.data(), x.size(), back.data());
        std::vector<float> want(x.size());
        kv_widen(t, got.data(), got.size(), want.data());
        const std::vector<float> widened = to_host(*b.gpu, back, x.size());
        size_t same = 0;
        for (size_t i = 0; i < x.size(); ++i) {
            same += std::memcmp(&widened[i], &want[i], sizeof(float)) == 0;
        }
        CHECK(same == x.size());
    }
}

TEST_CASE("cuda kv dtype: a KvCache's rows equal the CPU backend's bit for bit", "[gpu_ops]") {
    Pair b;
    const ModelConfig c = random_model_config("llama-3.1-8b");
    ModelConfig small = c;
    small.n_layer = 2;
    const int row = c.n_head_kv * c.head_dim, n = 37;
    const std::vector<float> k = randn(size_t(n) * row, 41), v = randn(size_t(n) * row, 42);
    std::vector<int32_t> pos(n), slots(n);
    std::iota(pos.begin(), pos.end(), 0);
    for (int i = 0; i < n; ++i) slots[i] = (i * 7) % n;  // scattered slots
    for (KvDtype t : kTypes) {
        CAPTURE(kv_dtype_name(t));
        KvCache cc(*b.cpu, small, n, t), cg(*b.gpu, small, n, t);
        CHECK(cg.row_bytes() == size_t(row) * 2);  // half of f32
        cc.append(n, pos.data(), nullptr);
        cg.append(n, pos.data(), nullptr);
        Buffer kg = to_backend(*b.gpu, k), vg = to_backend(*b.gpu, v);
        cc.write_rows(1, slots.data(), k.data(), v.data(), n);
        cg.write_rows(1, slots.data(), kg.data(), vg.data(), n);
        std::vector<uint16_t> rc(size_t(n) * row), rg(rc.size()), vc(rc.size()), vgr(rc.size());
        cc.read_range_raw(1, 0, n, rc.data(), vc.data());
        Buffer rk = b.gpu->alloc(rc.size() * 2), rv = b.gpu->alloc(rc.size() * 2);
        cg.read_range_raw(1, 0, n, rk.data(), rv.data());
        b.gpu->download(rg.data(), rk.data(), rg.size() * 2);
        b.gpu->download(vgr.data(), rv.data(), vgr.size() * 2);
        CHECK(rg == rc);
        CHECK(vgr == vc);
        Buffer wk = b.gpu->alloc_floats(k.size());
        cg.read_rows(1, slots.data(), wk.data(), nullptr, n);
        std::vector<float> wc(k.size());
        cc.read_rows(1, slots.data(), wc.data(), nullptr, n);
        CHECK(to_host(*b.gpu, wk, k.size()) == wc);
    }
}

TEST_CASE("cuda kv dtype: attention on 16-bit K/V, own kernel and FlashInfer, against the CPU",
          "[gpu_attn]") {
    Pair b;
    std::unique_ptr<Backend> own = cuda_with("own");
    // n_q, n_kv, heads, kv heads, head_dim, stride pad, causal, seed.
    const std::vector<TypedCase> cases = {
        {64, 300, 8, 2, 128, 0, true, 51},   // prefill-like: FlashInfer causal
        {1, 1000, 32, 8, 128, 0, true, 52},  // decode: split-KV
        {40, 200, 4, 4, 64, 0, false, 53},   // hidden keys: custom mask
        {9, 77, 6, 3, 128, 4, true, 54},     // padded rows (stride not a multiple of 8)
    };
    for (const TypedCase& c : cases) {
        const int stride = c.n_head_kv * c.head_dim + c.pad;
        const std::vector<float> q = randn(size_t(c.n_q) * c.n_head * c.head_dim, c.seed);
        const std::vector<float> kf = randn(size_t(c.n_kv) * stride, c.seed + 1);
        const std::vector<float> vf = randn(size_t(c.n_kv) * stride, c.seed + 2);
        std::vector<int32_t> k_pos(c.n_kv), q_pos(c.n_q);
        for (int j = 0; j < c.n_kv; ++j) k_pos[j] = c.causal || j % 4 ? j : 1 << 20;
        for (int i = 0; i < c.n_q; ++i) q_pos[i] = c.n_kv - c.n_q + i;
        for (KvDtype t : kTypes) {
            const std::vector<uint16_t> k16 = narrow_host(t, kf), v16 = narrow_host(t, vf);
            const TypedOut rc = run_typed(*b.cpu, t, c, q, k16, v16, q_pos, k_pos);
            const TypedOut ro = run_typed(*own, t, c, q, k16, v16, q_pos, k_pos);
            INFO("n_q " << c.n_q << " n_kv " << c.n_kv << " H " << c.n_head << "/" << c.n_head_kv
                        << " D " << c.head_dim << " pad " << c.pad << " causal " << c.causal
                        << " kv " << kv_dtype_name(t) << " seed " << c.seed);
            // The same 16-bit values in, fp32 arithmetic: only the summation order differs.
            CHECK(rel_err(ro.out, rc.out) <= kTolFp32);
            CHECK(rel_err(ro.lse, rc.lse) <= kTolFp32);
            if (flashinfer_built()) {
                const TypedOut rf = run_typed(*b.gpu, t, c, q, k16, v16, q_pos, k_pos);
                CHECK(rel_err(rf.out, rc.out) <= kTolBf16);  // q (and f16 K/V) rounded to bf16
                CHECK(rel_err(rf.lse, rc.lse) <= kTolBf16);
            }
        }
    }
}

TEST_CASE("cuda kv dtype: attention_scores on 16-bit keys against the CPU", "[gpu_ops]") {
    Pair b;
    const int n_q = 9, n_cols = 300, H = 8, Hkv = 2, D = 128, row = Hkv * D;
    const std::vector<float> q = randn(size_t(n_q) * H * D, 61),
                             kf = randn(size_t(n_cols) * row, 62);
    std::vector<float> lse_h(size_t(n_q) * H);
    for (size_t i = 0; i < lse_h.size(); ++i) lse_h[i] = 4.0f + 0.1f * float(i % 7);
    std::vector<int32_t> k_pos(n_cols), q_pos(n_q);
    std::iota(k_pos.begin(), k_pos.end(), 0);
    for (int i = 0; i < n_q; ++i) q_pos[i] = n_cols + i;
    for (KvDtype t : kTypes) {
        const std::vector<uint16_t> k16 = narrow_host(t, kf);
        std::vector<float> r[2];
        Backend* bes[2] = {b.cpu.get(), b.gpu.get()};
        for (int i = 0; i < 2; ++i) {
            Buffer qb = to_backend(*bes[i], q), lb = to_backend(*bes[i], lse_h);
            Buffer kb = bes[i]->alloc(k16.size() * 2);
            bes[i]->upload(kb.data(), k16.data(), k16.size() * 2);
            Buffer col = to_backend(*bes[i], std::vector<float>(n_cols, 0.0f));
            ScoreParams p;
            p.q = qb.data();
            p.kv_dtype = t;
            p.k16 = reinterpret_cast<const uint16_t*>(kb.data());
            p.lse = lb.data();
            p.q_pos = q_pos.data();
            p.k_pos = k_pos.data();
            p.n_q = n_q;
            p.n_cols = n_cols;
            p.n_head = H;
            p.n_head_kv = Hkv;
            p.head_dim = D;
            p.col = col.data();
            bes[i]->attention_scores(p);
            r[i] = to_host(*bes[i], col, size_t(n_cols));
        }
        CAPTURE(kv_dtype_name(t));
        CHECK(rel_err(r[1], r[0]) <= kTolFp32);
    }
}

TEST_CASE("cuda kv dtype: generated models with a 16-bit cache match the CPU", "[gpu_random]") {
    Pair b;
    for (const char* shape : {"tiny", "smollm2-135m"}) {
        const ModelConfig c = random_model_config(shape);
        const ModelWeights host = make_random_weights(c, 5);
        const ModelWeights gen = make_generated_weights(c, 5);
        for (KvDtype t : kTypes) {
            Model mc(*b.cpu, host), mg(*b.gpu, gen);
            mc.set_kv_dtype(t);
            mg.set_kv_dtype(t);
            const int n = 200;
            std::vector<int32_t> tokens(n), pos(n);
            for (int i = 0; i < n; ++i) tokens[i] = (i * 613 + 11) % c.n_vocab;
            std::iota(pos.begin(), pos.end(), 0);
            KvCache kc = mc.make_cache(n + 2), kg = mg.make_cache(n + 2);
            CHECK(kg.dtype() == t);
            INFO("shape " << shape << " kv " << kv_dtype_name(t));
            CHECK(rel_err(mg.forward(kg, tokens, pos), mc.forward(kc, tokens, pos)) <= kTolBf16);
            const std::vector<int32_t> t1 = {23}, p1 = {n};
            CHECK(rel_err(mg.forward(kg, t1, p1), mc.forward(kc, t1, p1)) <= kTolBf16);
        }
    }
}
