#include "kernels/cpu/native_matmul.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "kernels/cpu/quant_dot.h"
#include "runtime/core/error.h"

namespace infoflow::cpu {
namespace {

// Weight rows per dequantized tile: as many as fit kTileBytes of fp32 scratch, within
// [kMinTileRows, kMaxTileRows]. Every sgemm call packs all of x again, a copy of n * k floats
// against 2 * n * rows * k flops, so short tiles pay for it: at 128 rows it was ~12 % of a
// 512-token prefill, at SmolLM2's whole matrices (576-1536 rows, <= 3.5 MB) ~3 %.
constexpr size_t kTileBytes = size_t(8) << 20;
constexpr int kMinTileRows = 128;
constexpr int kMaxTileRows = 2048;

int tile_rows_cap(int k) {
    const size_t fit = kTileBytes / (sizeof(float) * size_t(k));
    return int(std::clamp<size_t>(fit, kMinTileRows, kMaxTileRows)) / 16 * 16;
}

// Each thread's tile scratch, kept between calls (value-initializing a fresh multi-megabyte
// vector per call cost page faults and a memset on every matmul).
float* tile_scratch(size_t floats) {
    static thread_local std::unique_ptr<float[]> buf;
    static thread_local size_t cap = 0;
    if (cap < floats) {
        buf.reset(new float[floats]);
        cap = floats;
    }
    return buf.get();
}

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

// The dot path over row groups: each group's 4 rows at once, for every token.
void dot_path_grouped(const QuantKernels& qk, const float* x, const Q8Block* xq,
                      const NativeMatrix& w, const float* bias, int n, float* out, bool accumulate,
                      int threads) {
    const int64_t k = w.cols;
    const int64_t nb = k / kQ8BlockElems;
    const int m = w.rows, n_groups = m / kRowGroup;
    const size_t group_bytes = size_t(kRowGroup) * w.row_bytes;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int gi = 0; gi < n_groups; ++gi) {
        const uint8_t* g = w.data + size_t(gi) * group_bytes;
        const int j0 = gi * kRowGroup;
        for (int i = 0; i < n; ++i) {
            float v[kRowGroup];
            if (xq) {
                qk.dot_q8_group(w.type, g, xq + i * nb, k, v);
            } else {
                qk.dot_f32_group(w.type, g, x + i * k, k, v);
            }
            float* o = out + size_t(i) * m + j0;
            for (int r = 0; r < kRowGroup; ++r)
                o[r] = (accumulate ? o[r] : 0.0f) + v[r] + (bias ? bias[j0 + r] : 0.0f);
        }
    }
}

void dot_path(const float* x, const NativeMatrix& w, const float* bias, int n, float* out,
              bool accumulate, int n_threads) {
    const QuantKernels& qk = quant_kernels();
    const int64_t k = w.cols;
    const int m = w.rows;
    const bool quantized = native_type_quantized(w.type) && !w.fp32_activations;
    const bool row_to_fp32 = native_type_quantized(w.type) && w.fp32_activations;
    std::vector<Q8Block> xq;
    if (quantized) {
        const int64_t nb = k / kQ8BlockElems;
        xq.resize(size_t(n * nb));
        for (int i = 0; i < n; ++i) qk.quantize_q8(x + i * k, xq.data() + i * nb, k);
    }
    const int64_t nb = k / kQ8BlockElems;
    const int threads = std::max(1, std::min(n_threads, (m + 63) / 64));
    if (w.row_group > 1) {
        dot_path_grouped(qk, x, quantized ? xq.data() : nullptr, w, bias, n, out, accumulate,
                         threads);
        return;
    }
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        std::vector<float> row32(row_to_fp32 ? size_t(k) : 0);
#pragma omp for schedule(static)
        for (int j = 0; j < m; ++j) {
            const uint8_t* row = w.data + size_t(j) * w.row_bytes;
            if (row_to_fp32) {
                qk.dequantize(w.type, row, row32.data(), k);
                row = reinterpret_cast<const uint8_t*>(row32.data());
            }
            const uint32_t ftype = row_to_fp32 ? ggml_id::f32 : w.type;
            const float b = bias ? bias[j] : 0.0f;
            for (int i = 0; i < n; ++i) {
                const float v = quantized ? qk.dot_q8(w.type, row, xq.data() + i * nb, k)
                                          : qk.dot_f32(ftype, row, x + i * k, k);
                float& o = out[size_t(i) * m + j];
                o = (accumulate ? o : 0.0f) + v + b;
            }
        }
    }
}

void tile_path(const float* x, const NativeMatrix& w, const float* bias, int n, float* out,
               bool accumulate, int n_threads) {
    const QuantKernels& qk = quant_kernels();
    const int k = w.cols;
    const int m = w.rows;
    // Tiles of at most tile_rows_cap(k) rows (a multiple of 16), a whole number per thread.
    const int cap = tile_rows_cap(k);
    const int per = std::max(1, (m + cap * n_threads - 1) / (cap * n_threads));
    const int n_tiles_want = per * n_threads;
    const int tile = std::min(cap, ((m + n_tiles_want - 1) / n_tiles_want + 15) / 16 * 16);
    const int n_tiles = (m + tile - 1) / tile;
    const float beta = accumulate ? 1.0f : 0.0f;
#pragma omp parallel num_threads(std::min(n_threads, n_tiles))
    {
        float* scratch = tile_scratch(size_t(tile) * k);
        std::vector<uint8_t> plain;
#pragma omp for schedule(static)
        for (int t = 0; t < n_tiles; ++t) {
            const int m0 = t * tile;
            const int rows = std::min(tile, m - m0);
            for (int r = 0; r < rows; ++r)
                dequantize_row_any(qk, w, m0 + r, plain, scratch + size_t(r) * k);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, rows, k, 1.0f, x, k,
                        scratch, k, beta, out + m0, m);
            if (bias) {
                for (int i = 0; i < n; ++i) {
                    float* o = out + size_t(i) * m + m0;
                    for (int j = 0; j < rows; ++j) o[j] += bias[m0 + j];
                }
            }
        }
    }
}

}  // namespace

void native_matmul(const float* x, const NativeMatrix& w, const float* bias, int n, float* out,
                   bool accumulate, int n_threads) {
    if (n <= 0) return;
    check_matrix(w);
    if (n <= kNativeDotMaxTokens) {
        dot_path(x, w, bias, n, out, accumulate, std::max(1, n_threads));
    } else {
        tile_path(x, w, bias, n, out, accumulate, std::max(1, n_threads));
    }
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
