// gemm_amx (gemm_amx.h): the tile kernel over AmxTileOps and its plain-loop reference. Plain C++:
// the tile instructions are reached through AmxTileOps, so this file needs no AMX flags.
//
// Tiles: C 0..3 (32 tokens x 32 weight rows of fp32 sums, 2 x 2 tiles), A 4..5 (16 tokens x 32
// bf16 columns each), B 6..7 (16 column pairs x 16 weight rows, VNNI pairs).
#include "kernels/cpu/gemm_amx.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/core/half.h"

namespace infoflow::cpu {
namespace {

constexpr int kPanelRows = 32;  // weight rows per panel (two B tiles)
constexpr int kTokRows = 32;    // tokens per block (two A tiles)
constexpr int kStep = 32;       // k columns per TDPBF16PS (64 bytes of bf16)

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

inline void epilogue(float* o, float s, const float* bias, int j, bool accumulate) {
    *o = (accumulate ? *o : 0.0f) + s + (bias ? bias[j] : 0.0f);
}

// Weight rows [j0, j0 + rows) as a panel in the VNNI pair layout: 32-bit word (c / 2) * 32 + r
// holds bf16(w[j0 + r, c]) (low half, c even) and bf16(w[j0 + r, c + 1]) (high half), zeros past
// k and past rows. Each fetched chunk is rounded pairwise into row-major words, which are then
// transposed into the panel (5x faster than writing the strided halves one by one).
void pack_panel(const GemmRows& w, int j0, int rows, int k, int kp, std::vector<float>& buf,
                std::vector<uint32_t>& words, uint32_t* panel) {
    const int n_pairs = kp / 2;
    words.assign(size_t(kPanelRows) * n_pairs, 0u);
    buf.resize(size_t(kPanelRows) * kGemmChunk);
    for (int c0 = 0; c0 < k; c0 += kGemmChunk) {  // c0 is even: chunks are 512 columns
        const int kc = std::min(kGemmChunk, k - c0);
        int64_t ld = 0;
        const float* src = w.fetch(j0, rows, c0, kc, buf.data(), &ld);
        for (int r = 0; r < rows; ++r) {
            const float* row = src + size_t(r) * ld;
            uint32_t* out = words.data() + size_t(r) * n_pairs + c0 / 2;
            fp32_to_bf16_pairs(row, kc / 2, out);
            if (kc % 2) out[kc / 2] = fp32_to_bf16(row[kc - 1]);  // odd k: the pair's high half 0
        }
    }
    for (int i0 = 0; i0 < n_pairs; i0 += 32) {  // 32 x 32 word blocks stay in L1
        const int i1 = std::min(n_pairs, i0 + 32);
        for (int r = 0; r < kPanelRows; ++r)
            for (int i = i0; i < i1; ++i)
                panel[size_t(i) * kPanelRows + r] = words[size_t(r) * n_pairs + i];
    }
}

// The thread's panels [p0, p1) over every token block of xb ([np, kp] bf16).
void run_panels(const AmxTileOps& t, const GemmRows& w, const uint16_t* xb, int n, int k, int kp,
                int m, int p0, int p1, const float* bias, float* out, bool accumulate) {
    std::vector<uint32_t> panel(size_t(kp / 2) * kPanelRows), words;
    std::vector<float> buf;
    alignas(64) float c[kTokRows * kPanelRows];  // the 2 x 2 accumulator tiles, [32 tok][32 rows]
    const int64_t a_stride = int64_t(kp) * 2, b_stride = 2 * kPanelRows * 2,
                  c_stride = 4 * kPanelRows;
    t.config(amx_full_tiles());
    for (int pi = p0; pi < p1; ++pi) {
        const int j0 = pi * kPanelRows, rows = std::min(kPanelRows, m - j0);
        pack_panel(w, j0, rows, k, kp, buf, words, panel.data());
        for (int t0 = 0; t0 < n; t0 += kTokRows) {
            for (int i = 0; i < 4; ++i) t.zero(i);
            const uint16_t* a0 = xb + size_t(t0) * kp;
            for (int c0 = 0; c0 < kp; c0 += kStep) {
                t.load(4, a0 + c0, a_stride);
                t.load(5, a0 + size_t(16) * kp + c0, a_stride);
                const uint32_t* b = panel.data() + size_t(c0 / 2) * kPanelRows;
                t.load(6, b, b_stride);
                t.load(7, b + 16, b_stride);
                t.dpbf16ps(0, 4, 6);
                t.dpbf16ps(1, 4, 7);
                t.dpbf16ps(2, 5, 6);
                t.dpbf16ps(3, 5, 7);
            }
            t.store(0, c, c_stride);
            t.store(1, c + 16, c_stride);
            t.store(2, c + 16 * kPanelRows, c_stride);
            t.store(3, c + 16 * kPanelRows + 16, c_stride);
            const int nt = std::min(kTokRows, n - t0);
            for (int i = 0; i < nt; ++i) {
                float* o = out + size_t(t0 + i) * m + j0;
                for (int r = 0; r < rows; ++r)
                    epilogue(o + r, c[i * kPanelRows + r], bias ? bias + j0 : nullptr, r,
                             accumulate);
            }
        }
    }
    t.release();
}

}  // namespace

void gemm_amx(const float* x, int n, int k, int m, const GemmRows& w, const float* bias, float* out,
              bool accumulate, int n_threads, const AmxTileOps& tiles) {
    if (n <= 0 || m <= 0) return;
    IF_CHECK(k > 0, "gemm_amx: k = " << k);
    const int kp = round_up(k, kStep), np = round_up(n, kTokRows);
    // x in bf16, [np, kp], zero-padded: padding rows and columns add exact zeros.
    static thread_local std::vector<uint16_t> xb;
    xb.assign(size_t(np) * kp, uint16_t(0));
    const int n_panels = (m + kPanelRows - 1) / kPanelRows;
    const int threads = std::max(1, std::min(n_threads, n_panels));
    uint16_t* xbp = xb.data();
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && n >= 64)
    for (int i = 0; i < n; ++i) fp32_to_bf16_rows(x + size_t(i) * k, k, xbp + size_t(i) * kp);
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        const int th = omp_get_thread_num(), nth = omp_get_num_threads();
        const int p0 = int(int64_t(n_panels) * th / nth),
                  p1 = int(int64_t(n_panels) * (th + 1) / nth);
        if (p0 < p1) run_panels(tiles, w, xbp, n, k, kp, m, p0, p1, bias, out, accumulate);
    }
}

void gemm_amx_ref(const float* x, int n, int k, int m, const float* w, const float* bias,
                  float* out, bool accumulate) {
    // The TDPBF16PS step of gemm_amx.h on one element: bf16 inputs (denormals as zero), an FMA
    // per product, denormal sums flushed to zero.
    auto bf = [](float v) {
        const uint16_t h = fp32_to_bf16(v);
        return (h & 0x7F80u) == 0 ? bf16_to_fp32(h & 0x8000u) : bf16_to_fp32(h);
    };
    auto ftz = [](float v) { return std::fabs(v) < 1.17549435e-38f ? std::copysign(0.0f, v) : v; };
    for (int t = 0; t < n; ++t) {
        for (int j = 0; j < m; ++j) {
            // Over the zero-padded columns too: 0 * 0 added to -0 gives +0, as on the tiles.
            float acc = 0.0f;
            for (int c = 0; c < round_up(k, kStep); ++c) {
                const float xv = c < k ? bf(x[size_t(t) * k + c]) : 0.0f;
                const float wv = c < k ? bf(w[size_t(j) * k + c]) : 0.0f;
                acc = ftz(std::fma(xv, wv, acc));
            }
            epilogue(out + size_t(t) * m + j, acc, bias, j, accumulate);
        }
    }
}

}  // namespace infoflow::cpu
