// Every op of the AMX path against the AVX-512 / fp32 path, on amx_tiles(): the emulator in
// tests_amx, the CPU's tiles in tests_amx_hw (skipped where there is no AMX).
//
// Tolerances (bf16 inputs, fp32 accumulation). Rounding to bf16 (nearest even) changes a value
// by at most 2^-9 of it, so a product of two rounded values by at most ~2^-8 of |x w|; the fp32
// sums add at most k 2^-24 of sum|x w| more (< 2^-13 for k <= 2048). Hence for a GEMM element
//   |amx - fp32| <= 1.1 * 2^-8 * sum_c |x_c w_c| + 1e-6.
// For attention only the scores take the tiles (P·V stays fp32, attention_cpu_impl.h): a score
// s = scale q.k moves by at most ds = 1.1 * 2^-8 * scale * sum_d |q_d k_d|, the softmax weights
// then by a factor within exp(+-2 ds) (~1 +- 2 ds), so per row
//   |o_amx - o_ref| <= 2 ds_max * max|v| + 1e-5,   |lse_amx - lse_ref| <= ds_max + 1e-5,
// with ds_max the largest ds over the row's visible keys (computed by the test).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/attention_cpu.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemm_amx.h"
#include "kernels/cpu/native_matmul.h"
#include "kernels/cpu/quant_dot.h"
#include "runtime/core/half.h"
#include "runtime/formats/dequant.h"
#include "tests/amx/amx_test_util.h"

using namespace infoflow;
using namespace infoflow::cpu;

namespace {

constexpr double kBf16Product = 1.1 / 256.0;  // 1.1 * 2^-8

std::vector<float> normal(std::mt19937& rng, size_t n, float sd) {
    std::normal_distribution<float> d(0.0f, sd);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

// max over elements of |got - want| / (bound of the element), where the bound is the GEMM
// tolerance above over x [n, k] and w [m, k].
double gemm_error_ratio(const std::vector<float>& got, const std::vector<float>& want,
                        const float* x, const float* w, int n, int k, int m) {
    double worst = 0.0;
    for (int t = 0; t < n; ++t) {
        for (int j = 0; j < m; ++j) {
            double mag = 0.0;
            for (int c = 0; c < k; ++c)
                mag += std::fabs(double(x[size_t(t) * k + c]) * w[size_t(j) * k + c]);
            const double err = std::fabs(double(got[size_t(t) * m + j]) - want[size_t(t) * m + j]);
            worst = std::max(worst, err / (kBf16Product * mag + 1e-6));
        }
    }
    return worst;
}

}  // namespace

TEST_CASE("amx: gemm_amx against the fp32 product within the bf16 bound", "[amx]") {
    std::mt19937 rng(21);
    struct Shape {
        int n, k, m;
    };
    for (const Shape s : {Shape{16, 64, 32}, Shape{45, 576, 70}, Shape{100, 1100, 40}}) {
        const std::vector<float> x = normal(rng, size_t(s.n) * s.k, 1.0f);
        const std::vector<float> w = normal(rng, size_t(s.m) * s.k, 0.05f);
        const std::vector<float> bias = normal(rng, size_t(s.m), 0.1f);
        std::vector<float> got(size_t(s.n) * s.m), want(got.size());
        gemm_amx(x.data(), s.n, s.k, s.m, RowsOfFloats(w.data(), s.k), bias.data(), got.data(),
                 false, 2, amx_tiles());
        gemm_exact_ref(x.data(), s.n, s.k, s.m, w.data(), bias.data(), want.data(), false);
        const double ratio = gemm_error_ratio(got, want, x.data(), w.data(), s.n, s.k, s.m);
        std::printf("gemm_amx (%s) n=%d k=%d m=%d: worst error %.3f of the bf16 bound\n",
                    amx_tiles().name, s.n, s.k, s.m, ratio);
        INFO("tiles " << amx_tiles().name << " n=" << s.n << " k=" << s.k << " m=" << s.m);
        CHECK(ratio <= 1.0);
    }
}

TEST_CASE("amx: the backend's native matmul on cpu.isa = amx against avx512", "[amx]") {
    // A Q4_1 matrix (the bundled model's type) through native_matmul: every exact-pass call,
    // whatever its rows, takes the tiles, within the bf16 bound of the avx512 exact pass, and
    // gives each token the bits it gets alone.
    std::mt19937 rng(23);
    const int k = 576, m = 96;
    const size_t rb = native_row_bytes(ggml_id::q4_1, k);
    std::vector<uint8_t> wq(rb * m);
    std::vector<float> wf(size_t(m) * k);
    for (int r = 0; r < m; ++r) {
        const std::vector<float> row = normal(rng, size_t(k), 0.05f);
        quantize_row(ggml_id::q4_1, row.data(), wq.data() + rb * r, k);
        dequantize_row(ggml_id::q4_1, wq.data() + rb * r, wf.data() + size_t(r) * k, k);
    }
    NativeMatrix nm;
    nm.type = ggml_id::q4_1;
    nm.rows = m;
    nm.cols = k;
    nm.row_bytes = rb;
    nm.data = wq.data();
    const std::vector<float> bias = normal(rng, size_t(m), 0.1f);
    const CpuIsa before = active_cpu_isa();
    for (const int n : {8, 15, 16, 40, 129}) {
        const std::vector<float> x = normal(rng, size_t(n) * k, 1.0f);
        const std::vector<float> prev = normal(rng, size_t(n) * m, 1.0f);
        std::vector<float> ref = prev, got = prev;
        set_cpu_isa_override("avx512");
        native_matmul(x.data(), nm, bias.data(), n, ref.data(), true, 2);
        set_cpu_isa_override("amx");
        native_matmul(x.data(), nm, bias.data(), n, got.data(), true, 2);
        INFO("tiles " << amx_tiles().name << " n=" << n);
        // Accumulating into `prev` adds its rounding: compare the sums without it.
        std::vector<float> g2(got.size()), r2(got.size());
        for (size_t i = 0; i < got.size(); ++i) {
            g2[i] = got[i] - prev[i];
            r2[i] = ref[i] - prev[i];
        }
        const double ratio = gemm_error_ratio(g2, r2, x.data(), wf.data(), n, k, m);
        std::printf("native matmul amx (%s) vs avx512, n=%d: worst error %.3f of the bound\n",
                    amx_tiles().name, n, ratio);
        CHECK(ratio <= 1.0);
        // Token 0 alone: the bits it got in the call of n tokens.
        std::vector<float> one(prev.begin(), prev.begin() + m);
        native_matmul(x.data(), nm, bias.data(), 1, one.data(), true, 1);
        CHECK(std::memcmp(one.data(), got.data(), size_t(m) * sizeof(float)) == 0);
    }
    set_cpu_isa_override(cpu_isa_name(before));
}

namespace {

struct AttnCase {
    int n_q, n_kv, H, Hkv, D;
    KvDtype kv;
    bool groups;
};

struct AttnData {
    std::vector<float> q, k, v;
    std::vector<uint16_t> k16, v16;
    std::vector<int32_t> qpos, kpos, qgrp, kgrp;
};

AttnData make_attn(std::mt19937& rng, const AttnCase& c) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    AttnData d;
    d.q.resize(size_t(c.n_q) * c.H * c.D);
    d.k.resize(size_t(c.n_kv) * c.Hkv * c.D);
    d.v.resize(d.k.size());
    for (float& x : d.q) x = 2.0f * u(rng);
    for (float& x : d.k) x = 2.0f * u(rng);
    for (float& x : d.v) x = u(rng);
    if (c.kv != KvDtype::f32) {
        d.k16.resize(d.k.size());
        d.v16.resize(d.v.size());
        for (size_t i = 0; i < d.k.size(); ++i) {
            d.k16[i] = c.kv == KvDtype::f16 ? fp32_to_fp16(d.k[i]) : fp32_to_bf16(d.k[i]);
            d.v16[i] = c.kv == KvDtype::f16 ? fp32_to_fp16(d.v[i]) : fp32_to_bf16(d.v[i]);
            d.k[i] = c.kv == KvDtype::f16 ? fp16_to_fp32(d.k16[i]) : bf16_to_fp32(d.k16[i]);
            d.v[i] = c.kv == KvDtype::f16 ? fp16_to_fp32(d.v16[i]) : bf16_to_fp32(d.v16[i]);
        }
    }
    // Causal: the queries are the last n_q keys' positions; groups: 3 documents and shared keys.
    for (int j = 0; j < c.n_kv; ++j) {
        d.kpos.push_back(j);
        d.kgrp.push_back(j % 5 == 0 ? -1 : j % 3);
    }
    for (int i = 0; i < c.n_q; ++i) {
        d.qpos.push_back(c.n_kv - c.n_q + i);
        d.qgrp.push_back(i % 3);
    }
    return d;
}

AttnParams params(const AttnCase& c, const AttnData& d, int q0, int n_q, float* out, float* lse) {
    AttnParams p;
    p.q = d.q.data() + size_t(q0) * c.H * c.D;
    p.q_pos = d.qpos.data() + q0;
    p.k_pos = d.kpos.data();
    if (c.groups) {
        p.q_group = d.qgrp.data() + q0;
        p.k_group = d.kgrp.data();
    }
    p.n_q = n_q;
    p.n_kv = c.n_kv;
    p.n_head = c.H;
    p.n_head_kv = c.Hkv;
    p.head_dim = c.D;
    p.out = out + size_t(q0) * c.H * c.D;
    p.lse = lse + size_t(q0) * c.H;
    p.kv_dtype = c.kv;
    if (c.kv == KvDtype::f32) {
        p.k = d.k.data();
        p.v = d.v.data();
    } else {
        p.k16 = d.k16.data();
        p.v16 = d.v16.data();
    }
    return p;
}

bool visible(const AttnCase& c, const AttnData& d, int i, int j) {
    if (d.kpos[j] > d.qpos[i]) return false;
    return !c.groups || d.kgrp[j] < 0 || d.kgrp[j] == d.qgrp[i];
}

}  // namespace

TEST_CASE("amx: tiled attention against the avx512 kernel within the bf16 bound", "[amx]") {
    std::mt19937 rng(29);
    const AttnCase cases[] = {
        {40, 300, 6, 2, 64, KvDtype::f32, false},
        {97, 97, 9, 3, 64, KvDtype::f32, true},
        {33, 200, 4, 4, 40, KvDtype::f16, false},
        {64, 130, 6, 2, 128, KvDtype::bf16, false},
    };
    for (const AttnCase& c : cases) {
        const AttnData d = make_attn(rng, c);
        std::vector<float> o_ref(size_t(c.n_q) * c.H * c.D), o_amx(o_ref.size());
        std::vector<float> l_ref(size_t(c.n_q) * c.H), l_amx(l_ref.size());
        attention_isa(CpuIsa::avx512, params(c, d, 0, c.n_q, o_ref.data(), l_ref.data()), 2);
        attention_amx(params(c, d, 0, c.n_q, o_amx.data(), l_amx.data()), 2, amx_tiles());
        const int g = c.H / c.Hkv;
        const double scale = 1.0 / std::sqrt(double(c.D));
        double worst_o = 0.0, worst_l = 0.0;
        for (int i = 0; i < c.n_q; ++i) {
            for (int h = 0; h < c.H; ++h) {
                const float* q = d.q.data() + (size_t(i) * c.H + h) * c.D;
                double ds = 0.0, vmax = 0.0;
                for (int j = 0; j < c.n_kv; ++j) {
                    if (!visible(c, d, i, j)) continue;
                    const float* k = d.k.data() + (size_t(j) * c.Hkv + h / g) * c.D;
                    const float* v = d.v.data() + (size_t(j) * c.Hkv + h / g) * c.D;
                    double mag = 0.0;
                    for (int e = 0; e < c.D; ++e) {
                        mag += std::fabs(double(q[e]) * k[e]);
                        vmax = std::max(vmax, double(std::fabs(v[e])));
                    }
                    ds = std::max(ds, kBf16Product * scale * mag);
                }
                const double tol_o = 2.0 * ds * vmax + 1e-5;
                const double tol_l = ds + 1e-5;
                const size_t r = size_t(i) * c.H + h;
                for (int e = 0; e < c.D; ++e) {
                    const double err = std::fabs(double(o_amx[r * c.D + e]) - o_ref[r * c.D + e]);
                    worst_o = std::max(worst_o, err / tol_o);
                }
                if (std::isinf(l_ref[r])) {
                    CHECK(l_amx[r] == l_ref[r]);
                } else {
                    worst_l = std::max(worst_l, std::fabs(double(l_amx[r]) - l_ref[r]) / tol_l);
                }
            }
        }
        std::printf(
            "attention amx (%s) n_q=%d n_kv=%d H=%d/%d D=%d kv=%s%s: worst error %.3f (out), "
            "%.3f (lse) of the bf16 bound\n",
            amx_tiles().name, c.n_q, c.n_kv, c.H, c.Hkv, c.D, kv_dtype_name(c.kv),
            c.groups ? " groups" : "", worst_o, worst_l);
        INFO("tiles " << amx_tiles().name << " n_q=" << c.n_q << " n_kv=" << c.n_kv << " D=" << c.D
                      << " kv=" << kv_dtype_name(c.kv) << " groups=" << c.groups);
        CHECK(worst_o <= 1.0);
        CHECK(worst_l <= 1.0);
    }
}

TEST_CASE("amx: a query's attention bits do not depend on the other queries of its call", "[amx]") {
    // Each row of the tiles is computed from its own query alone: calls that split the queries
    // differently (other neighbours in every tile and query block) give the same bits, as N
    // ranks must give what parallel.emulate_ranks = N gives. Calls keep > 16 rows (n_q * g) so
    // all take the tiles.
    std::mt19937 rng(31);
    const AttnCase c{90, 250, 9, 3, 64, KvDtype::f32, true};
    const AttnData d = make_attn(rng, c);
    std::vector<float> whole(size_t(c.n_q) * c.H * c.D), lw(size_t(c.n_q) * c.H);
    attention_amx(params(c, d, 0, c.n_q, whole.data(), lw.data()), 2, amx_tiles());
    for (const int split : {6, 17, 45, 70}) {
        std::vector<float> part(whole.size()), lp(lw.size());
        attention_amx(params(c, d, 0, split, part.data(), lp.data()), 1, amx_tiles());
        attention_amx(params(c, d, split, c.n_q - split, part.data(), lp.data()), 2, amx_tiles());
        INFO("tiles " << amx_tiles().name << " split at " << split);
        CHECK(std::memcmp(part.data(), whole.data(), whole.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(lp.data(), lw.data(), lw.size() * sizeof(float)) == 0);
    }
}

TEST_CASE("amx: decode-sized attention keeps the avx512 few-row path bit for bit", "[amx]") {
    std::mt19937 rng(37);
    const AttnCase c{2, 300, 9, 3, 64, KvDtype::f16, false};  // 2 tokens x 3 heads = 6 rows
    const AttnData d = make_attn(rng, c);
    std::vector<float> a(size_t(c.n_q) * c.H * c.D), b(a.size()), la(size_t(c.n_q) * c.H),
        lb(la.size());
    attention_isa(CpuIsa::avx512, params(c, d, 0, c.n_q, a.data(), la.data()), 2);
    attention_amx(params(c, d, 0, c.n_q, b.data(), lb.data()), 2, amx_tiles());
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)) == 0);
}
