// Stored-type kernels (kernels/cpu/quant_dot.h, native_matmul.h) on each CPU path against the
// reference: runtime/formats/dequant's scalar dequantization and dot products in double.
// Inputs are random rows quantized by the reference quantizers (Q6_K: random blocks), with
// lengths that are not multiples of the 2-block AVX-512 step or of the 8/16-float vectors.
//
// Tolerances (docs/style.md point 9):
//  - dequantization: every element within 2 ulp-ish (4e-7 relative to the block's largest
//    magnitude): both sides compute d * (code - offset) or d * code + m with one or two roundings;
//  - quantized dot vs the same dot in double on the kernel's own int8 activations (x^ = d * q):
//    integer block sums are exact, so only fp32 products and the sum of at most 64 block terms
//    round: |err| <= 1e-5 * S, S = sum |w_i x^_i| + max|w| * sum |x^_i| (the second term covers a
//    block's minimum/offset term, which cancels against its code term);
//  - quantized dot vs the dot with the exact fp32 x: the error of the activations themselves,
//    |x_i - x^_i| <= d_b / 2 per block b (round to nearest), so |err| <= sum_b (d_b / 2) *
//    sum_{i in b} |w_i|, plus the fp32 term above.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemm_amx.h"
#include "kernels/cpu/gemm_exact.h"
#include "kernels/cpu/native_matmul.h"
#include "kernels/cpu/quant_dot.h"
#include "runtime/core/half.h"
#include "runtime/formats/dequant.h"
#include "tests/cpu_paths/cpu_paths.h"

using namespace infoflow;
using namespace infoflow::cpu;

namespace {

// The paths this process can run (amx: the CPU's tiles, or the emulator in the amx variant of a
// test); each test that visits them leaves the one it was given in use (IsaScope).
std::vector<CpuIsa> isas() { return cpu_paths_runnable(); }

// The exact pass's relative bound on the amx path rounds x and w to bf16 (1.1 * 2^-8 of
// sum |x w|, docs/design.md §6 "Numerics per CPU path"); elsewhere fp32 (1e-5, this file's bar).
double exact_rel(NativePass pass) {
    return pass == NativePass::exact && active_cpu_isa() == CpuIsa::amx ? 1.1 / 256.0 : 1e-5;
}

const char* type_name(uint32_t t) {
    switch (t) {
        case ggml_id::f32:
            return "F32";
        case ggml_id::f16:
            return "F16";
        case ggml_id::bf16:
            return "BF16";
        case ggml_id::q4_0:
            return "Q4_0";
        case ggml_id::q4_1:
            return "Q4_1";
        case ggml_id::q5_0:
            return "Q5_0";
        case ggml_id::q5_1:
            return "Q5_1";
        case ggml_id::q8_0:
            return "Q8_0";
        case ggml_id::q6_k:
            return "Q6_K";
        default:
            return "?";
    }
}

std::vector<float> random_floats(std::mt19937& rng, size_t n, float scale) {
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = nd(rng);
    return v;
}

// `rows` random rows of k elements in `type`.
std::vector<uint8_t> random_rows(std::mt19937& rng, uint32_t type, int rows, int64_t k) {
    const size_t rb = native_row_bytes(type, k);
    std::vector<uint8_t> out(rb * size_t(rows));
    if (type == ggml_id::q6_k) {
        // Random codes and scales; d a moderate half so values stay in fp32 range.
        std::uniform_int_distribution<int> byte(0, 255), sc(-64, 63);
        std::uniform_real_distribution<float> dd(0.0005f, 0.002f);
        for (size_t b = 0; b < out.size() / 210; ++b) {
            uint8_t* blk = out.data() + b * 210;
            for (int i = 0; i < 192; ++i) blk[i] = uint8_t(byte(rng));
            for (int i = 0; i < 16; ++i) blk[192 + i] = uint8_t(int8_t(sc(rng)));
            const uint16_t h = fp32_to_fp16(dd(rng));
            std::memcpy(blk + 208, &h, 2);
        }
        return out;
    }
    for (int r = 0; r < rows; ++r) {
        std::vector<float> x = random_floats(rng, size_t(k), 0.05f);
        // A few outliers per row, as real weight rows have.
        x[size_t(r) % size_t(k)] = 0.4f;
        quantize_row(type, x.data(), out.data() + rb * size_t(r), k);
    }
    return out;
}

// The rows of a stored matrix ([rows, k] blocks) dequantized by the reference, [rows, k] fp32.
std::vector<float> dequantized(uint32_t type, const std::vector<uint8_t>& w, int rows, int k) {
    const size_t rb = native_row_bytes(type, k);
    std::vector<float> wf(size_t(rows) * k);
    for (int r = 0; r < rows; ++r)
        dequantize_row(type, w.data() + rb * r, wf.data() + size_t(r) * k, k);
    return wf;
}

std::vector<float> ref_dequant(uint32_t type, const uint8_t* row, int64_t k) {
    std::vector<float> v(static_cast<size_t>(k));
    dequantize_row(type, row, v.data(), k);
    return v;
}

const std::vector<uint32_t> kQuantTypes = {ggml_id::q4_0, ggml_id::q4_1, ggml_id::q5_0,
                                           ggml_id::q5_1, ggml_id::q8_0, ggml_id::q6_k};
const std::vector<uint32_t> kFloatTypes = {ggml_id::f32, ggml_id::f16, ggml_id::bf16};

// Lengths per block size: 1, 3, 7 blocks (odd: the AVX-512 pair loop's tail) and model widths.
std::vector<int64_t> lengths(uint32_t type) {
    if (type == ggml_id::q6_k) return {256, 768, 1536};
    return {32, 96, 224, 576, 1536};
}

// A plain (not row-grouped) NativeMatrix over `rows` stored rows of k elements.
NativeMatrix plain_matrix(uint32_t type, int rows, int64_t k, const uint8_t* data) {
    NativeMatrix nm;
    nm.type = type;
    nm.rows = rows;
    nm.cols = k;
    nm.row_bytes = native_row_bytes(type, k);
    nm.data = data;
    return nm;
}

}  // namespace

TEST_CASE("dequantize: each stored type on each CPU path matches the reference", "[quant]") {
    std::mt19937 rng(7);
    std::vector<uint32_t> types = kQuantTypes;
    types.insert(types.end(), kFloatTypes.begin(), kFloatTypes.end());
    for (const CpuIsa isa : isas()) {
        const QuantKernels& qk = quant_kernels(isa);
        for (const uint32_t type : types) {
            std::vector<int64_t> ks = lengths(type);
            if (!native_type_quantized(type)) ks = {1, 7, 15, 16, 17, 33, 100, 576};
            for (const int64_t k : ks) {
                const std::vector<uint8_t> w = random_rows(rng, type, 1, k);
                const std::vector<float> ref = ref_dequant(type, w.data(), k);
                std::vector<float> got(size_t(k), NAN);
                qk.dequantize(type, w.data(), got.data(), k);
                double amax = 0.0, err = 0.0;
                for (int64_t i = 0; i < k; ++i) {
                    amax = std::max(amax, double(std::fabs(ref[size_t(i)])));
                    err = std::max(err, double(std::fabs(got[size_t(i)] - ref[size_t(i)])));
                }
                INFO(cpu_isa_name(isa)
                     << " " << type_name(type) << " k=" << k << " err=" << err << " amax=" << amax);
                CHECK(err <= 4e-7 * amax);
            }
        }
    }
}

TEST_CASE("quantize_q8: activations within half a step, sums exact, on each CPU path", "[quant]") {
    std::mt19937 rng(11);
    for (const CpuIsa isa : isas()) {
        const QuantKernels& qk = quant_kernels(isa);
        for (const int64_t k : {32, 64, 96, 576}) {
            std::vector<float> x = random_floats(rng, size_t(k), 1.0f);
            if (k == 64) std::fill(x.begin() + 32, x.end(), 0.0f);  // an all-zero block
            std::vector<Q8Block> q(size_t(k / 32));
            qk.quantize_q8(x.data(), q.data(), k);
            for (int64_t b = 0; b < k / 32; ++b) {
                const Q8Block& y = q[size_t(b)];
                float amax = 0.0f;
                int lo = 0, hi = 0;
                for (int i = 0; i < 32; ++i)
                    amax = std::max(amax, std::fabs(x[size_t(32 * b + i)]));
                for (int i = 0; i < 32; ++i) (i < 16 ? lo : hi) += y.qs[i];
                INFO(cpu_isa_name(isa) << " k=" << k << " block " << b);
                CHECK(y.d == Approx(amax / 127.0f).epsilon(1e-6));
                CHECK(y.sum_lo == lo);
                CHECK(y.sum_hi == hi);
                CHECK(y.ds == Approx(y.d * float(lo + hi)).epsilon(1e-6).margin(1e-30));
                for (int i = 0; i < 32; ++i) {
                    const float xi = x[size_t(32 * b + i)];
                    REQUIRE(std::fabs(xi - y.d * float(y.qs[i])) <= 0.5f * y.d * 1.0001f + 1e-30f);
                }
            }
        }
    }
}

TEST_CASE("dot_q8: each quantized type on each CPU path against double dots", "[quant]") {
    std::mt19937 rng(3);
    for (const CpuIsa isa : isas()) {
        const QuantKernels& qk = quant_kernels(isa);
        for (const uint32_t type : kQuantTypes) {
            for (const int64_t k : lengths(type)) {
                for (int rep = 0; rep < 4; ++rep) {
                    const std::vector<uint8_t> w = random_rows(rng, type, 1, k);
                    const std::vector<float> wf = ref_dequant(type, w.data(), k);
                    const std::vector<float> x = random_floats(rng, size_t(k), 1.0f);
                    std::vector<Q8Block> xq(size_t(k / 32));
                    qk.quantize_q8(x.data(), xq.data(), k);
                    const double got = qk.dot_q8(type, w.data(), xq.data(), k);

                    double ref_hat = 0.0, ref_x = 0.0, s = 0.0, sum_xhat = 0.0, wmax = 0.0;
                    double act_bound = 0.0;
                    for (int64_t b = 0; b < k / 32; ++b) {
                        double wsum = 0.0;
                        for (int i = 0; i < 32; ++i) {
                            const size_t j = size_t(32 * b + i);
                            const double xh = double(xq[size_t(b)].d) * xq[size_t(b)].qs[i];
                            ref_hat += double(wf[j]) * xh;
                            ref_x += double(wf[j]) * x[j];
                            s += std::fabs(wf[j] * xh);
                            sum_xhat += std::fabs(xh);
                            wmax = std::max(wmax, double(std::fabs(wf[j])));
                            wsum += std::fabs(wf[j]);
                        }
                        act_bound += 0.5 * xq[size_t(b)].d * wsum;
                    }
                    const double fp_tol = 1e-5 * (s + wmax * sum_xhat);
                    INFO(cpu_isa_name(isa)
                         << " " << type_name(type) << " k=" << k << " rep " << rep << ": got "
                         << got << " ref(x^) " << ref_hat << " ref(x) " << ref_x << " tol "
                         << fp_tol << " / " << act_bound);
                    CHECK(std::fabs(got - ref_hat) <= fp_tol);
                    CHECK(std::fabs(got - ref_x) <= act_bound + fp_tol);
                }
            }
        }
    }
}

TEST_CASE("row groups: interleaving is a permutation of the bytes that gather undoes", "[quant]") {
    std::mt19937 rng(19);
    for (const uint32_t type : {ggml_id::q4_0, ggml_id::q4_1, ggml_id::q8_0}) {
        REQUIRE(row_group_supported(type));
        for (const int64_t k : lengths(type)) {
            const int rows = 3 * kRowGroup;
            const std::vector<uint8_t> plain = random_rows(rng, type, rows, k);
            std::vector<uint8_t> grouped = plain;
            interleave_row_groups(type, grouped.data(), rows, k);
            INFO(type_name(type) << " k=" << k);
            if (k > 32) CHECK(grouped != plain);  // one block per row: d's alone move
            std::vector<uint8_t> a = plain, b = grouped;
            std::sort(a.begin(), a.end());
            std::sort(b.begin(), b.end());
            CHECK(a == b);
            const size_t rb = native_row_bytes(type, k);
            std::vector<uint8_t> row(rb);
            for (int r = 0; r < rows; ++r) {
                gather_grouped_row(type, grouped.data(), r, k, row.data());
                REQUIRE(std::memcmp(row.data(), plain.data() + rb * size_t(r), rb) == 0);
            }
        }
    }
    for (const uint32_t type : {ggml_id::q5_0, ggml_id::q6_k, ggml_id::f16})
        CHECK_FALSE(row_group_supported(type));
    std::vector<uint8_t> odd = random_rows(rng, ggml_id::q4_1, 6, 64);
    CHECK_THROWS_WITH(interleave_row_groups(ggml_id::q4_1, odd.data(), 6, 64),
                      Catch::Contains("6 rows are not a multiple of 4"));
}

TEST_CASE("dot_q8_group and dot_f32_group: each grouped type on each CPU path against the rows",
          "[quant]") {
    std::mt19937 rng(23);
    for (const CpuIsa isa : isas()) {
        const QuantKernels& qk = quant_kernels(isa);
        for (const uint32_t type : {ggml_id::q4_0, ggml_id::q4_1, ggml_id::q8_0}) {
            for (const int64_t k : lengths(type)) {
                const std::vector<uint8_t> plain = random_rows(rng, type, kRowGroup, k);
                std::vector<uint8_t> grouped = plain;
                interleave_row_groups(type, grouped.data(), kRowGroup, k);
                const size_t rb = native_row_bytes(type, k);
                const std::vector<float> x = random_floats(rng, size_t(k), 1.0f);
                std::vector<Q8Block> xq(size_t(k / 32));
                qk.quantize_q8(x.data(), xq.data(), k);
                float got_q8[kRowGroup], got_f32[kRowGroup];
                qk.dot_q8_group(type, grouped.data(), xq.data(), k, 1, got_q8, kRowGroup);
                qk.dot_f32_group(type, grouped.data(), x.data(), k, k, 1, got_f32, kRowGroup);
                for (int r = 0; r < kRowGroup; ++r) {
                    const std::vector<float> wf = ref_dequant(type, plain.data() + rb * r, k);
                    // Against double dots on x^ (quantized) and on x (fp32), with the fp32
                    // rounding bound of test "dot_q8" (S covers the offset/minimum terms).
                    double ref_hat = 0.0, ref_x = 0.0, s_hat = 0.0, s_x = 0.0, wmax = 0.0;
                    double sum_xhat = 0.0, sum_x = 0.0;
                    for (int64_t b = 0; b < k / 32; ++b) {
                        for (int i = 0; i < 32; ++i) {
                            const size_t j = size_t(32 * b + i);
                            const double xh = double(xq[size_t(b)].d) * xq[size_t(b)].qs[i];
                            ref_hat += double(wf[j]) * xh;
                            ref_x += double(wf[j]) * x[j];
                            s_hat += std::fabs(wf[j] * xh);
                            s_x += std::fabs(double(wf[j]) * x[j]);
                            sum_xhat += std::fabs(xh);
                            sum_x += std::fabs(x[j]);
                            wmax = std::max(wmax, double(std::fabs(wf[j])));
                        }
                    }
                    INFO(cpu_isa_name(isa) << " " << type_name(type) << " k=" << k << " row " << r
                                           << ": q8 " << got_q8[r] << " vs " << ref_hat << ", f32 "
                                           << got_f32[r] << " vs " << ref_x);
                    CHECK(std::fabs(got_q8[r] - ref_hat) <= 1e-5 * (s_hat + wmax * sum_xhat));
                    CHECK(std::fabs(got_f32[r] - ref_x) <= 1e-5 * (s_x + wmax * sum_x));
                    // The row kernel on the plain row: the same value up to fp32 reordering.
                    const double row_q8 = qk.dot_q8(type, plain.data() + rb * r, xq.data(), k);
                    CHECK(std::fabs(got_q8[r] - row_q8) <= 2e-5 * (s_hat + wmax * sum_xhat));
                }
            }
        }
    }
}

TEST_CASE("dot_f32: F32, F16 and BF16 rows on each CPU path against double dots", "[quant]") {
    std::mt19937 rng(5);
    for (const CpuIsa isa : isas()) {
        const QuantKernels& qk = quant_kernels(isa);
        for (const uint32_t type : kFloatTypes) {
            for (const int64_t k : {1, 7, 8, 15, 17, 31, 33, 100, 576}) {
                const std::vector<uint8_t> w = random_rows(rng, type, 1, k);
                const std::vector<float> wf = ref_dequant(type, w.data(), k);
                const std::vector<float> x = random_floats(rng, size_t(k), 1.0f);
                double ref = 0.0, s = 0.0;
                for (int64_t i = 0; i < k; ++i) {
                    ref += double(wf[size_t(i)]) * x[size_t(i)];
                    s += std::fabs(double(wf[size_t(i)]) * x[size_t(i)]);
                }
                const double got = qk.dot_f32(type, w.data(), x.data(), k);
                INFO(cpu_isa_name(isa) << " " << type_name(type) << " k=" << k);
                CHECK(std::fabs(got - ref) <= 1e-5 * s + 1e-30);
            }
        }
    }
}

TEST_CASE("native_matmul: every type and row count on each CPU path vs double GEMM", "[quant]") {
    std::mt19937 rng(13);
    auto be = make_cpu_backend(2);
    for (const CpuIsa isa : isas()) {
        const test::IsaScope on_path(cpu_isa_name(isa));
        for (const uint32_t type : {ggml_id::q4_1, ggml_id::q8_0, ggml_id::q6_k, ggml_id::f16}) {
            const int k = type == ggml_id::q6_k ? 512 : 96;
            // m: not a multiple of 16 rows; n: 1 to beyond the 32-token block.
            for (const int m : {37, 300}) {
                for (const int n : {1, 3, 16, 17, 70}) {
                    // exact (fp32 x, every pass but decode), decode (8-bit x for quantized types)
                    // and decode_fp32 (the LM head's decode steps, fp32 x).
                    for (const NativePass pass :
                         {NativePass::exact, NativePass::decode, NativePass::decode_fp32}) {
                        const std::vector<uint8_t> w = random_rows(rng, type, m, k);
                        const size_t rb = native_row_bytes(type, k);
                        const std::vector<float> wf = dequantized(type, w, m, k);
                        const std::vector<float> x = random_floats(rng, size_t(n) * k, 1.0f);
                        const std::vector<float> bias = random_floats(rng, size_t(m), 1.0f);
                        const std::vector<float> prev = random_floats(rng, size_t(n) * m, 1.0f);
                        // The same matrix in row groups, where its type and row count allow.
                        const bool grouped = row_group_supported(type) && m % kRowGroup == 0;
                        std::vector<uint8_t> wg = w;
                        if (grouped) interleave_row_groups(type, wg.data(), m, k);
                        NativeMatrix nm;
                        nm.type = type;
                        nm.rows = m;
                        nm.cols = k;
                        nm.row_bytes = rb;
                        nm.data = w.data();
                        nm.pass = pass;
                        std::vector<float> out = prev;
                        be->matmul_native(x.data(), nm, bias.data(), n, out.data(), true);
                        std::vector<float> out_g = prev;
                        if (grouped) {
                            nm.data = wg.data();
                            nm.row_group = kRowGroup;
                            be->matmul_native(x.data(), nm, bias.data(), n, out_g.data(), true);
                        }
                        // Quantized types quantize x in decode steps (bound of test "dot_q8").
                        const bool q8 = native_type_quantized(type) && pass == NativePass::decode;
                        double worst = 0.0;
                        for (int i = 0; i < n; ++i) {
                            const float* xi = x.data() + size_t(i) * k;
                            double xmax = 0.0;
                            for (int c = 0; c < k; ++c)
                                xmax = std::max(xmax, double(std::fabs(xi[c])));
                            for (int j = 0; j < m; ++j) {
                                const float* wj = wf.data() + size_t(j) * k;
                                double ref = 0.0, s = 0.0;
                                for (int c = 0; c < k; ++c) {
                                    ref += double(wj[c]) * xi[c];
                                    s += std::fabs(double(wj[c]));
                                }
                                const double want = ref + bias[size_t(j)] + prev[size_t(i) * m + j];
                                // Activation step <= max|x| / 127 per block, half of it per
                                // element.
                                const double tol = (q8 ? 0.5 * xmax / 127.0 * s * 1.001 : 0.0) +
                                                   exact_rel(pass) * (s * xmax + 2.0);
                                const double err = std::fabs(out[size_t(i) * m + j] - want);
                                worst = std::max(worst, err / tol);
                                if (grouped) {
                                    const double eg = std::fabs(out_g[size_t(i) * m + j] - want);
                                    worst = std::max(worst, eg / tol);
                                }
                            }
                        }
                        INFO(cpu_isa_name(isa)
                             << " " << type_name(type) << " m=" << m << " n=" << n << " k=" << k
                             << (grouped ? " (and row groups)" : "") << " pass " << int(pass)
                             << " worst err/tol " << worst);
                        CHECK(worst <= 1.0);
                    }
                }
            }
        }
    }
}

TEST_CASE("native_matmul: a token's outputs are the same bits whatever batch, offset and threads",
          "[quant]") {
    // The oracle of docs/design.md §6.4 at the kernel level. The exact pass equals
    // gemm_exact_ref (plain fmaf loops) on the rows the active path dequantizes, bit for bit, and
    // each token of a batch of n, run alone, in batches of 3, 5 and 17 at other offsets and on 1
    // or 2 threads, gets exactly the bits it gets in the whole batch; so do the decode passes.
    // (Before, batches of <= 16 rows took 8-bit activation dots and larger ones a dequantized
    // fp32 GEMM whose rounding depended on the batch.)
    std::mt19937 rng(31);
    for (const CpuIsa isa : isas()) {
        const test::IsaScope on_path(cpu_isa_name(isa));
        const QuantKernels& qk = quant_kernels(isa);
        for (const uint32_t type : {ggml_id::q4_0, ggml_id::q4_1, ggml_id::q5_1, ggml_id::q8_0,
                                    ggml_id::q6_k, ggml_id::f16, ggml_id::bf16, ggml_id::f32}) {
            // k: two gemm chunks and a part (kGemmChunk = 512); m: not a multiple of 12 or 16.
            const int k = type == ggml_id::q6_k ? 1280 : 1184, m = 76, n = 41;
            for (const NativePass pass :
                 {NativePass::exact, NativePass::decode, NativePass::decode_fp32}) {
                for (const bool grouped : {false, true}) {
                    if (grouped && !row_group_supported(type)) continue;
                    const std::vector<uint8_t> plain = random_rows(rng, type, m, k);
                    std::vector<uint8_t> w = plain;
                    if (grouped) interleave_row_groups(type, w.data(), m, k);
                    NativeMatrix nm = plain_matrix(type, m, k, w.data());
                    nm.row_group = grouped ? kRowGroup : 1;
                    nm.pass = pass;
                    const std::vector<float> x = random_floats(rng, size_t(n) * k, 1.0f);
                    const std::vector<float> bias = random_floats(rng, size_t(m), 1.0f);
                    std::vector<float> whole(size_t(n) * m);
                    make_cpu_backend(2)->matmul_native(x.data(), nm, bias.data(), n, whole.data(),
                                                       false);
                    INFO(cpu_isa_name(isa) << " " << type_name(type) << (grouped ? " grouped" : "")
                                           << " pass " << int(pass));
                    if (pass == NativePass::exact) {
                        const size_t rb = native_row_bytes(type, k);
                        std::vector<float> wf(size_t(m) * k), ref(size_t(n) * m);
                        for (int r = 0; r < m; ++r)
                            qk.dequantize(type, plain.data() + rb * r, wf.data() + size_t(r) * k,
                                          k);
                        // On amx the tiles' sequence (gemm_amx_ref), elsewhere gemm_exact_ref's.
                        if (isa == CpuIsa::amx) {
                            gemm_amx_ref(x.data(), n, k, m, wf.data(), bias.data(), ref.data(),
                                         false);
                        } else {
                            gemm_exact_ref(x.data(), n, k, m, wf.data(), bias.data(), ref.data(),
                                           false);
                        }
                        CHECK(std::memcmp(ref.data(), whole.data(), ref.size() * sizeof(float)) ==
                              0);
                    }
                    int mismatched = 0;
                    for (const int threads : {1, 2}) {
                        auto be = make_cpu_backend(threads);
                        for (const int batch : {1, 3, 5, 17}) {
                            for (int i0 = 0; i0 < n; i0 += batch) {
                                const int nb = std::min(batch, n - i0);
                                std::vector<float> part(size_t(nb) * m);
                                be->matmul_native(x.data() + size_t(i0) * k, nm, bias.data(), nb,
                                                  part.data(), false);
                                if (std::memcmp(part.data(), whole.data() + size_t(i0) * m,
                                                part.size() * sizeof(float)) != 0)
                                    ++mismatched;
                            }
                        }
                    }
                    CHECK(mismatched == 0);
                }
            }
        }
    }
}

TEST_CASE("gemm_exact: the AVX2 and AVX-512 tiles give the reference's bits", "[quant]") {
    // Each lane of either tile is one (row, token) FMA chain: the two paths agree with
    // gemm_exact_ref, and so with each other, for every tile shape (rows 1..13, tokens 1..70,
    // chunks of 512 and a remainder) and with accumulate and bias.
    std::mt19937 rng(37);
    struct Fp32Rows : GemmRows {
        const float* w;
        int k;
        const float* fetch(int j0, int, int c0, int, float*, int64_t* ld) const override {
            *ld = k;
            return w + size_t(j0) * k + c0;
        }
    };
    for (const CpuIsa isa : isas()) {
        const test::IsaScope on_path(cpu_isa_name(isa));
        for (const int k : {1, 31, 512, 1100}) {
            for (const int m : {1, 7, 13, 50}) {
                for (const int n : {1, 15, 33, 70}) {
                    const std::vector<float> w = random_floats(rng, size_t(m) * k, 1.0f);
                    const std::vector<float> x = random_floats(rng, size_t(n) * k, 1.0f);
                    const std::vector<float> bias = random_floats(rng, size_t(m), 1.0f);
                    const std::vector<float> prev = random_floats(rng, size_t(n) * m, 1.0f);
                    std::vector<float> ref = prev, got = prev;
                    gemm_exact_ref(x.data(), n, k, m, w.data(), bias.data(), ref.data(), true);
                    Fp32Rows rows;
                    rows.w = w.data();
                    rows.k = k;
                    gemm_exact(x.data(), n, k, m, rows, bias.data(), got.data(), true, 2);
                    INFO(cpu_isa_name(isa) << " k=" << k << " m=" << m << " n=" << n);
                    CHECK(std::memcmp(ref.data(), got.data(), ref.size() * sizeof(float)) == 0);
                }
            }
        }
    }
}

TEST_CASE("native_matmul: long rows on 1 and 2 threads vs double GEMM", "[quant]") {
    // k = 16640 (520 blocks): the per-block scale products and the fp32 accumulation over a long
    // row stay within the bound of test "dot_q8"; both thread counts give the same bits.
    std::mt19937 rng(29);
    const int m = 300, k = 16640, n = 19;
    for (const uint32_t type : {ggml_id::q4_1, ggml_id::f16}) {
        const std::vector<uint8_t> w = random_rows(rng, type, m, k);
        const std::vector<float> wf = dequantized(type, w, m, k);
        const std::vector<float> x = random_floats(rng, size_t(n) * k, 1.0f);
        const NativeMatrix nm = plain_matrix(type, m, k, w.data());
        const bool q8 = native_type_quantized(type);
        std::vector<float> first;
        for (const int threads : {1, 2}) {
            auto be = make_cpu_backend(threads);
            std::vector<float> out(size_t(n) * m, 7.0f);
            be->matmul_native(x.data(), nm, nullptr, n, out.data(), false);
            double worst = 0.0;
            for (int i = 0; i < n; ++i) {
                const float* xi = x.data() + size_t(i) * k;
                double xmax = 0.0;
                for (int c = 0; c < k; ++c) xmax = std::max(xmax, double(std::fabs(xi[c])));
                for (int j = 0; j < m; ++j) {
                    double ref = 0.0, s = 0.0;
                    for (int c = 0; c < k; ++c) {
                        ref += double(wf[size_t(j) * k + c]) * xi[c];
                        s += std::fabs(double(wf[size_t(j) * k + c]));
                    }
                    const double tol = (q8 ? 0.5 * xmax / 127.0 * s * 1.001 : 0.0) +
                                       exact_rel(nm.pass) * (s * xmax + 2.0);
                    worst = std::max(worst, std::fabs(out[size_t(i) * m + j] - ref) / tol);
                }
            }
            INFO(type_name(type) << " " << threads << " threads, worst err/tol " << worst);
            CHECK(worst <= 1.0);
            if (first.empty()) {
                first = out;
            } else {
                CHECK(std::memcmp(first.data(), out.data(), out.size() * sizeof(float)) == 0);
            }
        }
    }
}

TEST_CASE("native_embed: rows of a stored table as the reference dequantizes them", "[quant]") {
    std::mt19937 rng(17);
    for (const CpuIsa isa : isas()) {
        const test::IsaScope on_path(cpu_isa_name(isa));
        const int rows = 50, k = 64;
        const std::vector<uint8_t> t = random_rows(rng, ggml_id::q8_0, rows, k);
        const size_t rb = native_row_bytes(ggml_id::q8_0, k);
        NativeMatrix nm = plain_matrix(ggml_id::q8_0, rows, k, t.data());
        const std::vector<int32_t> ids = {0, 49, 7, 7};
        std::vector<float> out(ids.size() * k);
        native_embed(nm, ids.data(), int(ids.size()), out.data());
        for (size_t i = 0; i < ids.size(); ++i) {
            const std::vector<float> ref = ref_dequant(ggml_id::q8_0, t.data() + rb * ids[i], k);
            for (int c = 0; c < k; ++c) REQUIRE(out[i * k + c] == ref[size_t(c)]);
        }
        const int32_t bad = rows;
        CHECK_THROWS_WITH(native_embed(nm, &bad, 1, out.data()), Catch::Contains("token id 50"));
        // The same table in row groups (48 of its rows: a whole number of groups).
        std::vector<uint8_t> tg(t.begin(), t.begin() + 48 * rb);
        interleave_row_groups(ggml_id::q8_0, tg.data(), 48, k);
        nm.rows = 48;
        nm.data = tg.data();
        nm.row_group = kRowGroup;
        const std::vector<int32_t> gids = {0, 47, 5, 6, 7};
        std::vector<float> gout(gids.size() * k);
        native_embed(nm, gids.data(), int(gids.size()), gout.data());
        for (size_t i = 0; i < gids.size(); ++i) {
            const std::vector<float> ref = ref_dequant(ggml_id::q8_0, t.data() + rb * gids[i], k);
            for (int c = 0; c < k; ++c) REQUIRE(gout[i * k + c] == ref[size_t(c)]);
        }
    }
}
