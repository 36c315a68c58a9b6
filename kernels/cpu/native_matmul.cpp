#include "kernels/cpu/native_matmul.h"

#include <omp.h>

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/cpu/gemm_amx.h"
#include "kernels/cpu/gemm_exact.h"
#include "kernels/cpu/quant_dot.h"
#include "runtime/core/error.h"

namespace infoflow::cpu {
namespace {

void check_matrix(const NativeMatrix& w) {
    IF_CHECK(native_type_supported(w.type) && w.data != nullptr && w.rows > 0 && w.cols > 0 &&
                 w.row_bytes == native_row_bytes(w.type, w.cols),
             "native weight matrix: bad type " << w.type << " or shape [" << w.rows << ", "
                                               << w.cols << "]");
    IF_CHECK(w.row_group == 1 || (w.row_group == kRowGroup && row_group_supported(w.type) &&
                                  w.rows % kRowGroup == 0),
             "native weight matrix: row groups of " << w.row_group << " for type " << w.type
                                                    << " and " << w.rows << " rows");
}

// Row j in fp32, from either layout; `plain` is scratch of row_bytes for a grouped matrix.
void dequantize_row_any(const QuantKernels& qk, const NativeMatrix& w, int j,
                        std::vector<uint8_t>& plain, float* out) {
    const uint8_t* row = w.data + size_t(j) * w.row_bytes;
    if (w.row_group > 1) {
        plain.resize(w.row_bytes);
        gather_grouped_row(w.type, w.data, j, w.cols, plain.data());
        row = plain.data();
    }
    qk.dequantize(w.type, row, out, w.cols);
}

// Tokens per block: each thread runs its weight rows over one block of tokens at a time, so the
// block's activations stay in L2 (32 tokens of k = 4096 quantized: 180 KB) while the rows pass.
constexpr int kTokenBlock = 32;

// Every token's activations quantized to Q8Block rows, [n, k / 32].
const Q8Block* quantize_rows(const QuantKernels& qk, const float* x, int n, int64_t k,
                             int n_threads) {
    static thread_local std::vector<Q8Block> xq;
    const int64_t nb = k / kQ8BlockElems;
    if (xq.size() < size_t(n) * nb) xq.resize(size_t(n) * nb);
    Q8Block* q = xq.data();
#pragma omp parallel for num_threads(n_threads) schedule(static) if (n_threads > 1 && n >= 64)
    for (int i = 0; i < n; ++i) qk.quantize_q8(x + i * k, q + i * nb, k);
    return q;
}

// out[i, j0 + r] = (out or 0) + v[i, r] + bias: the one epilogue of every path, so the same
// sums give the same bits.
inline void store_rows(const float* v /*[n, w]*/, int w, const float* bias, int n, int j0, int m,
                       float* out, bool accumulate) {
    for (int i = 0; i < n; ++i) {
        float* o = out + size_t(i) * m + j0;
        for (int r = 0; r < w; ++r)
            o[r] = (accumulate ? o[r] : 0.0f) + v[i * w + r] + (bias ? bias[j0 + r] : 0.0f);
    }
}

// The first and one-past-last of `count` items that thread `t` of `n_threads` takes.
inline std::pair<int, int> thread_range(int count, int t, int n_threads) {
    return {int(int64_t(count) * t / n_threads), int(int64_t(count) * (t + 1) / n_threads)};
}

// Decode steps, quantized weights: the activations quantized to Q8Block, stored-type dot
// products (row groups: four rows per kernel call). Each thread takes a contiguous range of rows
// (groups) and runs it over the tokens one block at a time.
void q8_path(const QuantKernels& qk, const float* x, const NativeMatrix& w, const float* bias,
             int n, float* out, bool accumulate, int n_threads) {
    const int64_t k = w.cols, nb = k / kQ8BlockElems;
    const int m = w.rows, unit = w.row_group > 1 ? kRowGroup : 1, n_units = m / unit;
    const Q8Block* xq = quantize_rows(qk, x, n, k, n_threads);
    // Enough rows per thread to be worth a thread (decode: a small matrix on one thread).
    const int threads = std::max(1, std::min(n_threads, (m + 63) / 64));
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        const auto [u0, u1] = thread_range(n_units, omp_get_thread_num(), omp_get_num_threads());
        float v[kTokenBlock * kRowGroup];
        for (int t0 = 0; t0 < n; t0 += kTokenBlock) {
            const int nt = std::min(kTokenBlock, n - t0);
            const Q8Block* xb = xq + size_t(t0) * nb;
            float* ob = out + size_t(t0) * m;
            for (int u = u0; u < u1; ++u) {
                const uint8_t* row = w.data + size_t(u) * unit * w.row_bytes;
                if (unit > 1) {
                    qk.dot_q8_group(w.type, row, xb, k, nt, v, kRowGroup);
                } else {
                    for (int i = 0; i < nt; ++i) v[i] = qk.dot_q8(w.type, row, xb + i * nb, k);
                }
                store_rows(v, unit, bias, nt, u * unit, m, ob, accumulate);
            }
        }
    }
}

// Decode steps, quantized weights with fp32 activations (NativePass::decode_fp32, the LM head):
// row groups widened in registers, plain rows dequantized to fp32 once per token block.
void f32_act_path(const QuantKernels& qk, const float* x, const NativeMatrix& w, const float* bias,
                  int n, float* out, bool accumulate, int n_threads) {
    const int64_t k = w.cols;
    const int m = w.rows, unit = w.row_group > 1 ? kRowGroup : 1, n_units = m / unit;
    const int threads = std::max(1, std::min(n_threads, (m + 63) / 64));
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        const auto [u0, u1] = thread_range(n_units, omp_get_thread_num(), omp_get_num_threads());
        float v[kTokenBlock * kRowGroup];
        std::vector<float> row32(unit > 1 ? 0 : size_t(k));
        std::vector<uint8_t> plain;
        for (int t0 = 0; t0 < n; t0 += kTokenBlock) {
            const int nt = std::min(kTokenBlock, n - t0);
            const float* xb = x + size_t(t0) * k;
            float* ob = out + size_t(t0) * m;
            for (int u = u0; u < u1; ++u) {
                if (unit > 1) {
                    qk.dot_f32_group(w.type, w.data + size_t(u) * unit * w.row_bytes, xb, k, k, nt,
                                     v, kRowGroup);
                } else {
                    dequantize_row_any(qk, w, u, plain, row32.data());
                    const uint8_t* r = reinterpret_cast<const uint8_t*>(row32.data());
                    for (int i = 0; i < nt; ++i) v[i] = qk.dot_f32(ggml_id::f32, r, xb + i * k, k);
                }
                store_rows(v, unit, bias, nt, u * unit, m, ob, accumulate);
            }
        }
    }
}

// Decode steps, F32, F16 and BF16 rows times fp32 activations: rows in runs of kFloatRows per
// kernel call, the rows widened in registers.
constexpr int kFloatRows = 16;

void float_dot_path(const QuantKernels& qk, const float* x, const NativeMatrix& w,
                    const float* bias, int n, float* out, bool accumulate, int n_threads) {
    const int64_t k = w.cols;
    const int m = w.rows, n_units = (m + kFloatRows - 1) / kFloatRows;
    const int threads = std::max(1, std::min(n_threads, (m + 63) / 64));
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        const auto [u0, u1] = thread_range(n_units, omp_get_thread_num(), omp_get_num_threads());
        float v[kTokenBlock * kFloatRows];
        for (int t0 = 0; t0 < n; t0 += kTokenBlock) {
            const int nt = std::min(kTokenBlock, n - t0);
            for (int u = u0; u < u1; ++u) {
                const int j0 = u * kFloatRows, rows = std::min(kFloatRows, m - j0);
                qk.dot_f32_rows(w.type, w.data + size_t(j0) * w.row_bytes, w.row_bytes, rows,
                                x + size_t(t0) * k, k, k, nt, v, rows);
                store_rows(v, rows, bias, nt, j0, m, out + size_t(t0) * m, accumulate);
            }
        }
    }
}

// The rows of a stored matrix in fp32 for gemm_exact: each chunk dequantized by the active path
// (row groups: the chunk's blocks gathered to the plain layout first).
class StoredRows : public GemmRows {
  public:
    StoredRows(const QuantKernels& qk, const NativeMatrix& w) : qk_(qk), w_(w) {}
    const float* fetch(int j0, int rows, int c0, int kc, float* buf, int64_t* ld) const override {
        if (w_.type == ggml_id::f32 && w_.row_group == 1) {  // in place
            *ld = w_.cols;
            return reinterpret_cast<const float*>(w_.data + size_t(j0) * w_.row_bytes) + c0;
        }
        const int be = native_block_elems(w_.type);
        const size_t bb = native_block_bytes(w_.type);
        IF_CHECK(c0 % be == 0 && kc % be == 0,
                 "gemm chunk [" << c0 << ", " << c0 + kc << ") cuts a " << be << "-element block");
        static thread_local std::vector<uint8_t> plain;
        for (int r = 0; r < rows; ++r) {
            const uint8_t* row = w_.data + size_t(j0 + r) * w_.row_bytes + size_t(c0 / be) * bb;
            if (w_.row_group > 1) {
                plain.resize(size_t(kc / be) * bb);
                gather_grouped_blocks(w_.type, w_.data, j0 + r, w_.cols, c0 / be, kc / be,
                                      plain.data());
                row = plain.data();
            }
            qk_.dequantize(w_.type, row, buf + size_t(r) * kc, kc);
        }
        *ld = kc;
        return buf;
    }

  private:
    const QuantKernels& qk_;
    const NativeMatrix& w_;
};

}  // namespace

void native_matmul(const float* x, const NativeMatrix& w, const float* bias, int n, float* out,
                   bool accumulate, int n_threads) {
    if (n <= 0) return;
    check_matrix(w);
    const QuantKernels& qk = quant_kernels();
    const int threads = std::max(1, n_threads);
    const bool quantized = native_type_quantized(w.type);
    switch (w.pass) {
        case NativePass::exact:
            // cpu.isa = amx: bf16 tiles (gemm_amx.h) for every call of the pass.
            if (active_cpu_isa() == CpuIsa::amx && amx_tiles_for_gemm())
                return gemm_amx(x, n, w.cols, w.rows, StoredRows(qk, w), bias, out, accumulate,
                                threads, amx_tiles());
            gemm_exact(x, n, w.cols, w.rows, StoredRows(qk, w), bias, out, accumulate, threads);
            return;
        case NativePass::decode:
            if (quantized) return q8_path(qk, x, w, bias, n, out, accumulate, threads);
            return float_dot_path(qk, x, w, bias, n, out, accumulate, threads);
        case NativePass::decode_fp32:
            if (quantized) return f32_act_path(qk, x, w, bias, n, out, accumulate, threads);
            return float_dot_path(qk, x, w, bias, n, out, accumulate, threads);
    }
}

NativeMatrix f32_matrix(const float* w, int rows, int cols, NativePass pass) {
    NativeMatrix nm;
    nm.type = ggml_id::f32;
    nm.rows = rows;
    nm.cols = cols;
    nm.row_bytes = size_t(cols) * sizeof(float);
    nm.data = reinterpret_cast<const uint8_t*>(w);
    nm.pass = pass;
    return nm;
}

void native_embed(const NativeMatrix& table, const int32_t* ids, int n, float* out) {
    check_matrix(table);
    const QuantKernels& qk = quant_kernels();
    std::vector<uint8_t> plain;
    for (int i = 0; i < n; ++i) {
        IF_CHECK(ids[i] >= 0 && ids[i] < table.rows,
                 "embed: token id " << ids[i] << " outside [0, " << table.rows << ")");
        dequantize_row_any(qk, table, ids[i], plain, out + size_t(i) * table.cols);
    }
}

}  // namespace infoflow::cpu
