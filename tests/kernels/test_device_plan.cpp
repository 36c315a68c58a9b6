// Host-side logic of the device backends (kernels/device_plan.h) against hand-computed cases:
// argument checks and resolved defaults, index packing, and the column-major GEMM mapping (run
// through a naive column-major GEMM and compared with the row-major definition).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../gpu_flashinfer/host/paper_shapes.h"
#include "kernels/backend.h"
#include "kernels/device_plan.h"
#include "kernels/random_init.h"
#include "runtime/core/error.h"

using namespace infoflow;

namespace {

AttnParams good_attn() {
    static float buf[1];
    static int32_t pos[1];
    AttnParams p;
    p.q = p.k = p.v = buf;
    p.out = buf;
    p.q_pos = p.k_pos = pos;
    p.n_q = 1;
    p.n_kv = 1;
    p.n_head = 8;
    p.n_head_kv = 2;
    p.head_dim = 64;
    return p;
}

// Column-major C[M, N] = op(A) op(B), as BLAS defines it.
void gemm_colmajor(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B,
                   int ldb, float* C, int ldc) {
    for (int i = 0; i < M; ++i) {
        for (int j = 0; j < N; ++j) {
            double acc = 0.0;
            for (int l = 0; l < K; ++l) {
                const float a = ta ? A[l + size_t(i) * lda] : A[i + size_t(l) * lda];
                const float b = tb ? B[j + size_t(l) * ldb] : B[l + size_t(j) * ldb];
                acc += double(a) * b;
            }
            C[i + size_t(j) * ldc] = float(acc);
        }
    }
}

}  // namespace

TEST_CASE("device plan: attention arguments resolve defaults and reject bad shapes", "[plan]") {
    AttnParams p = good_attn();
    AttnShape s = check_attention_args(p, 512);
    CHECK(s.group == 4);
    CHECK(s.stride == 128);  // n_head_kv * head_dim
    CHECK(s.scale == Approx(0.125f));
    p.kv_stride = 300;
    p.scale = 0.5f;
    s = check_attention_args(p, 512);
    CHECK(s.stride == 300);
    CHECK(s.scale == 0.5f);

    p = good_attn();
    p.n_head = 5;  // not a multiple of n_head_kv = 2
    CHECK_THROWS_WITH(check_attention_args(p, 512), Catch::Contains("n_head 5"));
    p = good_attn();
    p.head_dim = 600;
    CHECK_THROWS_WITH(check_attention_args(p, 512), Catch::Contains("head_dim 600"));
    p = good_attn();
    p.kv_stride = 100;  // < 2 * 64
    CHECK_THROWS_WITH(check_attention_args(p, 512), Catch::Contains("kv_stride 100"));
    p = good_attn();
    p.k_pos = nullptr;
    CHECK_THROWS_WITH(check_attention_args(p, 512), Catch::Contains("k_pos"));
    p.n_kv = 0;  // no keys: k_pos not needed
    CHECK_NOTHROW(check_attention_args(p, 512));
    p = good_attn();
    p.out = nullptr;
    CHECK_THROWS_WITH(check_attention_args(p, 512), Catch::Contains("out"));

    // 16-bit K/V: k16 and v16 are the pointers that must be there, k and v may be null.
    p = good_attn();
    static uint16_t half_buf[1];
    p.kv_dtype = KvDtype::bf16;
    p.k = p.v = nullptr;
    p.k16 = p.v16 = half_buf;
    CHECK_NOTHROW(check_attention_args(p, 512));
    p.v16 = nullptr;
    CHECK_THROWS_WITH(check_attention_args(p, 512), Catch::Contains("v16 is required"));
    p.v16 = half_buf;
    p.k16 = nullptr;
    CHECK_THROWS_WITH(check_attention_args(p, 512), Catch::Contains("k16 and k_pos"));

    ScoreParams sp;
    static float buf[1];
    static int32_t pos[1];
    sp.q = sp.k = sp.lse = sp.col = buf;
    sp.q_pos = sp.k_pos = pos;
    sp.n_q = 2;
    sp.n_cols = 3;
    sp.n_head = 4;
    sp.n_head_kv = 4;
    sp.head_dim = 16;
    s = check_score_args(sp, 512);
    CHECK(s.group == 1);
    CHECK(s.stride == 64);
    CHECK(s.scale == 0.25f);
    sp.lse = nullptr;
    CHECK_THROWS_WITH(check_score_args(sp, 512), Catch::Contains("lse"));
    sp.lse = buf;
    sp.kv_dtype = KvDtype::f16;
    sp.k = nullptr;
    sp.k16 = half_buf;
    CHECK_NOTHROW(check_score_args(sp, 512));
}

TEST_CASE("device plan: index arrays pack back to back at aligned offsets", "[plan]") {
    const std::vector<int32_t> a = {5, -1, 7};
    const std::vector<int32_t> b(17, 3);
    const std::vector<int32_t> c = {-9};
    const std::vector<IndexArray> arrays = {
        {a.data(), a.size()}, {nullptr, 40}, {b.data(), b.size()}, {c.data(), c.size()}};
    const IndexPack plan = plan_index_pack(arrays);
    REQUIRE(plan.offset.size() == 4);
    CHECK(plan.offset[0] == 0);
    CHECK(plan.offset[1] == SIZE_MAX);  // absent: no room
    CHECK(plan.offset[2] == 16);        // 3 rounded up to 16
    CHECK(plan.offset[3] == 48);        // 16 + 17 rounded up to 32
    CHECK(plan.total == 64);
    std::vector<int32_t> block(plan.total, 1234);
    pack_indices(arrays, plan, block.data());
    CHECK(std::vector<int32_t>(block.begin(), block.begin() + 3) == a);
    CHECK(block[3] == 1234);  // padding untouched
    CHECK(std::vector<int32_t>(block.begin() + 16, block.begin() + 33) == b);
    CHECK(block[48] == -9);

    CHECK(plan_index_pack({}).total == 0);
    CHECK(plan_index_pack({{nullptr, 5}}).total == 0);
}

TEST_CASE("device plan: the column-major GEMM plan computes x W^T", "[plan]") {
    for (const auto& shape :
         std::vector<std::vector<int>>{{1, 1, 1}, {3, 5, 7}, {8, 16, 4}, {17, 33, 9}}) {
        const int n = shape[0], k = shape[1], m = shape[2];
        std::vector<float> x(size_t(n) * k), w(size_t(m) * k);
        for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 7 % 11) - 5);
        for (size_t i = 0; i < w.size(); ++i) w[i] = float(int(i * 5 % 13) - 6);
        const GemmPlan g = plan_row_major_matmul(n, k, m);
        std::vector<float> out(size_t(n) * m, NAN);
        // A = W, B = x, as the CUDA backend passes them.
        gemm_colmajor(g.trans_a, g.trans_b, g.M, g.N, g.K, w.data(), g.lda, x.data(), g.ldb,
                      out.data(), g.ldc);
        for (int i = 0; i < n; ++i) {
            for (int j = 0; j < m; ++j) {
                double want = 0.0;
                for (int l = 0; l < k; ++l)
                    want += double(x[size_t(i) * k + l]) * w[size_t(j) * k + l];
                INFO("n " << n << " k " << k << " m " << m << " at " << i << "," << j);
                CHECK(out[size_t(i) * m + j] == float(want));
            }
        }
    }
    CHECK_THROWS_WITH(plan_row_major_matmul(2, 0, 3), Catch::Contains("bad sizes"));
}

TEST_CASE("random_init: counter-based values match the sequential splitmix64 stream", "[plan]") {
    // The generator was a sequential splitmix64 stream started at the key, first output
    // discarded; the counter form must give the same numbers.
    const uint64_t key = 0x1234567890abcdefull;
    uint64_t state = key;
    auto next = [&state] {
        uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    };
    next();
    const float scale = 1.0f / 65536.0f;
    for (uint64_t i = 0; i < 1000; ++i) {
        const uint64_t r = next();
        const uint32_t sum = uint32_t(r & 0xFFFF) + uint32_t((r >> 16) & 0xFFFF) +
                             uint32_t((r >> 32) & 0xFFFF) + uint32_t(r >> 48);
        const float want = (float(sum) + 2.0f - 131072.0f) * scale;
        REQUIRE(random_weight(key, i, scale) == want);
    }
}

TEST_CASE("backend factory: cuda_device_count and the cuda backend without a device", "[plan]") {
    const int n = cuda_device_count();
    CHECK(n >= 0);
    if (n == 0) {
        // Not built, or built with no device: a clear error, never a crash.
        CHECK_THROWS_WITH(make_backend("cuda", 1), Catch::Contains("cuda"));
    }
    CHECK_THROWS_WITH(make_backend("tpu", 1), Catch::Contains("unknown backend 'tpu'"));
    CHECK(make_backend("cpu", 1)->stream() == nullptr);
}

TEST_CASE("device plan: the paper's GEMMs map onto int BLAS dimensions", "[plan]") {
    // Projections and FFN on all N rows of a single-GPU 32K prefill, the LM head on the last row:
    // every dimension and leading dimension an int, the output's elements far within size_t.
    for (const test::PaperShape& m : test::kPaperShapes) {
        for (int n : {8192, 16384, 32768}) {
            for (const auto& s : std::vector<std::vector<int>>{{n, m.n_embd, m.n_head * m.head_dim},
                                                               {n, m.n_embd, m.n_ff},
                                                               {n, m.n_ff, m.n_embd},
                                                               {1, m.n_embd, m.n_vocab}}) {
                CAPTURE(m.name, s[0], s[1], s[2]);
                const GemmPlan g = plan_row_major_matmul(s[0], s[1], s[2]);
                CHECK(g.M == s[2]);
                CHECK(g.N == s[0]);
                CHECK(g.K == s[1]);
                CHECK(g.lda == s[1]);
                CHECK(g.ldb == s[1]);
                CHECK(g.ldc == s[2]);
                CHECK(uint64_t(g.ldc) * uint64_t(g.N) < (uint64_t(1) << 40));
            }
        }
    }
}
