// GPU op throughput on one device: bf16 GEMM through cuBLASLt (bf16 in, fp32 compute; bf16 and
// fp32 output) and attention through the FlashInfer kernels (dense causal prefill, the
// custom-mask sparse-query recompute, decode). Each measurement: warm-up, then N runs timed
// one by one with CUDA events; the table shows median, min and max, then one JSON line per
// measurement (nccl-tests style). Exits 77 when no CUDA device is present.
//
// Usage: bench_gpu_ops [--runs 20] [--warmup 3] [--gemm 8192x4096x4096] [--tokens 8192]
//                      [--heads 32/8] [--head-dim 128] [--select 0.15]
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/attn_mask.h"
#include "kernels/cuda/flashinfer_attention.h"

using namespace infoflow;

namespace {

void cuda_check(cudaError_t e, const char* what, int line) {
    if (e != cudaSuccess) {
        throw std::runtime_error(std::string("bench_gpu_ops.cpp:") + std::to_string(line) + ": " +
                                 what + ": " + cudaGetErrorString(e));
    }
}
void cublas_check(cublasStatus_t s, const char* what, int line) {
    if (s != CUBLAS_STATUS_SUCCESS) {
        throw std::runtime_error(std::string("bench_gpu_ops.cpp:") + std::to_string(line) + ": " +
                                 what + ": cuBLAS status " + std::to_string(int(s)));
    }
}
#define CUDA_CHECK(x) cuda_check((x), #x, __LINE__)
#define CUBLAS_CHECK(x) cublas_check((x), #x, __LINE__)

struct DevBuf {
    void* ptr = nullptr;
    explicit DevBuf(size_t n) {
        if (n) CUDA_CHECK(cudaMalloc(&ptr, n));
    }
    ~DevBuf() {
        if (ptr) cudaFree(ptr);
    }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
};

// Random bf16 bits in [-1, 1) (upper half of an fp32), uploaded.
void fill_bf16(DevBuf& d, size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<uint16_t> h(n);
    for (auto& x : h) {
        const float f = u(rng);
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        x = uint16_t(bits >> 16);
    }
    CUDA_CHECK(cudaMemcpy(d.ptr, h.data(), n * 2, cudaMemcpyHostToDevice));
}

struct Stats {
    double median = 0, min = 0, max = 0;
};

// Times `fn` (which enqueues work on `stream`) `runs` times after `warmup` untimed calls.
template <typename Fn>
Stats time_ms(Fn fn, cudaStream_t stream, int warmup, int runs) {
    for (int i = 0; i < warmup; ++i) fn();
    CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    std::vector<double> ms;
    for (int i = 0; i < runs; ++i) {
        CUDA_CHECK(cudaEventRecord(a, stream));
        fn();
        CUDA_CHECK(cudaEventRecord(b, stream));
        CUDA_CHECK(cudaEventSynchronize(b));
        float t = 0;
        CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(ms.begin(), ms.end());
    Stats s;
    const size_t n = ms.size();
    s.median = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
    s.min = ms.front();
    s.max = ms.back();
    return s;
}

struct Row {
    std::string op, shape, kernel;
    double flop = 0;
    Stats ms;
};

// out[n_tok, n_out] = x[n_tok, k] w[n_out, k]^T: column-major D[n_out, n_tok] = W^T(op T) X.
Row bench_gemm(int n_tok, int n_out, int k, bool fp32_out, cudaStream_t stream, int warmup,
               int runs) {
    cublasLtHandle_t lt;
    CUBLAS_CHECK(cublasLtCreate(&lt));
    DevBuf w(size_t(n_out) * k * 2), x(size_t(n_tok) * k * 2);
    DevBuf d(size_t(n_out) * n_tok * (fp32_out ? 4 : 2));
    fill_bf16(w, size_t(n_out) * k, 1);
    fill_bf16(x, size_t(n_tok) * k, 2);
    const size_t ws_bytes = size_t(64) << 20;
    DevBuf ws(ws_bytes);
    cublasLtMatmulDesc_t op;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    const cudaDataType_t out_t = fp32_out ? CUDA_R_32F : CUDA_R_16BF;
    cublasLtMatrixLayout_t la, lb, ld;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, n_out, k));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, n_tok, k));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, out_t, n_out, n_tok, n_out));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &heur, &found));
    if (found == 0) throw std::runtime_error("cuBLASLt found no algorithm for the bf16 GEMM");
    const float alpha = 1.0f, beta = 0.0f;
    Row r;
    r.op = fp32_out ? "gemm bf16->fp32" : "gemm bf16->bf16";
    r.shape = std::to_string(n_tok) + "x" + std::to_string(n_out) + "x" + std::to_string(k);
    r.kernel = "cublasLt";
    r.flop = 2.0 * n_tok * n_out * double(k);
    r.ms = time_ms(
        [&] {
            CUBLAS_CHECK(cublasLtMatmul(lt, op, &alpha, w.ptr, la, x.ptr, lb, &beta, d.ptr, ld,
                                        d.ptr, ld, &heur.algo, ws.ptr, ws_bytes, stream));
        },
        stream, warmup, runs);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(lt);
    return r;
}

struct AttnShape {
    int n_head = 32, n_head_kv = 8, head_dim = 128;
};

// Attention of n_q queries over n_kv keys. mode "causal" (queries = last rows), "masked"
// (queries = every 1/select-th position, custom mask built on the device, its build included in
// the time), "decode" (one row, split-KV workspace).
Row bench_attention(const std::string& mode, int n_kv, double select, const AttnShape& s,
                    cudaStream_t stream, int warmup, int runs) {
    std::vector<int32_t> q_pos;
    std::vector<int32_t> k_pos(static_cast<size_t>(n_kv));
    for (int j = 0; j < n_kv; ++j) k_pos[size_t(j)] = j;
    if (mode == "causal") {
        q_pos = k_pos;
    } else if (mode == "decode") {
        q_pos = {n_kv - 1};
    } else {
        const int step = std::max(1, int(std::lround(1.0 / select)));
        for (int i = step - 1; i < n_kv; i += step) q_pos.push_back(i);
    }
    const int n_q = int(q_pos.size());
    const int D = s.head_dim;
    DevBuf q(size_t(n_q) * s.n_head * D * 2), k(size_t(n_kv) * s.n_head_kv * D * 2),
        v(size_t(n_kv) * s.n_head_kv * D * 2);
    fill_bf16(q, size_t(n_q) * s.n_head * D, 3);
    fill_bf16(k, size_t(n_kv) * s.n_head_kv * D, 4);
    fill_bf16(v, size_t(n_kv) * s.n_head_kv * D, 5);
    DevBuf out(size_t(n_q) * s.n_head * D * 4), lse(size_t(n_q) * s.n_head * 4);
    const size_t ws_bytes = flashinfer_workspace_bytes(n_q, n_kv, s.n_head, s.n_head_kv, D);
    DevBuf ws(ws_bytes);
    DevBuf mask(std::max<size_t>(1, attn_mask_bytes(n_q, n_kv)));
    DevBuf dqp(size_t(n_q) * 4), dkp(size_t(n_kv) * 4);
    CUDA_CHECK(cudaMemcpy(dqp.ptr, q_pos.data(), q_pos.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dkp.ptr, k_pos.data(), k_pos.size() * 4, cudaMemcpyHostToDevice));
    FlashAttnParams p;
    p.q = q.ptr;
    p.k = k.ptr;
    p.v = v.ptr;
    p.mask = static_cast<uint8_t*>(mask.ptr);
    p.n_q = n_q;
    p.n_kv = n_kv;
    p.n_head = s.n_head;
    p.n_head_kv = s.n_head_kv;
    p.head_dim = D;
    p.out = static_cast<float*>(out.ptr);
    p.lse = static_cast<float*>(lse.ptr);
    p.workspace = ws.ptr;
    p.workspace_bytes = ws_bytes;
    MaskSpec ms;
    ms.q_pos = static_cast<int32_t*>(dqp.ptr);
    ms.k_pos = static_cast<int32_t*>(dkp.ptr);
    ms.n_q = n_q;
    ms.n_kv = n_kv;
    // Visible (query, key) pairs: each costs 4*D flops per head (q.k and p.v, multiply-add).
    double pairs = 0;
    for (int i = 0; i < n_q; ++i) pairs += double(q_pos[size_t(i)]) + 1.0;
    Row r;
    r.op = "attention " + mode;
    r.shape = std::to_string(n_q) + "q x " + std::to_string(n_kv) + "kv, " +
              std::to_string(s.n_head) + "/" + std::to_string(s.n_head_kv) + " heads, d" +
              std::to_string(D);
    r.kernel = mode == "masked" ? "flashinfer custom mask" : "flashinfer causal";
    r.flop = 4.0 * D * s.n_head * pairs;
    r.ms = time_ms(
        [&] {
            if (mode == "masked") {
                launch_attn_mask_build(ms, static_cast<uint8_t*>(mask.ptr), stream);
                launch_flashinfer_masked(p, stream);
            } else {
                launch_flashinfer_prefill(p, stream);
            }
        },
        stream, warmup, runs);
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    int runs = 20, warmup = 3, tokens = 8192;
    int gm = 8192, gn = 4096, gk = 4096;
    double select = 0.15;
    AttnShape shape;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "error: %s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--runs") {
            runs = std::stoi(next());
        } else if (a == "--warmup") {
            warmup = std::stoi(next());
        } else if (a == "--tokens") {
            tokens = std::stoi(next());
        } else if (a == "--select") {
            select = std::stod(next());
        } else if (a == "--head-dim") {
            shape.head_dim = std::stoi(next());
        } else if (a == "--heads") {
            const std::string v = next();
            if (std::sscanf(v.c_str(), "%d/%d", &shape.n_head, &shape.n_head_kv) != 2) {
                std::fprintf(stderr, "error: --heads wants H/HKV, got '%s'\n", v.c_str());
                return 2;
            }
        } else if (a == "--gemm") {
            const std::string v = next();
            if (std::sscanf(v.c_str(), "%dx%dx%d", &gm, &gn, &gk) != 3) {
                std::fprintf(stderr, "error: --gemm wants MxNxK, got '%s'\n", v.c_str());
                return 2;
            }
        } else {
            std::fprintf(stderr,
                         "usage: bench_gpu_ops [--runs N] [--warmup N] [--gemm MxNxK] "
                         "[--tokens N] [--heads H/HKV] [--head-dim D] [--select F]\n");
            return 2;
        }
    }
    if (runs < 1 || warmup < 0 || tokens < 1 || select <= 0.0 || select > 1.0) {
        std::fprintf(stderr, "error: bad --runs/--warmup/--tokens/--select\n");
        return 2;
    }
    int n_dev = 0;
    const cudaError_t de = cudaGetDeviceCount(&n_dev);
    if (de != cudaSuccess || n_dev == 0) {
        std::printf("bench_gpu_ops: no CUDA device (%s): skipped\n",
                    de != cudaSuccess ? cudaGetErrorString(de) : "0 devices");
        return 77;
    }
    try {
        cudaDeviceProp prop{};
        CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        cudaStream_t stream;
        CUDA_CHECK(cudaStreamCreate(&stream));
        std::vector<Row> rows;
        rows.push_back(bench_gemm(gm, gn, gk, false, stream, warmup, runs));
        rows.push_back(bench_gemm(gm, gn, gk, true, stream, warmup, runs));
        rows.push_back(bench_attention("causal", tokens, select, shape, stream, warmup, runs));
        rows.push_back(bench_attention("masked", tokens, select, shape, stream, warmup, runs));
        rows.push_back(bench_attention("decode", tokens, select, shape, stream, warmup, runs));
        CUDA_CHECK(cudaStreamDestroy(stream));

        std::printf("\nGPU ops on %s (%d runs after %d warm-up; TFLOP/s at the median)\n",
                    prop.name, runs, warmup);
        std::printf("%-18s %-36s %-24s %10s %10s %10s %10s\n", "op", "shape", "kernel", "median ms",
                    "min ms", "max ms", "TFLOP/s");
        for (const Row& r : rows) {
            std::printf("%-18s %-36s %-24s %10.3f %10.3f %10.3f %10.1f\n", r.op.c_str(),
                        r.shape.c_str(), r.kernel.c_str(), r.ms.median, r.ms.min, r.ms.max,
                        r.flop / (r.ms.median * 1e-3) / 1e12);
        }
        for (const Row& r : rows) {
            std::printf(
                "{\"bench\":\"gpu_ops\",\"device\":\"%s\",\"op\":\"%s\",\"shape\":\"%s\","
                "\"kernel\":\"%s\",\"runs\":%d,\"warmup\":%d,\"median_ms\":%.4f,\"min_ms\":%.4f,"
                "\"max_ms\":%.4f,\"flop\":%.6g,\"tflops_median\":%.2f,\"tflops_max\":%.2f}\n",
                prop.name, r.op.c_str(), r.shape.c_str(), r.kernel.c_str(), runs, warmup,
                r.ms.median, r.ms.min, r.ms.max, r.flop, r.flop / (r.ms.median * 1e-3) / 1e12,
                r.flop / (r.ms.min * 1e-3) / 1e12);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
